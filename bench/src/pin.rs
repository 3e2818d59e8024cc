//! `--pin` (`durable`, `fanout`, `idle`): the server on one CPU, the bench on the other, so a
//! side-by-side run does not depend on how the scheduler shares the two cores. The spawned
//! viewtape runs under `taskset -c 0` (through a wrapper script given to the harness as
//! `VIEWTAPE_BIN`; `taskset` execs it, so the pid the harness sees is the server's), the bench
//! sets its own affinity to CPU 1 before its runtime starts and then defaults to `--threads 1`.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{anyhow, bail, ensure, Context as _};

use crate::cli::PinOptions;

/// The CPU the server is pinned to with `--pin`; the bench takes [`BENCH_CPU`].
const SERVER_CPU: usize = 0;
const BENCH_CPU: usize = 1;

/// `--pin`, before the client runtime exists (its threads inherit the affinity): pins this
/// process to CPU 1 and, unless viewtape is at `addr` (`--addr`), makes the harness spawn viewtape
/// under `taskset -c 0` through a wrapper script handed over as `VIEWTAPE_BIN`. Returns the
/// wrapper's directory, to keep until the end, or `None` without `--pin`.
///
/// # Errors
/// With fewer than 2 CPUs, without `taskset`, or when the viewtape binary is not there.
pub fn pin_before_runtime(
    options: &PinOptions,
    addr: Option<SocketAddr>,
) -> anyhow::Result<Option<tempfile::TempDir>> {
    if !options.pin {
        return Ok(None);
    }
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    ensure!(
        cpus > BENCH_CPU,
        "--pin needs 2 CPUs (server on {SERVER_CPU}, bench on {BENCH_CPU}); {cpus} available"
    );
    set_own_affinity(BENCH_CPU)?;
    let dir = tempfile::Builder::new()
        .prefix("viewtape-bench-pin-")
        .tempdir()
        .context("temp dir for the taskset wrapper")?;
    let status = std::process::Command::new("taskset")
        .arg("-V")
        .stdout(std::process::Stdio::null())
        .status()
        .context("taskset (Debian util-linux) is needed for --pin")?;
    ensure!(status.success(), "taskset -V failed: {status}");
    if addr.is_none() {
        let bin = viewtape_binary()?;
        let wrapper = dir.path().join("viewtape-pinned");
        let quoted = bin.display().to_string().replace('\'', r"'\''");
        std::fs::write(
            &wrapper,
            format!("#!/bin/sh\nexec taskset -c {SERVER_CPU} '{quoted}' \"$@\"\n"),
        )
        .with_context(|| format!("write {}", wrapper.display()))?;
        std::fs::set_permissions(
            &wrapper,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        // Still single-threaded: no runtime or other thread exists yet.
        std::env::set_var("VIEWTAPE_BIN", &wrapper);
        eprintln!(
            "--pin: bench on CPU {BENCH_CPU}, servers under taskset -c {SERVER_CPU} ({})",
            bin.display()
        );
    } else {
        eprintln!(
            "--pin: bench on CPU {BENCH_CPU}; the viewtape at --addr is not pinned by this tool"
        );
    }
    Ok(Some(dir))
}

/// `$VIEWTAPE_BIN`, or `viewtape` beside this executable (`target/release/viewtape`); not
/// rebuilt here (with `--pin` the harness gets the wrapper and does not build).
fn viewtape_binary() -> anyhow::Result<PathBuf> {
    let bin = match std::env::var_os("VIEWTAPE_BIN") {
        Some(path) => PathBuf::from(path),
        None => std::env::current_exe()
            .context("current_exe")?
            .parent()
            .ok_or_else(|| anyhow!("this executable has no directory"))?
            .join("viewtape"),
    };
    ensure!(
        bin.exists(),
        "no viewtape binary at {} (cargo build --release -p viewtape-server, or set VIEWTAPE_BIN)",
        bin.display()
    );
    Ok(bin)
}

fn set_own_affinity(cpu: usize) -> anyhow::Result<()> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (checked against the CPU count by the caller,
    // and 1 in practice); CPU_SET writes into `set` only.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 = the calling thread (here, the only one); `set` is a valid cpu_set_t.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if rc != 0 {
        bail!(
            "sched_setaffinity(CPU {cpu}): {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}
