//! Who reads the subscribers' streams: one thread polling every plain socket, or a tokio task
//! per TLS or HTTP/2 subscriber; each delivery tallied into its subscriber's [`Tally`].

use std::io::{ErrorKind, Read as _};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use mio::{Events, Interest, Poll, Token};
use viewtape_tests::EventBody;

use crate::histogram::Histogram;
use crate::transport::{Subscription, Transport};

use super::{Shared, Tally};

/// How long a reader waits for data before it looks at [`Shared::stop`] again.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// The largest read from one socket; a shorter read emptied the socket's queue.
const READ_SIZE: usize = 64 * 1024;

/// The readers of a run's subscribers, until [`Readers::join`].
#[derive(Debug)]
pub enum Readers {
    /// One thread polling every plain socket.
    Poll(std::thread::JoinHandle<()>),
    /// A task per subscriber.
    Tasks(Vec<tokio::task::JoinHandle<()>>),
}

impl Readers {
    /// Starts reading `streams`, all of `transport`, subscriber `i` tallied by `tallies[i]`.
    ///
    /// # Errors
    /// When the poll cannot be set up.
    pub fn start(
        transport: Transport,
        streams: Vec<Subscription>,
        tallies: Vec<Tally>,
        shared: &Arc<Shared>,
    ) -> anyhow::Result<Self> {
        if transport == Transport::Plain {
            let sockets = streams
                .into_iter()
                .map(Subscription::into_plain)
                .collect::<anyhow::Result<_>>()?;
            let poll = PollReader::new(sockets, tallies)?;
            let shared = Arc::clone(shared);
            let thread = std::thread::Builder::new()
                .name("subscribers".into())
                .spawn(move || poll.run(&shared))
                .context("subscriber thread")?;
            return Ok(Self::Poll(thread));
        }
        let tasks = streams
            .into_iter()
            .zip(tallies)
            .map(|(stream, tally)| tokio::spawn(read_task(stream, tally, Arc::clone(shared))))
            .collect();
        Ok(Self::Tasks(tasks))
    }

    /// Waits for the readers, once [`Shared::stop`] is set.
    ///
    /// # Errors
    /// When a reader panicked.
    pub async fn join(self) -> anyhow::Result<()> {
        match self {
            Self::Poll(thread) => tokio::task::spawn_blocking(move || thread.join())
                .await
                .context("subscriber thread")?
                .map_err(|_| anyhow::anyhow!("the subscriber thread panicked")),
            Self::Tasks(tasks) => {
                for task in tasks {
                    task.await.context("subscriber task")?;
                }
                Ok(())
            }
        }
    }
}

/// One plain subscriber of the poll.
struct Polled {
    socket: mio::net::TcpStream,
    body: EventBody,
    tally: Tally,
}

/// Every plain subscriber, read by one thread.
struct PollReader {
    poll: Poll,
    subscribers: Vec<Polled>,
}

impl PollReader {
    fn new(
        sockets: Vec<(std::net::TcpStream, EventBody)>,
        tallies: Vec<Tally>,
    ) -> anyhow::Result<Self> {
        let poll = Poll::new().context("epoll")?;
        let mut subscribers = Vec::with_capacity(sockets.len());
        for (i, ((socket, body), tally)) in sockets.into_iter().zip(tallies).enumerate() {
            let mut socket = mio::net::TcpStream::from_std(socket);
            poll.registry()
                .register(&mut socket, Token(i), Interest::READABLE)
                .context("register a subscriber")?;
            subscribers.push(Polled {
                socket,
                body,
                tally,
            });
        }
        Ok(Self { poll, subscribers })
    }

    /// Reads until [`Shared::stop`], then hands every tally to `shared`.
    fn run(mut self, shared: &Shared) {
        let mut hist = Histogram::default();
        let mut events = Events::with_capacity(1024);
        let mut buf = vec![0u8; READ_SIZE];
        while !shared.stop.load(Ordering::Relaxed) {
            if let Err(e) = self.poll.poll(&mut events, Some(STOP_CHECK)) {
                if e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                for subscriber in &mut self.subscribers {
                    subscriber.tally.fail(shared, &format!("epoll: {e}"));
                }
                break;
            }
            for event in &events {
                if let Some(subscriber) = self.subscribers.get_mut(event.token().0) {
                    subscriber.read(&mut buf, event.is_read_closed(), shared, &mut hist);
                }
            }
        }
        if let Ok(mut all) = shared.histograms.lock() {
            all.merge(&hist);
        }
        for subscriber in self.subscribers {
            subscriber.tally.finish(shared);
        }
    }
}

