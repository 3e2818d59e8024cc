//! An SSE subscription: one HTTP/1.1 connection (TCP, or any byte stream the caller opened,
//! e.g. TLS), its HTTP head, and the event stream in its body.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::http::{self, Framing, Head, READ_TIMEOUT};
use crate::sse::{SseEvent, SseEventRef, SseParser};

/// An open `GET …/events` stream with a 200 status.
#[derive(Debug)]
pub struct EventStream<S = TcpStream> {
    stream: S,
    head: Head,
    body: EventBody,
}

/// The body of an event stream as bytes arrive: the response framing decoded, then the events
/// parsed. [`EventStream`] reads into it; a caller that reads the socket itself (one thread
/// polling many) takes it with [`EventStream::into_parts`] and hands it what it read.
#[derive(Debug)]
pub struct EventBody {
    framing: Framing,
    /// Raw bytes read but not yet decoded (chunk framing).
    raw: Vec<u8>,
    /// Decoded body bytes awaiting the SSE parser.
    decoded: Vec<u8>,
    parser: SseParser,
    eof: bool,
}

impl EventStream {
    /// Opens `path` (e.g. `/views/prices/events?cursor=…`) with extra request headers
    /// (e.g. `("Last-Event-ID", …)`).
    ///
    /// # Errors
    /// On connection or timeout errors, and when the status is not 200 (the error carries
    /// the status and the start of the body).
    pub async fn connect(
        addr: SocketAddr,
        path: &str,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        Self::open(http::connect(addr).await?, addr, path, headers).await
    }

    /// Like [`EventStream::connect`], with a small kernel receive buffer: a client that then
    /// stops reading makes the server's writes to it block almost at once.
    ///
    /// # Errors
    /// See [`EventStream::connect`].
    pub async fn connect_with_recv_buffer(
        addr: SocketAddr,
        path: &str,
        headers: &[(&str, &str)],
        recv_buffer: u32,
    ) -> anyhow::Result<Self> {
        let stream = http::connect_with_recv_buffer(addr, recv_buffer).await?;
        Self::open(stream, addr, path, headers).await
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> EventStream<S> {
    /// Like [`EventStream::connect`], over `stream`, already connected to `addr` (its `Host`).
    ///
    /// # Errors
    /// See [`EventStream::connect`].
    pub async fn open(
        mut stream: S,
        addr: SocketAddr,
        path: &str,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let mut all_headers = vec![("Accept", "text/event-stream")];
        all_headers.extend_from_slice(headers);
        let req = http::encode_request(addr, "GET", path, &all_headers, b"", true);
        tokio::time::timeout(READ_TIMEOUT, stream.write_all(&req))
            .await
            .context("write timed out")?
            .context("write request")?;
        let mut raw = Vec::new();
        let head = http::read_head(&mut stream, &mut raw).await?;
        if head.status != 200 {
            let mut tail = raw;
            let _ = http::read_some(&mut stream, &mut tail, Duration::from_millis(200)).await;
            bail!(
                "GET {path}: status {} (expected 200): {:.300}",
                head.status,
                String::from_utf8_lossy(&tail)
            );
        }
        let framing = head.framing()?;
        Ok(Self {
            stream,
            head,
            body: EventBody {
                framing,
                raw,
                decoded: Vec::new(),
                parser: SseParser::new(),
                eof: false,
            },
        })
    }

    /// The connection and the body decoder, for a caller that reads the connection itself
    /// (bytes already read past the head stay in the decoder).
    pub fn into_parts(self) -> (S, EventBody) {
        (self.stream, self.body)
    }

    /// The response head.
    pub fn head(&self) -> &Head {
        &self.head
    }

    /// See [`Head::header`].
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.header(name)
    }

    /// The sticky last event ID, what a reconnecting browser would send.
    pub fn last_event_id(&self) -> Option<&str> {
        self.body.parser.last_event_id()
    }

    /// The last `retry:` hint.
    pub fn retry(&self) -> Option<u64> {
        self.body.parser.retry()
    }

    /// Heartbeat comments seen.
    pub fn comments(&self) -> u64 {
        self.body.parser.comments()
    }

    /// Whether the server ended the body (or closed the connection).
    pub fn is_closed(&self) -> bool {
        self.body.eof
    }

    /// The next event, waiting at most `timeout`; `Ok(None)` when the stream ended cleanly.
    ///
    /// # Errors
    /// On a timeout, I/O or framing error.
    pub async fn next_within(&mut self, timeout: Duration) -> anyhow::Result<Option<SseEvent>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(event) = self.body.parser.pop() {
                return Ok(Some(event));
            }
            if self.body.eof {
                return Ok(None);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("no SSE event within {timeout:?}");
            }
            self.read_into_parser(left).await?;
            self.body.parse();
        }
    }

    /// The next event within [`READ_TIMEOUT`].
    ///
    /// # Errors
    /// On timeout, I/O or framing errors, and when the stream ended.
    pub async fn next_event(&mut self) -> anyhow::Result<SseEvent> {
        match self.next_within(READ_TIMEOUT).await? {
            Some(event) => Ok(event),
            None => bail!("the event stream ended"),
        }
    }

    /// The next event that is not of the given kinds (e.g. skip nothing: `&[]`).
    ///
    /// # Errors
    /// See [`EventStream::next_event`].
    pub async fn next_except(&mut self, skip: &[&str]) -> anyhow::Result<SseEvent> {
        for _ in 0..1_000_000 {
            let event = self.next_event().await?;
            if !skip.contains(&event.event.as_str()) {
                return Ok(event);
            }
        }
        bail!("more than a million skipped events")
    }

    /// Collects events until one satisfies `stop` (included), at most `max` events and
    /// [`READ_TIMEOUT`] per read.
    ///
    /// # Errors
    /// On timeout, end of stream, or more than `max` events.
    pub async fn collect_until(
        &mut self,
        max: usize,
        mut stop: impl FnMut(&SseEvent) -> bool,
    ) -> anyhow::Result<Vec<SseEvent>> {
        let mut out = Vec::new();
        while out.len() < max {
            let event = self.next_event().await?;
            let done = stop(&event);
            out.push(event);
            if done {
                return Ok(out);
            }
        }
        bail!(
            "no stopping event among {max} events: last {:?}",
            out.last()
        )
    }

    /// Reads a state transfer: `state` events until `synced`. Returns the states and the
    /// synced event (whose `id` is the cursor the state reflects).
    ///
    /// # Errors
    /// On any other event kind before `synced`, more than `max_states` states, or timeouts.
    pub async fn until_synced(
        &mut self,
        max_states: usize,
    ) -> anyhow::Result<(Vec<SseEvent>, SseEvent)> {
        let mut states = Vec::new();
        loop {
            let event = self.next_event().await?;
            match event.event.as_str() {
                "state" if states.len() < max_states => states.push(event),
                "synced" => return Ok((states, event)),
                _ => bail!(
                    "expected state or synced after {} states, got {event:?}",
                    states.len()
                ),
            }
        }
    }

    /// Expects no event for `quiet` (heartbeat comments are fine).
    ///
    /// # Errors
    /// When an event arrives, or on I/O errors.
    pub async fn expect_silence(&mut self, quiet: Duration) -> anyhow::Result<()> {
        match self.next_within(quiet).await {
            Ok(Some(event)) => bail!("expected silence, got {event:?}"),
            Ok(None) => bail!("expected silence, the stream ended"),
            Err(_) => Ok(()),
        }
    }

    /// One read (at most `timeout`), handing every event it completes to `on_event` without
    /// allocating per event. Returns `false` once the stream ended. Do not mix with
    /// [`EventStream::next_within`] on the same stream.
    ///
    /// # Errors
    /// On timeout, I/O or framing errors.
    pub async fn read_with(
        &mut self,
        timeout: Duration,
        on_event: impl FnMut(SseEventRef<'_>),
    ) -> anyhow::Result<bool> {
        if self.body.eof {
            return Ok(false);
        }
        self.read_into_parser(timeout).await?;
        self.body.parse_with(on_event);
        Ok(!self.body.eof)
    }

    /// Decodes buffered bytes, reading once (at most `timeout`) when they yield nothing.
    async fn read_into_parser(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let body = &mut self.body;
        if !body.raw.is_empty() {
            body.decode()?;
            if !body.decoded.is_empty() || body.eof {
                return Ok(());
            }
        }
        match http::read_some(&mut self.stream, &mut body.raw, timeout).await? {
            0 => body.closed(),
            _ => body.decode(),
        }
    }
}

