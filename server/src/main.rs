//! The `viewtape` binary.
fn main() {}
