//! The HTTP surface against bad input: each request gets a bounded, correct
//! answer, nothing is queued, and good requests are still served.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::common::*;

const SECRET: &str = "bad-input-secret";

fn intake() -> (Intake, Setup, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = dir.path().join("secret");
    std::fs::write(&secret, SECRET).expect("write");
    let (token, digest) = driftless::auth::new_token().expect("token");
    let s = Setup::new(&format!(
        "[[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {}\n\n\
         [[tokens]]\nname = \"admin\"\nsha256 = \"{digest}\"\nscopes = [\"reconcile:*\", \"pause:*\", \"read\"]\n\n{}",
        toml_str(&secret.display().to_string()),
        exec_target(
            "web",
            "https://git.example.net/ops/infra.git",
            "",
            "apply = [\"true\"]"
        )
    ));
    let text = std::fs::read_to_string(&s.config).expect("config");
    std::fs::write(
        &s.config,
        text.replacen("workers = 4\n", "workers = 4\nmax_body_bytes = 65536\n", 1),
    )
    .expect("config");
    (Intake::start(&s), s, format!("Bearer {token}"), dir)
}

fn signed_post(intake: &Intake, body: &[u8]) -> HttpResponse {
    let sig = format!("sha256={}", hmac_hex(SECRET, body));
    intake.post(
        "/hooks/github",
        &[
            ("X-GitHub-Event", "push"),
            ("X-Hub-Signature-256", &sig),
            ("Content-Type", "application/json"),
        ],
        body,
    )
}

/// Send raw bytes; the answer's status code, and whether the server
/// answered *and* closed the connection within two seconds.
fn raw(port: u16, bytes: &[u8]) -> (Option<u16>, bool) {
    let started = std::time::Instant::now();
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return (None, false);
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.write_all(bytes);
    let mut buf = Vec::new();
    let eof = s.read_to_end(&mut buf).is_ok();
    let bounded = eof && started.elapsed() < Duration::from_secs(2);
    let code = String::from_utf8_lossy(&buf)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok());
    (code, bounded)
}

#[test]
fn malformed_bodies_after_a_valid_signature_are_400() {
    let (intake, _s, _t, _d) = intake();
    // invalid UTF-8, deeply nested JSON, a JSON scalar, a push without `ref`,
    let nested = format!("{}{}", "[".repeat(30_000), "]".repeat(30_000));
    for body in [
        b"\xff\xfe\xfd not json".to_vec(),
        nested.into_bytes(),
        b"42".to_vec(),
        br#"{"after": "abc", "repository": {"clone_url": "https://git.example.net/ops/infra.git"}}"#.to_vec(),
        // found by fuzzing: a branch ref with no branch name, and a commit
        // id that is not one
        br#"{"ref": "refs/heads/", "after": "0123456789abcdef0123456789abcdef01234567", "repository": {"clone_url": "https://git.example.net/ops/infra.git"}}"#.to_vec(),
        br#"{"ref": "refs/heads/main", "after": "0000*0000", "repository": {"clone_url": "https://git.example.net/ops/infra.git"}}"#.to_vec(),
    ] {
        let r = signed_post(&intake, &body);
        assert_eq!(r.status, 400, "{r:?}");
        assert!(r.json()["error"].is_string());
    }
    assert!(intake.jobs().is_empty());
    assert_eq!(http_get(intake.port, "/healthz").map(|r| r.0), Some(200));
}