impl Polled {
    /// Reads what the socket holds. Edge-triggered: until a read comes back short, which
    /// emptied the socket's queue; or, once the peer closed (`closed`), until the end.
    fn read(&mut self, buf: &mut [u8], closed: bool, shared: &Shared, hist: &mut Histogram) {
        while !self.tally.failed {
            let n = match self.socket.read(buf) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.tally.fail(shared, &format!("read: {e}"));
                    break;
                }
            };
            let mut now = 0;
            let tally = &mut self.tally;
            match self
                .body
                .push_with(&buf[..n], |event| tally.see(event, &mut now, shared, hist))
            {
                Ok(true) if n > 0 => {}
                Ok(_) => self.tally.fail(shared, "stream ended"),
                Err(e) => self.tally.fail(shared, &format!("{e:#}")),
            }
            if n < buf.len() && !closed {
                break;
            }
        }
        self.tally.store(shared);
    }
}

/// One subscriber over TLS or HTTP/2: reads until told to stop.
async fn read_task(mut stream: Subscription, mut tally: Tally, shared: Arc<Shared>) {
    let mut hist = Histogram::default();
    while !shared.stop.load(Ordering::Relaxed) && !tally.failed {
        let mut now = 0;
        let result = stream
            .read_with(STOP_CHECK, |event| {
                tally.see(event, &mut now, &shared, &mut hist);
            })
            .await;
        tally.store(&shared);
        match result {
            Ok(true) => {}
            Ok(false) => tally.fail(&shared, "stream ended"),
            // A read timeout just means nothing arrived: check `stop` and go on.
            Err(e) if e.to_string().contains(" within ") => {}
            Err(e) => tally.fail(&shared, &format!("{e:#}")),
        }
    }
    if let Ok(mut all) = shared.histograms.lock() {
        all.merge(&hist);
    }
    tally.finish(&shared);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subscribers::SeqCheck;

    use std::io::Write as _;
    use std::net::TcpListener;

    use tokio_util::either::Either;
    use viewtape_tests::EventStream;

    fn chunk(events: &str) -> String {
        format!("{:x}\r\n{events}\r\n", events.len())
    }

    fn update(seq: u64) -> String {
        format!("id: c{seq}\nevent: update\ndata: {{\"seq\":{seq}}}\n\n")
    }

    /// Three plain subscribers on one poll: one gets its events with a chunk split across
    /// writes, one misses a `seq`, one's server goes away inside the body. Each is tallied on
    /// its own, and every delivery with a send time has a latency.
    #[tokio::test]
    async fn one_thread_reads_every_plain_subscriber_and_tallies_each() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let mut sockets: Vec<_> = (0..3)
                .map(|_| {
                    let (mut socket, _) = listener.accept().unwrap();
                    let mut request = Vec::new();
                    let mut byte = [0];
                    while !request.ends_with(b"\r\n\r\n") {
                        socket.read_exact(&mut byte).unwrap();
                        request.push(byte[0]);
                    }
                    socket
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                              transfer-encoding: chunked\r\n\r\n",
                        )
                        .unwrap();
                    socket
                })
                .collect();
            // Until the reader took the sockets over (they are read by tokio before that).
            std::thread::sleep(Duration::from_millis(200));
            let whole = chunk(&(1..=3).map(update).collect::<String>());
            let (a, b) = whole.split_at(whole.len() / 2);
            sockets[0].write_all(a.as_bytes()).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            sockets[0].write_all(b.as_bytes()).unwrap();
            for seq in [1, 3] {
                sockets[1]
                    .write_all(chunk(&update(seq)).as_bytes())
                    .unwrap();
            }
            sockets[2].write_all(chunk(&update(1)).as_bytes()).unwrap();
            drop(sockets.pop());
            sockets
        });
        let mut streams = Vec::new();
        for _ in 0..3 {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let stream = EventStream::open(Either::Left(tcp), addr, "/sub", &[]).await;
            streams.push(Subscription::H1(stream.unwrap()));
        }
        let shared = Arc::new(Shared::new(3, 3));
        for seq in 1..=3 {
            shared.sent_at[seq].store(1, Ordering::Relaxed);
        }
        let tallies = (0..3)
            .map(|i| Tally::new(i, "update", SeqCheck::new(1, 1)))
            .collect();
        let readers = Readers::start(Transport::Plain, streams, tallies, &shared).unwrap();
        assert!(matches!(readers, Readers::Poll(_)), "{readers:?}");
        for _ in 0..1_000 {
            if shared.delivered() == 6 && shared.errors.lock().unwrap().len() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _open = server.join().unwrap();
        shared.stop.store(true, Ordering::Relaxed);
        readers.join().await.unwrap();

        let received: Vec<u64> = shared
            .received
            .iter()
            .map(|r| r.load(Ordering::Relaxed))
            .collect();
        assert_eq!(received, [3, 2, 1]);
        assert_eq!(shared.violations.load(Ordering::Relaxed), 1);
        assert_eq!(
            *shared.order_errors.lock().unwrap(),
            ["subscriber 1: seq 3 arrived, 2 was due"]
        );
        let errors = shared.errors.lock().unwrap();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("subscriber 2: connection closed inside the event stream body"),
            "{errors:?}"
        );
        assert_eq!(shared.histograms.lock().unwrap().samples(), 6);
    }
}
