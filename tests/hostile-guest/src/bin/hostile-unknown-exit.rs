//! Guest /init: see [`hostile_guest::Mode::UnknownExit`].

fn main() {
    hostile_guest::main(hostile_guest::Mode::UnknownExit)
}