#[test]
fn oversized_chunked_bodies_and_header_floods_are_refused() {
    let (intake, _s, _t, _d) = intake();
    // A chunked body (no Content-Length) that grows past the cap.
    let mut req = b"POST /hooks/github HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nX-GitHub-Event: push\r\nX-Hub-Signature-256: sha256=00\r\nConnection: close\r\n\r\n".to_vec();
    let chunk = vec![b'a'; 16 * 1024];
    for _ in 0..8 {
        req.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        req.extend_from_slice(&chunk);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    assert_eq!(raw(intake.port, &req), (Some(413), true));

    // Ten thousand headers: refused by the HTTP parser, bounded.
    let mut flood = b"GET /healthz HTTP/1.1\r\nHost: x\r\n".to_vec();
    for i in 0..10_000 {
        flood.extend_from_slice(format!("X-Flood-{i}: {i}\r\n").as_bytes());
    }
    flood.extend_from_slice(b"\r\n");
    let (code, bounded) = raw(intake.port, &flood);
    assert!(
        matches!(code, Some(400) | Some(431)) && bounded,
        "a header flood got {code:?} (answered and closed within 2 s: {bounded})"
    );

    // Garbage instead of HTTP: a 400, then the connection is closed.
    let (code, bounded) = raw(intake.port, b"\x00\x01\x02 hello\r\n\r\n");
    assert_eq!((code, bounded), (Some(400), true));

    assert!(intake.jobs().is_empty());
    assert_eq!(
        http_get(intake.port, "/healthz").map(|r| r.0),
        Some(200),
        "the server stopped serving"
    );
}

#[test]
fn path_traversal_and_unknown_names_get_404_or_401() {
    let (intake, _s, token, _d) = intake();
    for path in [
        "/api/v1/targets/..%2f..%2fetc%2fpasswd",
        "/api/v1/targets/%2e%2e",
        "/api/v1/targets/web%00",
        "/api/v1/targets/WEB",
        "/api/v1/targets/nope/runs",
    ] {
        let r = http(intake.port, "GET", path, &[("Authorization", &token)], b"");
        assert_eq!(r.status, 404, "{path}: {r:?}");
        let r = http(intake.port, "GET", path, &[], b"");
        // Without a token nothing is said about which names exist.
        assert_eq!(r.status, 401, "{path} without a token: {r:?}");
    }
    for path in [
        "/api/v1/targets/..%2fweb/reconcile",
        "/api/v1/targets/%2e%2e/pause",
    ] {
        let r = http(intake.port, "POST", path, &[("Authorization", &token)], b"");
        assert_eq!(r.status, 404, "{path}: {r:?}");
    }
    for path in [
        "/hooks/..%2fgithub",
        "/hooks/%2e%2e",
        "/hooks/",
        "/hooks/github/extra",
    ] {
        let r = intake.post(path, &[], b"{}");
        assert_eq!(r.status, 404, "{path}: {r:?}");
    }
    let r = http(intake.port, "GET", "/../../etc/passwd", &[], b"");
    assert_eq!(r.status, 404, "{r:?}");
    assert!(intake.jobs().is_empty());
}

#[test]
fn good_requests_are_served_during_a_flood_of_bad_ones() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (intake, _s, _t, _d) = intake();
    let port = intake.port;
    let sent = Arc::new(AtomicUsize::new(0));
    let flooders: Vec<_> = (0..4)
        .map(|i| {
            let sent = sent.clone();
            std::thread::spawn(move || {
                let mut answers = std::collections::BTreeMap::new();
                for n in 0..200 {
                    let body = format!("{{\"garbage\": {i}{n}");
                    let r = http(
                        port,
                        "POST",
                        "/hooks/github",
                        &[
                            ("X-GitHub-Event", "push"),
                            ("X-Hub-Signature-256", "sha256=deadbeef"),
                        ],
                        body.as_bytes(),
                    );
                    *answers.entry(r.status).or_insert(0) += 1;
                    sent.fetch_add(1, Ordering::Relaxed);
                }
                answers
            })
        })
        .collect();
    // Probe /healthz while the flood is on (it has started and not ended),
    // timing each answer.
    wait_for(Duration::from_secs(10), "the flood to start", || {
        sent.load(Ordering::Relaxed) > 0
    });
    let mut during = Vec::new();
    while sent.load(Ordering::Relaxed) < 800 {
        let t = std::time::Instant::now();
        assert_eq!(http_get(port, "/healthz").map(|r| r.0), Some(200));
        if sent.load(Ordering::Relaxed) < 800 {
            during.push(t.elapsed());
        }
    }
    let mut answers = std::collections::BTreeMap::new();
    for f in flooders {
        for (k, v) in f.join().expect("flooder") {
            *answers.entry(k).or_insert(0) += v;
        }
    }
    // Every bad delivery got the documented answer.
    assert_eq!(
        answers.into_iter().collect::<Vec<_>>(),
        [(401, 800)],
        "the flood's answers"
    );
    assert!(
        during.len() >= 5,
        "only {} probes during the flood",
        during.len()
    );
    let slowest = during.iter().max().copied().unwrap_or_default();
    assert!(
        slowest < Duration::from_secs(1),
        "/healthz took {slowest:?} during the flood"
    );
    assert!(intake.jobs().is_empty());
}
