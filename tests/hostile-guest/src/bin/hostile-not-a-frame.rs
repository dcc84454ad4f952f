//! Guest /init: see [`hostile_guest::Mode::NotAFrame`].

fn main() {
    hostile_guest::main(hostile_guest::Mode::NotAFrame)
}
