//! What the process holds while it serves: the data directory's lock and its signals.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::auth::Auth;
use crate::listener::tls::Tls;

/// Ignores SIGXFSZ, so that a write past the file size limit fails with EFBIG, which the log
/// handles, instead of killing the process.
pub(super) fn ignore_file_size_signal() {
    #[cfg(unix)]
    // SAFETY: installs the ignore disposition for one signal, before any thread of ours could
    // depend on it; no handler code runs. A write past RLIMIT_FSIZE then fails with EFBIG, which
    // the log handles, instead of killing the process.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

/// Takes `<data-dir>/viewtape.lock` for this process (an OS file lock, released when the
/// process ends, however it ends), so that two servers never share one data directory.
///
/// # Errors
/// The directory cannot be created, or another process holds the lock (named with its pid).
pub(super) fn lock_data_dir(dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    use std::io::{Read as _, Seek as _, Write as _};
    std::fs::create_dir_all(dir)
        .map_err(|error| anyhow::anyhow!("cannot create data dir {}: {error}", dir.display()))?;
    let path = dir.join("viewtape.lock");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|error| anyhow::anyhow!("cannot open {}: {error}", path.display()))?;
    if let Err(error) = file.try_lock() {
        let mut holder = String::new();
        let _ = file.read_to_string(&mut holder);
        let holder = holder.trim();
        let holder = if holder.is_empty() { "unknown" } else { holder };
        anyhow::bail!(
            "data dir {} is in use by another viewtape (pid {holder}): one server per data \
             directory ({error})",
            dir.display()
        );
    }
    file.set_len(0)?;
    file.rewind()?;
    writeln!(file, "{}", std::process::id())?;
    file.sync_all()?;
    Ok(file)
}

/// On every SIGHUP, reads the TLS certificate and key and the auth key file again. What cannot
/// be loaded is logged and the settings in use stay.
///
/// # Errors
/// The handler cannot be installed.
pub(super) fn reload_on_hangup(
    tls: Option<Arc<Tls>>,
    auth: Option<Arc<Auth>>,
) -> std::io::Result<JoinHandle<()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangups = signal(SignalKind::hangup())?;
        Ok(tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                if let Some(tls) = &tls {
                    match tls.reload() {
                        Ok(()) => tracing::info!("SIGHUP: TLS certificate and key reloaded"),
                        Err(error) => {
                            tracing::error!(%error, "SIGHUP: TLS certificate not reloaded; the one in use stays")
                        }
                    }
                }
                if let Some(auth) = &auth {
                    match auth.reload() {
                        Ok(keys) => tracing::info!(keys, "SIGHUP: auth keys reloaded"),
                        Err(error) => {
                            tracing::error!(%error, "SIGHUP: auth keys not reloaded; the ones in use stay")
                        }
                    }
                }
            }
        }))
    }
    #[cfg(not(unix))]
    {
        let _ = (tls, auth);
        Ok(tokio::spawn(async {}))
    }
}

/// Registers SIGINT and SIGTERM handlers now and counts the signals: the first asks for a
/// graceful stop, a second for not waiting on in-flight requests. Registering before the
/// server announces its address means a signal sent right after that line is never the default
/// (killing) action.
///
/// # Errors
/// The handlers cannot be installed.
pub(super) fn stop_signals() -> std::io::Result<watch::Receiver<u32>> {
    let (count, counted) = watch::channel(0u32);
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = terminate.recv() => {}
                }
                count.send_modify(|n| *n += 1);
            }
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        while tokio::signal::ctrl_c().await.is_ok() {
            count.send_modify(|n| *n += 1);
        }
    });
    Ok(counted)
}
