//! Guest /init: see [`hostile_guest::Mode::TamperInit`].

fn main() {
    hostile_guest::main(hostile_guest::Mode::TamperInit)
}
