//! The HTTP server's limits: a connection that does not send its headers in
//! time is closed, and connections beyond the cap wait instead of being
//! served half-way.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::*;

fn intake(extra: &str) -> (Intake, Setup) {
    let s = Setup::new("");
    let text = std::fs::read_to_string(&s.config).expect("config");
    std::fs::write(
        &s.config,
        text.replacen("workers = 4\n", &format!("workers = 4\n{extra}"), 1),
    )
    .expect("config");
    (Intake::start(&s), s)
}

#[test]
fn slow_headers_are_cut_off() {
    let (intake, _s) = intake("header_read_timeout = \"1s\"\n");
    let mut c = TcpStream::connect(("127.0.0.1", intake.port)).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .expect("partial headers");
    let started = Instant::now();
    let mut buf = Vec::new();
    let _ = c.read_to_end(&mut buf); // the server closes the connection
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "connection held for {took:?}"
    );
    let text = String::from_utf8_lossy(&buf);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 408"),
        "{text}"
    );
    // A well-behaved client is still served.
    assert_eq!(http_get(intake.port, "/healthz").map(|r| r.0), Some(200));
}

#[test]
fn connections_beyond_the_cap_wait_for_a_free_slot() {
    let (intake, _s) = intake("max_connections = 2\nheader_read_timeout = \"2s\"\n");
    // Two idle connections take both slots.
    let idle: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(("127.0.0.1", intake.port)).expect("connect"))
        .collect();
    // No pause needed: the server takes a slot before it accepts, and the
    // kernel's accept queue is first in, first out, so the probe below is
    // accepted only after both idle connections.
    let started = Instant::now();
    let r = http(intake.port, "GET", "/healthz", &[], b"");
    let waited = started.elapsed();
    assert_eq!(r.status, 200);
    // It was answered only once the idle ones were cut off (after ~2 s).
    assert!(
        waited >= Duration::from_millis(1500),
        "served after {waited:?}: the cap was not enforced"
    );
    drop(idle);
}

#[test]
fn an_oversized_body_is_refused_before_it_is_read() {
    let (intake, _s) = intake("max_body_bytes = 65536\n");
    let mut c = TcpStream::connect(("127.0.0.1", intake.port)).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    // Announce 100 MiB and send none of it: the answer must not wait for it.
    c.write_all(
        b"POST /hooks/anything HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 104857600\r\n\r\n",
    )
    .expect("headers");
    let started = Instant::now();
    let mut buf = [0u8; 512];
    let n = c.read(&mut buf).expect("an answer");
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(5));
}
