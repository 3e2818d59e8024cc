//! QuickJS needs a bigger shadow stack than Rust's 1 MiB default (see `MAX_STACK_BYTES`).
fn main() {
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32") {
        println!("cargo:rustc-link-arg-cdylib=-zstack-size=4194304");
    }
}
