//! Readers: each follows the tape's SSE stream and reconnects every few seconds (or when its
//! connection fails) to a random node, resuming with the cursor of the last event it got
//! (`Last-Event-ID`), as a browser's `EventSource` behind a load balancer does. It records
//! every frame it is served and every `reset`: a reader that kept its cursor must never be
//! reset, nor served a frame twice, nor skip one.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::nodes::VIEW;
use super::prng::Prng;
use crate::stream::EventStream;

/// How long a connect and its response head may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A session's length bounds, in milliseconds: then the reader moves to another node.
const SESSION_MS: (u64, u64) = (1_000, 6_000);

/// A `reset` a reader was sent.
#[derive(Debug, Clone)]
pub struct ResetSeen {
    /// The node that sent it.
    pub node: usize,
    /// When, since the run began.
    pub at: Duration,
    /// Its JSON data (`reason`, `epoch`, `first`, `next`).
    pub data: String,
    /// The cursor the reader resumed with.
    pub cursor: Option<String>,
}

/// What one reader saw.
#[derive(Debug, Clone, Default)]
pub struct ReaderLog {
    /// Its name.
    pub id: String,
    /// Every frame served with a cursor, in order: (id, data).
    pub frames: Vec<(String, String)>,
    /// Every reset.
    pub resets: Vec<ResetSeen>,
    /// Frames out of line under a held cursor: an offset that is not the last one plus one.
    pub breaks: Vec<String>,
    /// Sessions opened.
    pub sessions: u64,
    /// Sessions that failed to open (node down, not ready, refused).
    pub failed_opens: u64,
}

/// Runs reader `id` against `nodes` until `stop`.
pub async fn run(
    id: String,
    nodes: Vec<SocketAddr>,
    mut rng: Prng,
    started: Instant,
    mut stop: watch::Receiver<bool>,
) -> ReaderLog {
    let mut log = ReaderLog {
        id,
        ..ReaderLog::default()
    };
    // The cursor held across reconnects, and the offset it names.
    let mut cursor: Option<(String, u64)> = None;
    while !*stop.borrow() {
        let node = rng.index(nodes.len());
        let session = Duration::from_millis(rng.between(SESSION_MS.0, SESSION_MS.1));
        let held = cursor.as_ref().map(|(c, _)| c.clone());
        let opened = match &held {
            Some(c) => {
                open(
                    nodes[node],
                    &format!("/views/{VIEW}/events"),
                    &[("Last-Event-ID", c)],
                )
                .await
            }
            None => open(nodes[node], &format!("/views/{VIEW}/events?from=tape"), &[]).await,
        };
        let Some(mut stream) = opened else {
            log.failed_opens += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        log.sessions += 1;
        let deadline = tokio::time::Instant::now() + session;
        loop {
            let next = tokio::select! {
                next = stream.next_within(deadline.saturating_duration_since(tokio::time::Instant::now())) => next,
                _ = stop.changed() => break,
            };
            let Ok(Some(event)) = next else { break };
            match event.event.as_str() {
                "update" | "delete" => {
                    let Some(id) = event.id.clone() else {
                        log.breaks.push(format!("a frame without an id: {event:?}"));
                        continue;
                    };
                    let offset = crate::cursor_offset(&id).ok();
                    if let (Some((_, last)), Some(offset)) = (&cursor, offset) {
                        if offset != last + 1 {
                            log.breaks.push(format!(
                                "node {node} served offset {offset} after {last} ({})",
                                if offset <= *last {
                                    "a duplicate"
                                } else {
                                    "a skip"
                                }
                            ));
                        }
                    }
                    if let Some(offset) = offset {
                        cursor = Some((id.clone(), offset));
                    }
                    log.frames.push((id, event.data));
                }
                "reset" => {
                    log.resets.push(ResetSeen {
                        node,
                        at: started.elapsed(),
                        data: event.data.clone(),
                        cursor: held.clone(),
                    });
                    // The state follows; the reader goes on from its `synced`.
                    cursor = None;
                }
                "synced" => {
                    let id = event.id.clone().unwrap_or_default();
                    cursor = crate::cursor_offset(&id).ok().map(|o| (id, o));
                }
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.between(20, 200))).await;
    }
    log
}

/// Opens a stream, or `None` when the node does not answer `200` in time.
async fn open(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Option<EventStream> {
    tokio::time::timeout(CONNECT_TIMEOUT, EventStream::connect(addr, path, headers))
        .await
        .ok()?
        .ok()
}
