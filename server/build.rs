//! Builds the example and test guests (`examples/guests`, its own workspace) for
//! `wasm32-unknown-unknown`, in the style of wasmtime's `test-programs` artifacts, and exposes
//! each `.wasm` path as `VIEWTAPE_GUEST_<NAME>` for `include_bytes!` in `host::guests`.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-unknown-unknown";
const GUESTS: [&str; 3] = ["ticker", "logstats", "misbehave"];

fn main() {
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let repo = manifest_dir.parent().expect("server/ has a parent");
    let guests = repo.join("examples/guests");
    println!("cargo:rerun-if-changed={}", guests.display());
    println!(
        "cargo:rerun-if-changed={}",
        repo.join("runtime-guest").display()
    );

    check_wasm_target();

    // One target dir shared by every profile of the host build (debug, release, bench), so the
    // guests are built once: <target>/wasm-guests. OUT_DIR is <target>/[<triple>/]<profile>/build/<pkg>/out.
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let target_dir = out_dir
        .ancestors()
        .nth(4)
        .unwrap_or(&out_dir)
        .join("wasm-guests");

    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--release", "--target", TARGET, "--manifest-path"])
        .arg(guests.join("Cargo.toml"));
    // Whatever the host build was given (flags, clippy as a wrapper, coverage) is not for the guests.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO_LLVM_COV",
    ] {
        cmd.env_remove(var);
    }
    for (key, _) in env::vars_os() {
        if key.to_string_lossy().starts_with("CARGO_PROFILE_") {
            cmd.env_remove(key);
        }
    }
    cmd.env("CARGO_TARGET_DIR", &target_dir);
    let output = cmd
        .output()
        .expect("failed to run cargo to build the guests");
    if !output.status.success() {
        panic!(
            "building the guests in {} for {TARGET} failed:\n{}",
            guests.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    for guest in GUESTS {
        let wasm = target_dir
            .join(TARGET)
            .join("release")
            .join(format!("{guest}.wasm"));
        assert!(wasm.exists(), "guest build produced no {}", wasm.display());
        println!(
            "cargo:rustc-env=VIEWTAPE_GUEST_{}={}",
            guest.to_uppercase(),
            wasm.display()
        );
    }
}

/// Fails with the one command that fixes it when the wasm target is not installed.
fn check_wasm_target() {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let sysroot = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    if let Some(sysroot) = sysroot {
        let lib = Path::new(&sysroot).join("lib/rustlib").join(TARGET);
        if !lib.exists() {
            panic!(
                "\n\nThe viewtape guests are WebAssembly and need the `{TARGET}` target, which this \
                 toolchain lacks. Fix it with:\n\n    rustup target add {TARGET}\n\n"
            );
        }
    }
}
