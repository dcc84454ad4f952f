//! agentvm: an OCI runtime, command-line compatible with runc, that runs each
//! container at the isolation tier its operator picks. The library holds
//! everything; this is its command-line entry.

fn main() -> std::process::ExitCode {
    // A hook wrapped by the container tier (see container::hooks).
    let mut args = std::env::args_os();
    if args.nth(1).as_deref() == Some(agentvm::container::hooks::WRAPPER_ARG.as_ref()) {
        return agentvm::container::hooks::wrapper_main(args.collect());
    }
    // Booted as /init of a microVM: the guest agent (never returns).
    if std::process::id() == 1 {
        agentvm::guest::main();
    }
    agentvm::cli::main()
}
