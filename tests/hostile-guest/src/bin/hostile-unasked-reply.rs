//! Guest /init: see [`hostile_guest::Mode::UnaskedReply`].

fn main() {
    hostile_guest::main(hostile_guest::Mode::UnaskedReply)
}
