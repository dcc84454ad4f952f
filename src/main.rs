//! agentvm: an OCI runtime, command-line compatible with runc, that runs each
//! container at the isolation tier its operator picks. The library holds
//! everything; this is its command-line entry.

fn main() -> std::process::ExitCode {
    // Booted as /init of a microVM: the guest agent (never returns).
    if std::process::id() == 1 {
        agentvm::guest::main();
    }
    agentvm::cli::main()
}
