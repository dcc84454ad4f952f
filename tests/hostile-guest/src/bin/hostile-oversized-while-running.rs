//! Guest /init: see [`hostile_guest::Mode::OversizedWhileRunning`].

fn main() {
    hostile_guest::main(hostile_guest::Mode::OversizedWhileRunning)
}
