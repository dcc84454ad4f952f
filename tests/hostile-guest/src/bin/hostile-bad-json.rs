//! Guest /init: see [`hostile_guest::Mode::BadJson`].

fn main() {
    hostile_guest::main(hostile_guest::Mode::BadJson)
}
