//! The wire format of HTTP/1.1 as the harness speaks it: a response's head and how its body is
//! framed, the chunked decoder, and the encoding of a request. No I/O here.

use std::net::SocketAddr;

use anyhow::{anyhow, bail, Context as _};

/// Response heads larger than this are refused (the server's are a few hundred bytes).
const MAX_HEAD: usize = 64 * 1024;

/// A status line and headers.
#[derive(Debug, Clone)]
pub struct Head {
    /// The status code.
    pub status: u16,
    /// Headers in order, names lowercased.
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// The first value of a header (case-insensitive name).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn framing(&self) -> anyhow::Result<Framing> {
        if let Some(te) = self.header("transfer-encoding") {
            if te
                .to_ascii_lowercase()
                .split(',')
                .any(|t| t.trim() == "chunked")
            {
                return Ok(Framing::Chunked(ChunkedDecoder::default()));
            }
        }
        match self.header("content-length") {
            Some(len) => Ok(Framing::Length(
                len.trim().parse().context("bad Content-Length")?,
            )),
            None => Ok(Framing::UntilClose),
        }
    }
}

/// A complete response.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status and headers.
    pub head: Head,
    /// The decoded body.
    pub body: Vec<u8>,
}

impl Response {
    /// The status code.
    pub fn status(&self) -> u16 {
        self.head.status
    }

    /// See [`Head::header`].
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.header(name)
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON.
    ///
    /// # Errors
    /// When it is not JSON.
    pub fn json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::from_slice(&self.body).with_context(|| {
            format!(
                "status {} body is not JSON: {:.300}",
                self.status(),
                self.text()
            )
        })
    }
}

/// How a response body ends.
#[derive(Debug)]
pub(crate) enum Framing {
    Length(u64),
    Chunked(ChunkedDecoder),
    UntilClose,
}

/// An incremental `Transfer-Encoding: chunked` decoder.
#[derive(Debug, Default)]
pub struct ChunkedDecoder {
    state: ChunkState,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Expecting a chunk-size line.
    #[default]
    Size,
    /// Inside chunk data, this many bytes left.
    Data(u64),
    /// Expecting the CRLF after chunk data.
    DataEnd,
    /// After the last (zero) chunk: trailer lines until an empty one.
    Trailer,
    /// The body is complete.
    Done,
}

impl ChunkedDecoder {
    /// Decodes from the front of `raw`, appending body bytes to `out` and removing what it
    /// consumed from `raw`; an incomplete size line or CRLF stays in `raw` for the next call.
    /// Returns whether the body is complete.
    ///
    /// # Errors
    /// On malformed framing.
    pub fn decode(&mut self, raw: &mut Vec<u8>, out: &mut Vec<u8>) -> anyhow::Result<bool> {
        let mut pos = 0;
        loop {
            match self.state {
                ChunkState::Done => break,
                ChunkState::Size | ChunkState::Trailer => {
                    let Some(nl) = raw[pos..].iter().position(|&b| b == b'\n') else {
                        if raw.len() - pos > 1024 {
                            bail!("chunk size line too long");
                        }
                        break;
                    };
                    let line = &raw[pos..pos + nl];
                    let line = line.strip_suffix(b"\r").unwrap_or(line);
                    pos += nl + 1;
                    if self.state == ChunkState::Trailer {
                        if line.is_empty() {
                            self.state = ChunkState::Done;
                        }
                        continue;
                    }
                    let text = std::str::from_utf8(line).context("chunk size is not text")?;
                    let hex = text.split(';').next().unwrap_or("").trim();
                    let size = u64::from_str_radix(hex, 16)
                        .with_context(|| format!("bad chunk size {text:?}"))?;
                    self.state = if size == 0 {
                        ChunkState::Trailer
                    } else {
                        ChunkState::Data(size)
                    };
                }
                ChunkState::Data(left) => {
                    let avail = (raw.len() - pos) as u64;
                    if avail == 0 {
                        break;
                    }
                    let take = left.min(avail) as usize;
                    out.extend_from_slice(&raw[pos..pos + take]);
                    pos += take;
                    let left = left - take as u64;
                    self.state = if left == 0 {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left)
                    };
                }
                ChunkState::DataEnd => {
                    let rest = &raw[pos..];
                    if rest.starts_with(b"\r\n") {
                        pos += 2;
                    } else if rest.starts_with(b"\n") {
                        pos += 1;
                    } else if rest.is_empty() || rest == b"\r" {
                        break;
                    } else {
                        bail!("missing CRLF after chunk data");
                    }
                    self.state = ChunkState::Size;
                }
            }
        }
        raw.drain(..pos);
        Ok(self.state == ChunkState::Done)
    }
}