impl EventBody {
    /// Takes what one read of the connection gave (nothing: the connection closed), handing
    /// every event it completes to `on_event`. Returns `false` once the body ended.
    ///
    /// # Errors
    /// On framing errors, and when the connection closed inside the body.
    pub fn push_with(
        &mut self,
        read: &[u8],
        on_event: impl FnMut(SseEventRef<'_>),
    ) -> anyhow::Result<bool> {
        if read.is_empty() {
            self.closed()?;
        } else {
            self.raw.extend_from_slice(read);
            self.decode()?;
        }
        self.parse_with(on_event);
        Ok(!self.eof)
    }

    /// The connection closed: the end of a body that runs until then, an error otherwise.
    fn closed(&mut self) -> anyhow::Result<()> {
        match self.framing {
            Framing::UntilClose => {
                self.eof = true;
                Ok(())
            }
            _ => bail!("connection closed inside the event stream body"),
        }
    }

    fn decode(&mut self) -> anyhow::Result<()> {
        match &mut self.framing {
            Framing::Chunked(decoder) => {
                if decoder.decode(&mut self.raw, &mut self.decoded)? {
                    self.eof = true;
                }
            }
            Framing::Length(left) => {
                let take = (*left).min(self.raw.len() as u64) as usize;
                self.decoded.extend(self.raw.drain(..take));
                *left -= take as u64;
                if *left == 0 {
                    self.eof = true;
                }
            }
            Framing::UntilClose => self.decoded.append(&mut self.raw),
        }
        Ok(())
    }

    /// Parses the decoded bytes, handing each event to `on_event`.
    fn parse_with(&mut self, on_event: impl FnMut(SseEventRef<'_>)) {
        self.parser.feed_with(&self.decoded, on_event);
        self.decoded.clear();
    }

    /// Parses the decoded bytes, queueing the events in the parser.
    fn parse(&mut self) {
        self.parser.feed(&self.decoded);
        self.decoded.clear();
    }
}
