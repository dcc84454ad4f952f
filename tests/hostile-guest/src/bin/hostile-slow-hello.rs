//! Guest /init: see [`hostile_guest::Mode::SlowHello`].

fn main() {
    hostile_guest::main(hostile_guest::Mode::SlowHello)
}