/// Parses a response head from the front of `buf`. `Ok(None)` when it is not complete yet;
/// otherwise the head and its length in bytes.
///
/// # Errors
/// On a malformed status line or header, or a head over 64 KiB.
pub fn parse_head(buf: &[u8]) -> anyhow::Result<Option<(Head, usize)>> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        if buf.len() > MAX_HEAD {
            bail!("response head over {MAX_HEAD} bytes");
        }
        return Ok(None);
    };
    let text = std::str::from_utf8(&buf[..end]).context("response head is not UTF-8")?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        bail!("not an HTTP/1.x response: {status_line:?}");
    }
    let status = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad status line {status_line:?}"))?;
    let mut headers = Vec::new();
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| anyhow!("bad header line {line:?}"))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    Ok(Some((Head { status, headers }, end + 4)))
}

/// Encodes a request. `path` includes the query; `Host` and `Content-Length` are added.
pub fn encode_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    keep_alive: bool,
) -> Vec<u8> {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n");
    for (name, value) in headers {
        req.push_str(name);
        req.push_str(": ");
        req.push_str(value);
        req.push_str("\r\n");
    }
    if !body.is_empty() || method == "POST" || method == "PUT" {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    if !keep_alive {
        req.push_str("Connection: close\r\n");
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_head_and_leaves_body() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-A:  b \r\n\r\nbody";
        let (head, len) = parse_head(raw).unwrap().unwrap();
        assert_eq!(head.status, 200);
        assert_eq!(head.header("content-type"), Some("text/event-stream"));
        assert_eq!(head.header("X-A"), Some("b"));
        assert_eq!(&raw[len..], b"body");
        assert!(parse_head(b"HTTP/1.1 200 OK\r\n").unwrap().is_none());
        assert!(parse_head(b"SSH-2.0\r\n\r\n").is_err());
    }

    #[test]
    fn chunked_decoding_at_every_split() {
        let wire = b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        for cut in 0..=wire.len() {
            let mut d = ChunkedDecoder::default();
            let mut raw = wire[..cut].to_vec();
            let mut out = Vec::new();
            let mut done = d.decode(&mut raw, &mut out).unwrap();
            raw.extend_from_slice(&wire[cut..]);
            done |= d.decode(&mut raw, &mut out).unwrap();
            assert!(done, "cut {cut}");
            assert_eq!(out, b"hello, world", "cut {cut}");
            assert_eq!(raw, b"NEXT", "cut {cut}");
        }
    }

    #[test]
    fn chunked_rejects_garbage() {
        let mut d = ChunkedDecoder::default();
        assert!(d.decode(&mut b"zz\r\n".to_vec(), &mut Vec::new()).is_err());
        let mut d = ChunkedDecoder::default();
        assert!(d
            .decode(&mut b"1\r\nab\r\n".to_vec(), &mut Vec::new())
            .is_err());
    }

    #[test]
    fn request_encoding() {
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let req = encode_request(addr, "POST", "/x?y=1", &[("A", "b")], b"hi", false);
        assert_eq!(
            req,
            b"POST /x?y=1 HTTP/1.1\r\nHost: 127.0.0.1:9\r\nA: b\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"
        );
    }
}
