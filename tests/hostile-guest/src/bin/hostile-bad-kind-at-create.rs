//! Guest /init: see [`hostile_guest::Mode::BadKindAtCreate`].

fn main() {
    hostile_guest::main(hostile_guest::Mode::BadKindAtCreate)
}
