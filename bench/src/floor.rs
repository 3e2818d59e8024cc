//! `floor`: the least an SSE server can do per delivery, as a peer for `fanout`.
//!
//! It speaks nchan's wire protocol (`POST /pub/prices`, one message per request, answered with
//! nchan's `last_message_id`; an eventsource on `/sub/prices`), so `fanout --peer nchan
//! --peer-url URL` drives it unchanged, and it does nothing else: no buffer, no replay (a
//! `Last-Event-ID` is ignored), no storage, nothing read but the request line and
//! `Content-Length`. A publish is written as one HTTP/1.1 chunk to every subscriber's socket, one
//! blocking `write` each, before it is answered. What a run measures is the kernel's share of a
//! delivery on this machine with this load client: no server can deliver sooner.
//!
//! ```text
//! taskset -c 0 viewtape-bench floor [--port 0] [--max-seconds 600]
//! ```
//!
//! prints `FLOOR_URL=http://127.0.0.1:PORT FLOOR_PID=PID`, then serves until `--max-seconds`
//! have passed or it is killed. Loopback only.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};

use crate::args::Args;

/// Largest message body taken (a tick is well under it).
const MAX_BODY: usize = 64 * 1024;

/// What to run.
#[derive(Debug)]
pub struct Options {
    port: u16,
    max_seconds: u64,
}

impl Options {
    /// `--port` (default 0: any free port), `--max-seconds` (1..=3600, default 600).
    ///
    /// # Errors
    /// On out-of-bounds values.
    pub fn from_args(args: &Args) -> anyhow::Result<Self> {
        Ok(Self {
            port: args.num("port", 0u16, 0, u16::MAX)?,
            max_seconds: args.num("max-seconds", 600u64, 1, 3600)?,
        })
    }
}

/// Binds `127.0.0.1:--port`, prints the URL and PID, and serves until `--max-seconds` pass.
///
/// # Errors
/// If the port cannot be bound.
pub fn run(options: &Options) -> anyhow::Result<()> {
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
    let floor: &'static Floor = Box::leak(Box::new(Floor::new()));
    serve(&listener, floor)
}

/// The subscribers' sockets and the id of the last message.
struct Floor {
    /// nchan's ids are `<time>:<tag>`; the time is the start's, the tag counts messages.
    time: u64,
    subscribers: Mutex<(Vec<TcpStream>, u64)>,
}

impl Floor {
    fn new() -> Self {
        let time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self {
            time,
            subscribers: Mutex::new((Vec::new(), 0)),
        }
    }

    /// Writes `body` to every subscriber; returns its id. A subscriber whose write fails is
    /// dropped.
    fn publish(&self, body: &str) -> String {
        let mut guard = self
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (subscribers, tag) = &mut *guard;
        *tag += 1;
        let id = format!("{}:{tag}", self.time);
        let event = format!("id: {id}\ndata: {body}\n\n");
        let chunk = format!("{:x}\r\n{event}\r\n", event.len());
        subscribers.retain(|mut socket| socket.write_all(chunk.as_bytes()).is_ok());
        id
    }

    fn subscribe(&self, socket: TcpStream) {
        self.subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .push(socket);
    }
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
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let floor: &'static Floor = Box::leak(Box::new(Floor::new()));
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
            if floor.subscribers.lock().unwrap().0.len() == 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(floor.subscribers.lock().unwrap().0.len(), 2);
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
        assert_eq!(floor.subscribers.lock().unwrap().0.len(), 1);
    }
}
