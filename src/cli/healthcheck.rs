//! `driftless healthcheck`: ask a running daemon's `/readyz` and exit 0
//! when it is ready, 1 when it is not or does not answer — what a
//! container's HEALTHCHECK or a monitoring script runs, with no curl in the
//! image. It reads the configuration for the address only: it never opens
//! the state database or starts anything.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use super::{Report, failed};

/// How long the daemon has to answer: a HEALTHCHECK's own timeout is
/// longer (30 s by default), so this one is what is reported.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// `driftless healthcheck [--url URL]`
pub async fn healthcheck(config: &Path, url: Option<&str>) -> Report {
    let url = match url {
        Some(u) => u.to_string(),
        None => match readyz_url(config) {
            Ok(u) => u,
            Err(e) => return failed(e),
        },
    };
    let client = match reqwest::Client::builder().timeout(ANSWER_WITHIN).build() {
        Ok(c) => c,
        Err(e) => {
            return failed(format!(
                "cannot make an HTTP client: {}",
                crate::error::chain(&e)
            ));
        }
    };
    // A `--url` may carry a password (a proxy's, basic auth in front of
    // the daemon): shown without it, and reqwest's errors without the URL.
    let shown = crate::redact::url_without_password(&url);
    match client.get(&url).send().await {
        Ok(r) if r.status().is_success() => Report {
            stdout: format!("ready: {shown}\n"),
            code: 0,
        },
        Ok(r) => {
            let status = r.status();
            let said = r.text().await.unwrap_or_default();
            failed(format!("{shown} answered {status}: {}", said.trim()))
        }
        Err(e) => failed(format!(
            "{shown}: {}",
            crate::error::chain(&e.without_url())
        )),
    }
}

/// `/readyz` at the configured `server.listen`, asked on loopback when
/// the daemon listens on every address.
fn readyz_url(config: &Path) -> Result<String, String> {
    let settings = crate::config::load(config).map_err(|e| e.to_string())?;
    let listen = settings.server.listen;
    if listen.port() == 0 {
        return Err(format!(
            "{}: server.listen is {listen}, a port the kernel picks at start; pass --url",
            config.display()
        ));
    }
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    Ok(format!(
        "http://{}/readyz",
        SocketAddr::new(ip, listen.port())
    ))
}
