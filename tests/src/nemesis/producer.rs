//! Producers: each sends numbered batches through random nodes with its idempotent producer
//! stamp (`Producer-Id`, `Producer-Epoch`, `Producer-Seq`), and retries the same seq — on
//! another node — after a `503`, a timeout or a connection error, until one is acknowledged. The
//! server's deduplication is what makes that safe; the checker holds it to it.
//!
//! Each line of batch `seq` of producer `p` is `{"key": "p-seq-i", "value": {...}}`: every frame
//! on a tape names its batch, so a loss, a duplicate or a reordering is visible on the tape.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::nodes::RUNTIME;
use super::prng::Prng;

/// How long one attempt may take before it counts as refused (the server's `apply_timeout` is
/// 5 s; a publish may wait on NATS longer).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(15);
/// The pause before a retry, on another node.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// Most lines in a batch.
const MAX_LINES: u64 = 4;
/// How long a producer may keep retrying its last batch once told to stop.
pub const DRAIN: Duration = Duration::from_secs(90);

/// An acknowledged batch.
#[derive(Debug, Clone)]
pub struct Ack {
    /// Its `Producer-Seq`.
    pub seq: u64,
    /// Its lines (frames on the tape).
    pub lines: u64,
    /// The receipt's `position` (the stream sequence).
    pub position: Option<u64>,
    /// Whether the node answered it as a retry of a batch it had (`Producer-Duplicate`).
    pub duplicate: bool,
    /// The node that acknowledged it.
    pub node: usize,
    /// When, since the run began.
    pub at: Duration,
}

/// A span in which this producer's batch was refused: from the start of the first attempt that
/// failed to the acknowledgement that followed (`None`: never, within the run).
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The first failed attempt's start, since the run began.
    pub from: Duration,
    /// The next acknowledgement.
    pub to: Option<Duration>,
    /// When the first failed attempt's answer (or timeout) came: what the report attributes
    /// the window to a fault by, since an attempt may start just before the fault that fails it.
    pub failed_at: Duration,
    /// What the first failure was.
    pub first: String,
}

/// What one producer did.
#[derive(Debug, Clone, Default)]
pub struct ProducerLog {
    /// Its `Producer-Id`.
    pub id: String,
    /// Its acknowledged batches, in the order acknowledged.
    pub acks: Vec<Ack>,
    /// Its refusal windows.
    pub refusals: Vec<Refusal>,
    /// Answers that must not happen to a producer that retries only its latest seq (a `409`, a
    /// `403`, another `4xx`): each stops the producer.
    pub anomalies: Vec<String>,
    /// A batch sent but never acknowledged (stopped while retrying it): it may or may not be on
    /// the tape, once at most.
    pub unacked: Option<(u64, u64)>,
    /// Attempts in all.
    pub attempts: u64,
}

/// The NDJSON body of batch `seq` of producer `id`, `lines` lines.
pub fn body(id: &str, seq: u64, lines: u64) -> String {
    (0..lines)
        .map(|i| format!("{{\"key\":\"{id}-{seq}-{i}\",\"value\":{{\"p\":\"{id}\",\"s\":{seq},\"i\":{i}}}}}\n"))
        .collect()
}

/// What one attempt came to.
enum Outcome {
    Acked(Ack),
    /// Try again (a `5xx`, a timeout, a connection error).
    Refused(String),
    /// Stop: an answer no retry mends.
    Anomaly(String),
}

/// Runs producer `id` against `nodes` until `stop` says so, then drains its last batch.
pub async fn run(
    id: String,
    nodes: Vec<SocketAddr>,
    mut rng: Prng,
    started: Instant,
    stop: watch::Receiver<bool>,
) -> ProducerLog {
    let mut log = ProducerLog {
        id: id.clone(),
        ..ProducerLog::default()
    };
    let mut node = rng.index(nodes.len());
    for seq in 0.. {
        if *stop.borrow() {
            break;
        }
        let lines = rng.between(1, MAX_LINES);
        let body = body(&id, seq, lines);
        let mut stopped_at: Option<Instant> = None;
        loop {
            if stopped_at.is_none() && *stop.borrow() {
                stopped_at = Some(Instant::now());
            }
            if stopped_at.is_some_and(|t| t.elapsed() > DRAIN) {
                log.unacked = Some((seq, lines));
                return log;
            }
            let attempt_start = started.elapsed();
            log.attempts += 1;
            match attempt(&id, seq, lines, &body, node, nodes[node], started).await {
                Outcome::Acked(ack) => {
                    if let Some(open) = log.refusals.last_mut().filter(|r| r.to.is_none()) {
                        open.to = Some(ack.at);
                    }
                    log.acks.push(ack);
                    break;
                }
                Outcome::Refused(why) => {
                    if log.refusals.last().is_none_or(|r| r.to.is_some()) {
                        log.refusals.push(Refusal {
                            from: attempt_start,
                            to: None,
                            failed_at: started.elapsed(),
                            first: why,
                        });
                    }
                    // Another node next time, as a client library would.
                    node = (node + 1 + rng.index(nodes.len().saturating_sub(1))) % nodes.len();
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Outcome::Anomaly(why) => {
                    log.anomalies
                        .push(format!("seq {seq} on node {node}: {why}"));
                    log.unacked = Some((seq, lines));
                    return log;
                }
            }
        }
        // A steady trickle, not a flood: two cores run nine processes.
        tokio::time::sleep(Duration::from_millis(rng.between(5, 40))).await;
        node = rng.index(nodes.len());
    }
    log
}

async fn attempt(
    id: &str,
    seq: u64,
    lines: u64,
    body: &str,
    node: usize,
    addr: SocketAddr,
    started: Instant,
) -> Outcome {
    let seq_text = seq.to_string();
    let headers = [
        ("Producer-Id", id),
        ("Producer-Epoch", "0"),
        ("Producer-Seq", seq_text.as_str()),
    ];
    let path = format!("/runtimes/{RUNTIME}/ingest");
    let request = crate::http::request(addr, "POST", &path, &headers, body.as_bytes());
    let resp = match tokio::time::timeout(ATTEMPT_TIMEOUT, request).await {
        Err(_) => return Outcome::Refused(format!("no answer within {ATTEMPT_TIMEOUT:?}")),
        Ok(Err(e)) => return Outcome::Refused(format!("{e:#}")),
        Ok(Ok(resp)) => resp,
    };
    match resp.status() {
        200 => {
            let receipt = resp.json().unwrap_or_default();
            Outcome::Acked(Ack {
                seq,
                lines,
                position: receipt["position"].as_u64(),
                duplicate: resp.header("producer-duplicate") == Some("true"),
                node,
                at: started.elapsed(),
            })
        }
        status if status >= 500 => {
            let error = resp
                .json()
                .ok()
                .and_then(|e| e["error"].as_str().map(str::to_owned));
            Outcome::Refused(format!("{status} {}", error.unwrap_or_default()))
        }
        status => Outcome::Anomaly(format!("{status} {}", resp.text())),
    }
}

#[cfg(test)]
mod tests {
    use super::body;

    #[test]
    fn a_frame_names_its_batch() {
        assert_eq!(
            body("p1", 7, 2),
            "{\"key\":\"p1-7-0\",\"value\":{\"p\":\"p1\",\"s\":7,\"i\":0}}\n\
             {\"key\":\"p1-7-1\",\"value\":{\"p\":\"p1\",\"s\":7,\"i\":1}}\n"
        );
    }
}
