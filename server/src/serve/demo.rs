//! The embedded demo: a synthetic ticker feed into the `demo` runtime.
//!
//! A handful of symbols random-walk at `rate` ticks per second. The feed
//! continues the sequence numbers and prices it finds in the `prices` view,
//! so a restarted server carries on without reporting a gap.
//!
//! It is an idempotent producer ([`PRODUCER_ID`]), continuing the `seq` the
//! runtime last committed for it: a batch the runtime could not take (the log
//! failed, the runtime is unavailable) is sent again as it was, and can never
//! be published twice. When the runtime expects another producer seq than the
//! feed's (its state was restored from a snapshot, older or newer), the feed
//! takes it up and continues the ticks from what the view holds then.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::hub::Hub;
use crate::log::producer::{ProducerEpoch, ProducerSeq, ProducerStamp};
use crate::runtime::registry::Runtimes;
use crate::runtime::IngestError;

/// The `Producer-Id` of the demo feed.
pub const PRODUCER_ID: &str = "viewtape-demo-feed";

/// The runtime the feed feeds.
pub(super) const DEMO: &str = "demo";

const SYMBOLS: [(&str, f64); 5] = [
    ("ACME", 101.25),
    ("GLOBEX", 54.10),
    ("INITECH", 12.80),
    ("UMBRELLA", 230.00),
    ("HOOLI", 77.70),
];

/// Starts the feed into the runtime `demo`, and into what replaces it (a define record may);
/// abort the handle to stop it.
pub fn spawn_feed(runtimes: Arc<Runtimes>, hub: Arc<Hub>, rate: u32) -> JoinHandle<()> {
    let span = tracing::info_span!("demo_feed", rate);
    tokio::spawn(
        async move {
            let Some(mut runtime) = runtimes.get(DEMO).map(|registered| registered.handle) else {
                return;
            };
            let (mut seq, mut prices) = resume_point(&hub);
            // At most 100 batches a second; higher rates send several ticks per batch.
            let batches_per_second = rate.clamp(1, 100);
            let per_batch = rate.div_ceil(batches_per_second) as usize;
            let mut ticker = tokio::time::interval(Duration::from_secs(1) / batches_per_second);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut state = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut producer_seq = match runtime.save().await {
                Ok(saved) => saved
                    .producers
                    .next(PRODUCER_ID)
                    .map_or(ProducerSeq::FIRST, |(_, next)| next),
                Err(error) => {
                    tracing::debug!(%error, "runtime stopped; demo feed ends");
                    return;
                }
            };
            let mut unsent: Option<Bytes> = None;
            loop {
                ticker.tick().await;
                let stamp = ProducerStamp {
                    id: PRODUCER_ID.to_owned(),
                    epoch: ProducerEpoch::default(),
                    seq: producer_seq,
                    claim: false,
                };
                let batch = match unsent.take() {
                    Some(batch) => batch,
                    None => {
                        let mut lines = String::new();
                        for _ in 0..per_batch {
                            seq += 1;
                            // xorshift: a cheap, seedable random walk.
                            state ^= state << 13;
                            state ^= state >> 7;
                            state ^= state << 17;
                            let i = (state % SYMBOLS.len() as u64) as usize;
                            let step = ((state >> 8) % 201) as f64 / 100.0 - 1.0;
                            prices[i] = (prices[i] + step).max(1.0);
                            lines.push_str(&format!(
                                "{{\"symbol\":\"{}\",\"price\":{:.2},\"seq\":{seq}}}\n",
                                SYMBOLS[i].0, prices[i]
                            ));
                        }
                        Bytes::from(lines)
                    }
                };
                match runtime.ingest(batch.clone(), Some(stamp)).await {
                    Ok(_) => producer_seq = producer_seq.next(),
                    Err(error @ IngestError::Stopped { .. }) => {
                        match runtimes.successor(DEMO, &runtime) {
                            Some(next) => {
                                tracing::info!("runtime replaced; the demo feed goes on into it");
                                runtime = next;
                                unsent = Some(batch);
                            }
                            None => {
                                tracing::debug!(%error, "runtime stopped; demo feed ends");
                                return;
                            }
                        }
                    }
                    // The runtime's history moved under the feed (a restore took it back to
                    // a snapshot, or forward to a later one whose seqs the feed had used for
                    // other ticks): the next batch continues what the view holds now, so that
                    // the restore is the subscribers' only reset.
                    Err(
                        IngestError::OutOfOrder { expected, .. }
                        | IngestError::SeqReused { next: expected, .. }
                        | IngestError::SeqStale { next: expected, .. },
                    ) => {
                        tracing::info!(
                            %expected,
                            sent = %producer_seq,
                            "demo feed continues from the runtime's state"
                        );
                        producer_seq = expected;
                        (seq, prices) = resume_point(&hub);
                    }
                    // The guest's verdict does not change: drop the batch.
                    Err(error @ IngestError::Guest { .. }) => {
                        tracing::warn!(%error, "demo feed batch refused");
                    }
                    Err(error) => {
                        tracing::warn!(%error, "demo feed batch not taken; will retry");
                        unsent = Some(batch);
                    }
                }
            }
        }
        .instrument(span),
    )
}

/// What the feed needs back from a tick in the `prices` view.
#[derive(serde::Deserialize)]
struct Tick {
    price: f64,
    seq: u64,
}

/// The highest sequence number and the last price per symbol found in the
/// `prices` view.
fn resume_point(hub: &Hub) -> (u64, [f64; SYMBOLS.len()]) {
    let mut prices = SYMBOLS.map(|(_, price)| price);
    let mut seq = 0;
    let Some(view) = hub.view("prices") else {
        return (seq, prices);
    };
    for (symbol, frame) in view.entries() {
        let Some(tick) = frame
            .value_json()
            .and_then(|value| serde_json::from_slice::<Tick>(&value).ok())
        else {
            continue;
        };
        seq = seq.max(tick.seq);
        if let Some(i) = SYMBOLS.iter().position(|(s, _)| *s == symbol.as_str()) {
            prices[i] = tick.price;
        }
    }
    (seq, prices)
}
