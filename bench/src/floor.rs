//! `floor`: the least an SSE server can do per delivery, as a peer for `fanout`.
//!
//! It speaks nchan's wire protocol (`POST /pub/prices`, one message per request, answered with
//! nchan's `last_message_id`; an eventsource on `/sub/prices`), so `fanout --peer nchan
//! --peer-url URL` drives it unchanged, and it does nothing else: no buffer, no replay (a
//! `Last-Event-ID` is ignored), no storage, nothing read but the request line and
//! `Content-Length`. A publish is written as one HTTP/1.1 chunk to every subscriber's socket, one
//! blocking `write` each, before it is answered. What a run measures is the kernel's share of a
//! delivery on this machine with this load client: no server that makes a syscall per socket can
//! deliver sooner. With `--io-uring` the sends of a message go to the kernel in one submission
//! (io_uring), which takes the syscall per socket away too.
//!
//! ```text
//! taskset -c 0 viewtape-bench floor [--port 0] [--max-seconds 600] [--io-uring]
//! ```
//!
//! prints `FLOOR_URL=http://127.0.0.1:PORT FLOOR_PID=PID`, then serves until `--max-seconds`
//! have passed or it is killed. Loopback only.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};
use clap::Args;
use io_uring::{opcode, types, IoUring};

use crate::cli::u64_in;

/// Largest message body taken (a tick is well under it).
const MAX_BODY: usize = 64 * 1024;

/// Sends per io_uring submission.
const RING_ENTRIES: u32 = 1024;

/// What to run.
#[derive(Debug, Args)]
pub struct Options {
    /// The port on 127.0.0.1 (0: any free port)
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Seconds to serve before exiting (1..=3600)
    #[arg(long, default_value_t = 600, value_parser = u64_in(1..=3600))]
    max_seconds: u64,
    /// A message's sends go to the kernel in one io_uring submission
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", default_value_t = false,
          hide_default_value = true, hide_possible_values = true)]
    io_uring: bool,
}

/// Binds `127.0.0.1:--port`, prints the URL and PID, and serves until `--max-seconds` pass.
///
/// # Errors
/// If the port cannot be bound, or with `--io-uring` the ring cannot be made.
pub fn run(options: &Options) -> anyhow::Result<()> {
    let ring = match options.io_uring {
        true => Some(IoUring::new(RING_ENTRIES).context("io_uring")?),
        false => None,
    };
    let listener = TcpListener::bind(("127.0.0.1", options.port)).context("bind")?;
    let addr = listener.local_addr()?;
    println!("FLOOR_URL=http://{addr} FLOOR_PID={}", std::process::id());
    std::io::stdout().flush()?;
    let seconds = options.max_seconds;
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(seconds));
        eprintln!("floor: --max-seconds {seconds} passed, stopping");
        std::process::exit(0);
    });
    let floor: &'static Floor = Box::leak(Box::new(Floor::new(ring)));
    serve(&listener, floor)
}

/// The subscribers and the messages' ids.
struct Floor {
    /// nchan's ids are `<time>:<tag>`; the time is the start's, the tag counts messages.
    time: u64,
    state: Mutex<State>,
}

struct State {
    subscribers: Vec<TcpStream>,
    tag: u64,
    /// With `--io-uring`: the ring every send goes through.
    ring: Option<IoUring>,
}

