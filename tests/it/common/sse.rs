//! A plain Server-Sent Events reader for the tests: one HTTP/1.1 GET on a
//! socket, its chunked body decoded as it comes, and the event stream
//! parsed as the WHATWG HTML standard's "Server-sent events" section says
//! (`event:`, `id:`, `data:` lines; a blank line dispatches; data lines
//! joined with `\n`). Written here, not taken from a crate, so the tests
//! see the bytes driftless sends.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// `message` when the event named none.
    pub event: String,
    pub id: Option<String>,
    pub data: String,
}

/// An open stream, or the answer when it was not one.
pub enum Sse {
    Open(SseReader),
    Refused { status: u16, body: String },
}

impl Sse {
    /// The stream; panics with the refusal otherwise.
    pub fn open(self) -> SseReader {
        match self {
            Sse::Open(r) => r,
            Sse::Refused { status, body } => panic!("refused: {status} {body}"),
        }
    }
}

pub struct SseReader {
    conn: BufReader<TcpStream>,
    chunked: bool,
    /// Body bytes left in the current chunk.
    left: usize,
    /// Body bytes read but not yet a whole line.
    partial: Vec<u8>,
    over: bool,
}

/// `GET path` with `headers`, expecting `text/event-stream`.
pub fn sse_get(port: u16, path: &str, headers: &[(&str, &str)]) -> Sse {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let mut req =
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).expect("write");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let mut conn = BufReader::new(s);
    let mut line = String::new();
    conn.read_line(&mut line).expect("status line");
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        conn.read_line(&mut h).expect("header");
        if h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let has = |name: &str, part: &str| headers.iter().any(|(k, v)| k == name && v.contains(part));
    let chunked = has("transfer-encoding", "chunked");
    let mut reader = SseReader {
        conn,
        chunked,
        left: 0,
        partial: Vec::new(),
        over: false,
    };
    if status != 200 || !has("content-type", "text/event-stream") {
        let mut body = Vec::new();
        while let Some(b) = reader.body_bytes() {
            body.extend(b);
        }
        return Sse::Refused {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        };
    }
    Sse::Open(reader)
}

impl SseReader {
    /// The next body bytes; `None` at the end of the body.
    fn body_bytes(&mut self) -> Option<Vec<u8>> {
        if self.over {
            return None;
        }
        if self.chunked && self.left == 0 {
            let mut size = String::new();
            match self.conn.read_line(&mut size) {
                Ok(0) | Err(_) => {
                    self.over = true;
                    return None;
                }
                Ok(_) => {}
            }
            if size.trim().is_empty() {
                // The CRLF after the previous chunk's data.
                size.clear();
                if self.conn.read_line(&mut size).unwrap_or(0) == 0 {
                    self.over = true;
                    return None;
                }
            }
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 {
                self.over = true;
                return None;
            }
            self.left = n;
        }
        let mut buf = vec![
            0u8;
            if self.chunked {
                self.left.min(8192)
            } else {
                8192
            }
        ];
        match self.conn.read(&mut buf) {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                panic!("the stream sent nothing for 60 s")
            }
            Ok(0) | Err(_) => {
                self.over = true;
                None
            }
            Ok(n) => {
                buf.truncate(n);
                if self.chunked {
                    self.left -= n;
                }
                Some(buf)
            }
        }
    }

    /// The next line of the event stream, without its line ending.
    fn line(&mut self) -> Option<String> {
        loop {
            if let Some(i) = self.partial.iter().position(|b| *b == b'\n') {
                let rest = self.partial.split_off(i + 1);
                let mut l = std::mem::replace(&mut self.partial, rest);
                l.pop();
                if l.last() == Some(&b'\r') {
                    l.pop();
                }
                return Some(String::from_utf8_lossy(&l).into_owned());
            }
            let more = self.body_bytes()?;
            self.partial.extend(more);
        }
    }

    /// The next event (comments skipped); `None` when the server closed
    /// the stream. Panics after `within`.
    pub fn next_event(&mut self, within: Duration) -> Option<SseEvent> {
        let deadline = Instant::now() + within;
        let (mut event, mut id, mut data): (Option<String>, Option<String>, Vec<String>) =
            (None, None, Vec::new());
        loop {
            assert!(Instant::now() < deadline, "no event within {within:?}");
            let line = self.line()?;
            if line.is_empty() {
                if data.is_empty() && event.is_none() {
                    continue;
                }
                return Some(SseEvent {
                    event: event.unwrap_or_else(|| "message".into()),
                    id,
                    data: data.join("\n"),
                });
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((&line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value).to_string();
            match field {
                "event" => event = Some(value),
                "id" => id = Some(value),
                "data" => data.push(value),
                _ => {}
            }
        }
    }
}
