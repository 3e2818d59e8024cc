//! A client that applies what it receives — across random publishes,
//! deletes, disconnects (also in the middle of a state transfer), resets
//! by restore and gaps — always ends equal to the view's state at the
//! same cursor.

use std::collections::BTreeMap;

use futures_util::StreamExt;
use proptest::prelude::*;
use viewtape_journal::{EventJournal, JournalConfig, ViewOffset};

use super::*;
use crate::host::{EventKind, GuestBatch, GuestEvent};
use crate::runtime::BatchSink;

#[test]
fn stop_hints_spread_any_number_of_streams_evenly_over_the_window() {
    let window = Duration::from_secs(5);
    for streams in [10usize, 100, 1_000, 10_000] {
        let buckets = 10;
        let mut counts = vec![0usize; buckets];
        for n in 0..streams as u64 {
            let hint = spread_point(n, window);
            assert!(hint < window, "{hint:?}");
            counts[(hint.as_secs_f64() / window.as_secs_f64() * buckets as f64) as usize] += 1;
        }
        let even = streams / buckets;
        for count in counts {
            assert!(
                count.abs_diff(even) <= 1 + even / 10,
                "{streams} streams: {count} in a bucket, {even} even"
            );
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Publish(Vec<(u8, Option<u8>)>),
    Read(usize),
    Disconnect,
    Gap,
    Restore,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop::collection::vec((0..12u8, prop::option::weighted(0.8, 0..100u8)), 1..6).prop_map(Op::Publish),
        4 => (1..6usize).prop_map(Op::Read),
        2 => Just(Op::Disconnect),
        1 => Just(Op::Gap),
        1 => Just(Op::Restore),
    ]
}

/// The state a client builds, like the demo page does.
#[derive(Default)]
struct Client {
    state: BTreeMap<String, String>,
    incoming: Option<BTreeMap<String, String>>,
    last_id: String,
    resets: usize,
}

impl Client {
    fn apply(&mut self, chunk: &[u8]) {
        let text = std::str::from_utf8(chunk).unwrap();
        for block in text.split("\n\n").filter(|b| !b.is_empty()) {
            let (mut id, mut event, mut data) = (None, "message", String::new());
            for line in block.lines() {
                if line == "id" {
                    id = Some(String::new());
                } else if let Some(v) = line.strip_prefix("id: ") {
                    id = Some(v.to_owned());
                } else if let Some(v) = line.strip_prefix("event: ") {
                    event = v;
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            if let Some(id) = id {
                self.last_id = id;
            }
            let json: serde_json::Value = match data.as_str() {
                "" => serde_json::Value::Null,
                d => serde_json::from_str(d).unwrap(),
            };
            let key = json["key"].as_str().map(str::to_owned);
            match event {
                "update" => {
                    self.state.insert(key.unwrap(), json["value"].to_string());
                }
                "delete" => {
                    self.state.remove(&key.unwrap());
                }
                "reset" => {
                    self.resets += 1;
                    self.incoming = Some(BTreeMap::new());
                }
                "state" => {
                    self.incoming
                        .get_or_insert_with(BTreeMap::new)
                        .insert(key.unwrap(), json["value"].to_string());
                }
                "synced" => self.state = self.incoming.take().unwrap_or_default(),
                _ => {}
            }
        }
    }
}

fn connect(
    hub: &Arc<Hub>,
    client: &Client,
    narrow: &Narrow,
    shutdown: &watch::Receiver<bool>,
) -> futures_util::stream::BoxStream<'static, Result<Bytes, std::convert::Infallible>> {
    let start = match client.last_id.as_str() {
        "" => Start::State,
        id => id.parse().map_or(Start::Malformed, Start::Cursor),
    };
    let config = ServerConfig {
        heartbeat: Duration::from_secs(3600),
        retry: Duration::from_secs(1),
        ..ServerConfig::default()
    };
    let streams = Arc::new(Streams::new(
        Arc::clone(hub),
        Arc::new(Metrics::new(
            Arc::clone(hub),
            Arc::default(),
            &crate::log::LogMetrics::default(),
        )),
        &config,
        shutdown.clone(),
    ));
    streams
        .open(
            hub.hold("v").expect("the view exists"),
            start,
            narrow.clone(),
            None,
        )
        .unwrap()
        .into_stream()
        .boxed()
}

/// Reads every chunk that is ready without waiting for new events.
async fn read_ready(
    stream: &mut futures_util::stream::BoxStream<'static, Result<Bytes, std::convert::Infallible>>,
    client: &mut Client,
    max: usize,
) {
    for _ in 0..max {
        match tokio::time::timeout(Duration::from_millis(20), stream.next()).await {
            Ok(Some(Ok(chunk))) => client.apply(&chunk),
            _ => break,
        }
    }
}

/// A narrowed subscriber is woken only by its keys, yet never falls off a tape that rolls
/// over under the other keys' records: it gets its key's next update, not a reset.
#[tokio::test]
async fn a_narrowed_subscriber_sleeps_through_other_keys_and_the_tape_rolling_over() {
    let hub = Arc::new(Hub::new(Arc::new(EventJournal::new(JournalConfig {
        max_records_per_view: 40,
        ..JournalConfig::default()
    }))));
    hub.declare("v");
    let commit = |keys: Vec<String>| {
        let hub = Arc::clone(&hub);
        async move {
            let events = keys
                .into_iter()
                .map(|key| {
                    GuestEvent::new(
                        Arc::from("v"),
                        key,
                        EventKind::Update,
                        Bytes::from_static(b"1"),
                    )
                })
                .collect();
            let now = crate::log::unix_ms_now();
            hub.commit("test", GuestBatch::of_events(events), now).await;
        }
    };
    commit(vec!["A".into()]).await;
    let (_shutdown_tx, shutdown) = watch::channel(false);
    let mut client = Client::default();
    let narrow = Narrow::Keys(["A".to_owned()].into());
    let mut stream = connect(&hub, &client, &narrow, &shutdown);
    read_ready(&mut stream, &mut client, 10).await;
    assert_eq!(client.state.len(), 1);
    // 400 records of other keys, ten tapes' worth, one at a time: nothing for it to send
    // (polled after each, as its task would be run when woken).
    for i in 0..400 {
        commit(vec![format!("B{i}")]).await;
        let idle = tokio::time::timeout(Duration::from_millis(1), stream.next()).await;
        assert!(idle.is_err(), "woken with something to send: {idle:?}");
    }
    commit(vec!["A".into(), "C".into()]).await;
    read_ready(&mut stream, &mut client, 10).await;
    assert_eq!(client.resets, 0, "reset although it never fell behind");
    let window = hub.journal().window_now("v");
    assert_eq!(
        client.last_id,
        Cursor::new(window.epoch, window.next.prev().prev()).to_string()
    );
}

#[tokio::test]
async fn large_frames_go_out_shared_and_small_ones_coalesce_within_the_cap() {
    let hub = Arc::new(Hub::new(Arc::new(EventJournal::new(
        JournalConfig::default(),
    ))));
    hub.declare("v");
    let publish = |key: &str, size: usize| {
        let payload = Bytes::from(format!("\"{}\"", "x".repeat(size)));
        GuestEvent::new(Arc::from("v"), key.to_owned(), EventKind::Update, payload)
    };
    let events = vec![publish("a", 10), publish("big", 20_000), publish("c", 10)];
    hub.commit(
        "test",
        GuestBatch::of_events(events),
        crate::log::unix_ms_now(),
    )
    .await;
    let (_shutdown_tx, shutdown) = watch::channel(false);
    let mut stream = connect(&hub, &Client::default(), &Narrow::All, &shutdown);
    let big_state = hub.view("v").unwrap().entries();
    let big_state = &big_state.iter().find(|(k, _)| k == "big").unwrap().1;
    let mut chunks = Vec::new();
    while !chunks
        .iter()
        .any(|c: &Bytes| c.windows(13).any(|w| w == b"event: synced"))
    {
        chunks.push(stream.next().await.unwrap().unwrap());
    }
    // The big entry's data lines are the view state's own bytes, not a copy.
    let [_, data] = big_state.state_parts();
    assert!(chunks
        .iter()
        .any(|c| c.as_ptr() == data.as_ptr() && c.len() == data.len()));
    assert!(chunks
        .iter()
        .all(|c| c.len() <= MAX_CHUNK_BYTES || c.as_ptr() == data.as_ptr()));

    // Following: a big frame is the tape's frame itself; small ones stay within the cap.
    let mut events = vec![publish("big", 30_000)];
    events.extend((0..400).map(|i| publish(&format!("s{i}"), 100)));
    hub.commit(
        "test",
        GuestBatch::of_events(events),
        crate::log::unix_ms_now(),
    )
    .await;
    let window = hub.journal().window_now("v");
    let tape = hub
        .journal()
        .frames_after("v", &Cursor::new(window.epoch, ViewOffset::new(3)), 1)
        .unwrap();
    let mut live = Vec::new();
    let mut text = 0;
    while text < 400 {
        let chunk = stream.next().await.unwrap().unwrap();
        text += chunk.windows(13).filter(|w| *w == b"event: update").count();
        live.push(chunk);
    }
    assert_eq!(
        live[0].as_ptr(),
        tape[0].as_ptr(),
        "the big frame is shared"
    );
    assert!(live[1..].iter().all(|c| c.len() <= MAX_CHUNK_BYTES));
    assert!(
        live.len() > 2,
        "400 small frames of ~130 B do not fit one chunk"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Full or narrowed (keys, a prefix), through disconnections, gaps and restores.
    #[test]
    fn a_client_that_applies_the_stream_matches_the_state(
        ops in prop::collection::vec(op(), 1..40),
        narrow in prop_oneof![
            Just(Narrow::All),
            Just(Narrow::Keys(["k0".to_owned(), "k7".to_owned()].into())),
            Just(Narrow::Prefix("k1".to_owned())),
        ],
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        rt.block_on(async {
            let hub = Arc::new(Hub::new(Arc::new(EventJournal::new(JournalConfig::default()))));
            hub.declare("v");
            let (_shutdown_tx, shutdown) = watch::channel(false);
            let mut client = Client::default();
            let mut stream = connect(&hub, &client, &narrow, &shutdown);
            for op in ops {
                match op {
                    Op::Publish(events) => {
                        let events = events.into_iter().map(|(key, value)| GuestEvent::new(Arc::from("v"), format!("k{key}"), if value.is_some() { EventKind::Update } else { EventKind::Delete }, value.map(|v| Bytes::from(format!("{{\"v\":{v}}}"))).unwrap_or_default())).collect();
                        hub.commit("test", GuestBatch::of_events(events), crate::log::unix_ms_now())
        .await;
                    }
                    Op::Read(chunks) => read_ready(&mut stream, &mut client, chunks).await,
                    Op::Disconnect => {
                        client.incoming = None;
                        stream = connect(&hub, &client, &narrow, &shutdown);
                    }
                    Op::Gap => hub.journal().mark_gap().await,
                    Op::Restore => {
                        let dump = hub.journal().dump().await;
                        hub.restore(dump, false, hub.dump_states()).await;
                    }
                }
            }
            read_ready(&mut stream, &mut client, 10_000).await;
            let cut = hub.view("v").unwrap().cut(hub.journal(), &narrow);
            if narrow.is_all() {
                prop_assert_eq!(&client.last_id, &cut.cursor.to_string(), "the client reached the head");
            }
            let mut member = BytesMut::from(&b"{"[..]);
            for (i, frame) in cut.entries.iter().enumerate() {
                if i > 0 {
                    member.extend_from_slice(b",");
                }
                frame.put_json_member(&mut member);
            }
            member.extend_from_slice(b"}");
            let object: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&member).unwrap();
            let expected: BTreeMap<String, String> =
                object.into_iter().map(|(key, value)| (key, value.to_string())).collect();
            prop_assert_eq!(client.state, expected);
            Ok(())
        })?;
    }
}