impl Floor {
    fn new(ring: Option<IoUring>) -> Self {
        let time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self {
            time,
            state: Mutex::new(State {
                subscribers: Vec::new(),
                tag: 0,
                ring,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes `body` to every subscriber; returns its id. A subscriber that did not take the
    /// whole chunk is dropped.
    fn publish(&self, body: &str) -> String {
        let mut state = self.lock();
        let State {
            subscribers,
            tag,
            ring,
        } = &mut *state;
        *tag += 1;
        let id = format!("{}:{tag}", self.time);
        let event = format!("id: {id}\ndata: {body}\n\n");
        let chunk = format!("{:x}\r\n{event}\r\n", event.len());
        match ring {
            None => subscribers.retain(|mut socket| socket.write_all(chunk.as_bytes()).is_ok()),
            Some(ring) => {
                let mut sent = send_all(ring, subscribers, chunk.as_bytes()).into_iter();
                subscribers.retain(|_| sent.next().unwrap_or(false));
            }
        }
        id
    }

    fn subscribe(&self, socket: TcpStream) {
        self.lock().subscribers.push(socket);
    }
}

/// Sends `bytes` to every socket through `ring`, [`RING_ENTRIES`] sends per submission; whether
/// each socket took all of it.
fn send_all(ring: &mut IoUring, sockets: &[TcpStream], bytes: &[u8]) -> Vec<bool> {
    let mut sent = vec![false; sockets.len()];
    let Ok(len) = u32::try_from(bytes.len()) else {
        return sent;
    };
    for (first, batch) in sockets.chunks(RING_ENTRIES as usize).enumerate() {
        let first = first * RING_ENTRIES as usize;
        for (i, socket) in batch.iter().enumerate() {
            let send = opcode::Send::new(types::Fd(socket.as_raw_fd()), bytes.as_ptr(), len)
                .build()
                .user_data((first + i) as u64);
            // SAFETY: the send reads `bytes` and uses the socket's descriptor until it
            // completes, and both outlive it: every send of the batch is reaped below before
            // the next batch is pushed or this returns (or the process exits).
            if unsafe { ring.submission().push(&send) }.is_err() {
                // Cannot happen (a batch is at most the ring's size, and the ring is empty
                // between batches); the sends already queued must not outlive `bytes`.
                eprintln!("floor: io_uring submission queue full");
                std::process::exit(1);
            }
        }
        let mut reaped = 0;
        while reaped < batch.len() {
            match ring.submit_and_wait(batch.len() - reaped) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // Sends may still be reading `bytes`: returning would free it under them.
                    eprintln!("floor: io_uring: {e}");
                    std::process::exit(1);
                }
            }
            for done in ring.completion() {
                reaped += 1;
                if let Some(ok) = usize::try_from(done.user_data())
                    .ok()
                    .and_then(|i| sent.get_mut(i))
                {
                    *ok = u32::try_from(done.result()) == Ok(len);
                }
            }
        }
    }
    sent
}

/// Accepts connections for ever, a thread each until it is a subscriber.
fn serve(listener: &TcpListener, floor: &'static Floor) -> anyhow::Result<()> {
    for socket in listener.incoming() {
        let socket = socket.context("accept")?;
        std::thread::spawn(move || {
            if let Err(e) = connection(socket, floor) {
                eprintln!("floor: {e:#}");
            }
        });
    }
    Ok(())
}

/// Serves requests on one connection until it subscribes, closes or errs.
fn connection(socket: TcpStream, floor: &Floor) -> anyhow::Result<()> {
    socket.set_nodelay(true)?;
    let mut reader = BufReader::new(socket.try_clone()?);
    let mut out = socket;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut length = 0;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header)? == 0 {
                bail!("connection closed inside a request head");
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().context("Content-Length")?;
                }
            }
        }
        if length > MAX_BODY {
            bail!("a body of {length} bytes (at most {MAX_BODY})");
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        match line.split(' ').take(2).collect::<Vec<_>>()[..] {
            ["GET", "/sub/prices"] => {
                out.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
                      Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n",
                )?;
                floor.subscribe(out);
                return Ok(());
            }
            ["POST", "/pub/prices"] => {
                let body = String::from_utf8(body).context("a message that is not UTF-8")?;
                if body.contains(['\r', '\n']) {
                    bail!("a message of more than one line");
                }
                let info = format!("{{\"last_message_id\": \"{}\"}}", floor.publish(&body));
                write!(
                    out,
                    "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\n\r\n{info}",
                    info.len()
                )?;
            }
            _ => {
                out.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")?;
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_until(socket: &mut TcpStream, end: &str) -> String {
        let mut seen = Vec::new();
        let mut byte = [0];
        while !String::from_utf8_lossy(&seen).ends_with(end) {
            socket.read_exact(&mut byte).unwrap();
            seen.push(byte[0]);
        }
        String::from_utf8(seen).unwrap()
    }

    #[test]
    fn a_publish_reaches_every_subscriber_as_one_chunk_before_it_is_answered() {
        publish_and_follow(None);
    }

    #[test]
    fn through_io_uring_too() {
        // A kernel or sandbox may refuse io_uring (seccomp, `kernel.io_uring_disabled`); then
        // `floor --io-uring` refuses to start, and there is no ring to test.
        match IoUring::new(RING_ENTRIES) {
            Ok(ring) => publish_and_follow(Some(ring)),
            Err(e) => eprintln!("io_uring refused here ({e}): only the plain floor is tested"),
        }
    }

    fn publish_and_follow(ring: Option<IoUring>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let floor: &'static Floor = Box::leak(Box::new(Floor::new(ring)));
        std::thread::spawn(move || serve(&listener, floor));
        let mut subscribers: Vec<TcpStream> = (0..2)
            .map(|_| {
                let mut s = TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                s.write_all(b"GET /sub/prices HTTP/1.1\r\nLast-Event-ID: 1:1\r\n\r\n")
                    .unwrap();
                let head = read_until(&mut s, "\r\n\r\n");
                assert!(head.contains("text/event-stream"), "{head}");
                s
            })
            .collect();
        // The head is written just before the socket joins the list: wait (10 s at most).
        for _ in 0..2_000 {
            if floor.lock().subscribers.len() == 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(floor.lock().subscribers.len(), 2);
        let mut publisher = TcpStream::connect(addr).unwrap();
        publisher
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        for n in 1..=2 {
            let tick = format!("{{\"seq\":{n}}}");
            write!(
                publisher,
                "POST /pub/prices HTTP/1.1\r\nContent-Length: {}\r\n\r\n{tick}",
                tick.len()
            )
            .unwrap();
            let answer = read_until(&mut publisher, "\"}");
            let id = format!("{}:{n}", floor.time);
            assert!(
                answer.ends_with(&format!("{{\"last_message_id\": \"{id}\"}}")),
                "{answer}"
            );
            let event = format!("id: {id}\ndata: {tick}\n\n");
            for subscriber in &mut subscribers {
                let chunk = read_until(subscriber, "\n\n\r\n");
                assert_eq!(chunk, format!("{:x}\r\n{event}\r\n", event.len()));
            }
        }
        // A subscriber that left is dropped at the next publish; the others still get it.
        drop(subscribers.pop());
        for _ in 0..3 {
            floor.publish("{}");
        }
        assert_eq!(floor.lock().subscribers.len(), 1);
    }
}
