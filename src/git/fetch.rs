//! Fetching into a remote's cache with gix: the wanted ref (a branch, a
//! tag pattern, another ref) read from a local remote directly when the
//! cache holds it, else fetched; and the cache kept fast (its packs
//! consolidated, repacked now and then). What to fetch and when is
//! `Git`'s to decide; this module does one fetch.

use super::*;

/// Fetch, and for ssh remotes add what ssh itself said (it writes its
/// errors — "Host key verification failed." — to a log, not to gix).
pub(super) fn fetch_blocking(
    dir: &Path,
    remote: &str,
    branch: &str,
    wanted: &str,
    auth: Auth,
) -> FetchResult {
    let ssh_log = is_ssh(remote).then(|| dir.with_extension("ssh.log"));
    if let Some(log) = &ssh_log {
        let _ = std::fs::create_dir_all(dir.parent().unwrap_or(dir));
        let _ = std::fs::write(log, b"");
    }
    let result = fetch_inner(dir, remote, branch, wanted, auth, ssh_log.as_deref());
    match (result, &ssh_log) {
        (
            Err(GitError::Fetch {
                remote,
                branch,
                reason,
            }),
            Some(log),
        ) => {
            let said = std::fs::read_to_string(log).unwrap_or_default();
            let said: Vec<&str> = said.lines().filter(|l| !l.trim().is_empty()).collect();
            let said = said[said.len().saturating_sub(3)..].join(" ");
            let reason = if said.is_empty() {
                reason
            } else {
                format!("{reason} (ssh: {said})")
            };
            Err(GitError::Fetch {
                remote,
                branch,
                reason,
            })
        }
        (other, _) => other,
    }
}

pub(super) fn fetch_inner(
    dir: &Path,
    remote: &str,
    branch: &str,
    wanted: &str,
    auth: Auth,
    ssh_log: Option<&Path>,
) -> FetchResult {
    let err = |reason: String| fetch_err(remote, branch, &reason);
    // Branches where git keeps them; other refs (a forge's pull request
    // heads) under refs/driftless/.
    let local = match wanted.strip_prefix("refs/heads/") {
        Some(b) => format!("refs/remotes/origin/{b}"),
        None => format!(
            "refs/driftless/{}",
            wanted.strip_prefix("refs/").unwrap_or(wanted)
        ),
    };
    // A remote on this machine whose tip the cache already holds at the
    // tracking ref: nothing to fetch, no lock taken, and no process started
    // (for a local remote gix runs `git-upload-pack`). Both refs are read
    // from disk through handles this thread keeps open (`with_cache`): a
    // ref is read afresh on every lookup, only opening is saved (under a
    // flood of pushes, opening both repositories was most of a no-op job).
    if let Some(tip) = local_tip(remote, wanted)
        && with_cache(dir, |repo| target_id(repo, &local)) == Some(tip)
    {
        return Ok(tip.to_hex().to_string());
    }
    let lock = lock_cache(dir).map_err(err)?;
    let repo = open_cache(dir, ssh_log, &auth.ssh_options).map_err(err)?;
    let refspec = format!("+{wanted}:{local}");
    let remote_handle = repo
        .remote_at(remote)
        .map_err(|e| err(format!("invalid remote: {}", chain(&e))))?
        .with_refspecs([refspec.as_str()], gix::remote::Direction::Fetch)
        .map_err(|e| err(format!("invalid branch: {e}")))?
        .with_fetch_tags(gix::remote::fetch::Tags::None);
    let mut connection = remote_handle
        .connect(gix::remote::Direction::Fetch)
        .map_err(|e| err(chain(&e)))?;
    if let Some(pem) = &auth.ca_pem {
        let options = ca_options(&repo, remote, pem).map_err(err)?;
        connection.set_transport_options(Box::new(options));
    }
    let token = auth.token;
    connection.set_credentials(move |action| match action {
        gix::credentials::helper::Action::Get(ctx) => match &token {
            Some((username, password)) => Ok(Some(gix::credentials::protocol::Outcome {
                identity: gix::sec::identity::Account {
                    username: username.clone(),
                    password: password.clone(),
                    oauth_refresh_token: None,
                },
                next: ctx.into(),
            })),
            None => Err(gix::error::message(
                "the remote asks for credentials and the target sets no git.token_file",
            )
            .into()),
        },
        _ => Ok(None),
    });
    let outcome = connection
        .prepare_fetch(gix::progress::Discard, Default::default())
        .map_err(|e| err(chain(&e)))?
        .receive(gix::progress::Discard, &AtomicBool::new(false))
        .map_err(|e| {
            let msg = chain(&e);
            // gix's wording when the refspec matched nothing on the remote
            if msg.contains("None of the refspec") {
                no_branch(remote, branch, wanted)
            } else {
                err(msg)
            }
        })?;
    let tip = tip_of(&outcome.ref_map, wanted, remote, branch)?;
    drop(repo);
    consolidate_packs(dir);
    drop(lock);
    Ok(tip)
}

/// The cache's lock, taken: fetches into one cache are serialised across
/// processes, and lock files a killed fetch left behind are cleared.
fn lock_cache(dir: &Path) -> Result<std::fs::File, String> {
    std::fs::create_dir_all(dir.parent().unwrap_or(dir)).map_err(|e| chain(&e))?;
    let lock_path = dir.with_extension("lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("cannot open {}: {e}", lock_path.display()))?;
    lock.lock()
        .map_err(|e| format!("cannot lock {}: {e}", lock_path.display()))?;
    // Holding the cache lock, no live driftless process is writing here:
    // lock files left behind are from a fetch that was killed.
    clear_stale_locks(dir);
    Ok(lock)
}

/// The cache, opened or made (bare), with the ssh command that logs to
/// `ssh_log` when the remote is reached over ssh.
fn open_cache(
    dir: &Path,
    ssh_log: Option<&Path>,
    ssh_options: &str,
) -> Result<gix::Repository, String> {
    let mut repo = if dir.join("HEAD").is_file() {
        gix::open(dir).map_err(|e| format!("cannot open cache {}: {}", dir.display(), chain(&e)))?
    } else {
        make_cache(dir)?
    };
    if let Some(log) = ssh_log {
        let cmd = format!(
            "ssh -o BatchMode=yes -E {}{}",
            shell_quote(&log.to_string_lossy()),
            ssh_options
        );
        let mut config = repo.config_snapshot_mut();
        config
            .set_value(&gix::config::tree::Core::SSH_COMMAND, cmd.as_str())
            .map_err(|e| format!("cannot configure ssh: {}", chain(&e)))?;
    }
    Ok(repo)
}

/// A new bare cache at `dir`, made beside it and renamed into place: a
/// process killed while making it leaves nothing half-made at `dir` (one
/// that did made every later fetch of the remote fail, "Refusing to
/// initialize the non-empty directory"). Under the cache lock, what is at
/// `dir` without a HEAD, or at the staging path, is a killed attempt's and
/// is removed first.
fn make_cache(dir: &Path) -> Result<gix::Repository, String> {
    let err = |what: &str, e: &dyn std::error::Error| {
        format!(
            "cannot create cache {}: {what}: {}",
            dir.display(),
            chain(e)
        )
    };
    let staging = dir.with_extension("init");
    for p in [dir, staging.as_path()] {
        if p.exists() {
            std::fs::remove_dir_all(p)
                .map_err(|e| err(&format!("removing the leftover {}", p.display()), &e))?;
        }
    }
    drop(gix::init_bare(&staging).map_err(|e| err("init", &e))?);
    std::fs::rename(&staging, dir).map_err(|e| err("moving it into place", &e))?;
    gix::open(dir).map_err(|e| err("opening it", &e))
}

/// HTTP transport options that trust the roots in `pem` (`git.ca_file`).
fn ca_options(
    repo: &gix::Repository,
    remote: &str,
    pem: &[u8],
) -> Result<gix::protocol::transport::client::blocking_io::http::Options, String> {
    use gix::protocol::transport::client::blocking_io::http;
    let certs = reqwest::Certificate::from_pem_bundle(pem)
        .map_err(|e| format!("git.ca_file holds no usable PEM certificate: {e}"))?;
    let mut options = repo
        .transport_options(remote, None)
        .map_err(|e| chain(&e))?
        .and_then(|o| o.downcast::<http::Options>().ok())
        .map(|o| *o)
        .unwrap_or_default();
    let backend = http::reqwest::Options {
        configure_client: Some(Box::new(move |mut builder| {
            for c in &certs {
                builder = builder.add_root_certificate(c.clone());
            }
            Ok(builder)
        })),
        configure_request: None,
    };
    options.backend = Some(Arc::new(std::sync::Mutex::new(backend)));
    Ok(options)
}

/// A missing branch, or no tag matching the pattern.
fn no_branch(remote: &str, branch: &str, wanted: &str) -> GitError {
    match wanted.strip_prefix("refs/tags/") {
        Some(pattern) => GitError::NoTag {
            remote: remote.to_string(),
            pattern: pattern.to_string(),
        },
        None => GitError::NoBranch {
            remote: remote.to_string(),
            branch: branch.to_string(),
        },
    }
}

/// What a fetch found: the wanted ref's object, or for a tag pattern the
/// highest version as "NAME ID" (`tags`).
fn tip_of(
    ref_map: &gix::remote::fetch::RefMap,
    wanted: &str,
    remote: &str,
    branch: &str,
) -> FetchResult {
    Ok(
        match wanted
            .strip_prefix("refs/tags/")
            .filter(|p| p.contains('*'))
        {
            // Tags by pattern: the highest version, as "NAME ID" (`tags`).
            Some(pattern) => tags::newest(
                ref_map.mappings.iter().filter_map(|m| {
                    let name: &[u8] = m.remote.as_name()?.as_ref();
                    Some((name, m.remote.as_id().map(|id| id.to_hex().to_string())))
                }),
                pattern,
                remote,
            )
            .map(|(name, id)| format!("{name} {id}"))
            .ok_or_else(|| GitError::NoTag {
                remote: remote.to_string(),
                pattern: pattern.to_string(),
            })?,
            None => ref_map
                .mappings
                .iter()
                .find(|m| m.remote.as_name().is_some_and(|n| n == wanted.as_bytes()))
                .and_then(|m| m.remote.as_id())
                .map(|id| id.to_hex().to_string())
                .ok_or_else(|| no_branch(remote, branch, wanted))?,
        },
    )
}

/// The object `wanted` points at in a remote on this machine (a path or a
/// `file://` URL), read from its refs as `git ls-remote` shows it, without a
/// process; `None` for any other remote, or when it cannot be read (the
/// fetch then says why).
pub(super) fn local_tip(remote: &str, wanted: &str) -> Option<gix::ObjectId> {
    let path = match remote.strip_prefix("file://") {
        Some(p) => p,
        None if remote.starts_with('/') => remote,
        None => return None,
    };
    with_cache(Path::new(path), |repo| target_id(repo, wanted))
}

/// The object the reference `name` points at in `repo`, read from disk:
/// its target as written (what a fetch records and answers, a tag object
/// for an annotated tag), without reading the object; a symbolic
/// reference is followed and peeled.
pub(super) fn target_id(repo: &gix::Repository, name: &str) -> Option<gix::ObjectId> {
    let mut found = repo.try_find_reference(name).ok()??;
    if let Some(id) = found.target().try_id() {
        return Some(id.to_owned());
    }
    Some(found.peel_to_id().ok()?.detach())
}

/// Pack files a cache may hold before they are merged into one. gix writes
/// one pack per fetch and never repacks, and every object lookup (gix's or
/// git's) searches every pack's index: without this a target pushed to a
/// thousand times is several times slower to tick. 50 is git's own
/// `gc.autoPackLimit`.
const PACK_LIMIT: usize = 50;

/// Merge the cache's packs into one once there are more than [`PACK_LIMIT`],
/// keeping every object, reachable or not (`--keep-unreachable`): a
/// checkout may still be at a commit a force-push left behind. Called with
/// the cache's lock held. A failed repack leaves the packs as they were (git
/// deletes nothing it has not rewritten) and is reported, not fatal: the
/// fetch itself succeeded.
pub(super) fn consolidate_packs(dir: &Path) {
    let packs = std::fs::read_dir(dir.join("objects/pack"))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "pack"))
                .count()
        })
        .unwrap_or(0);
    if packs <= PACK_LIMIT {
        return;
    }
    let started = Instant::now();
    match repack(dir, started + GIT_TIMEOUT) {
        Ok(()) => tracing::info!(
            cache = %dir.display(), packs, took_ms = started.elapsed().as_millis() as u64,
            "merged the cache's packs into one"
        ),
        Err(error) => tracing::warn!(
            cache = %dir.display(), packs, %error,
            "git repack of the cache failed; fetches stay correct but slow down until it succeeds"
        ),
    }
}

/// `git repack -a -d -q --keep-unreachable` in `dir`, killed at `deadline`
/// (a hung repack would otherwise hold the cache's lock for good). The
/// error is git's stderr, or what stopped it.
pub(super) fn repack(dir: &Path, deadline: Instant) -> Result<(), String> {
    use std::io::Read;
    let mut child = std::process::Command::new("git")
        .args(["repack", "-a", "-d", "-q", "--keep-unreachable"])
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run git: {e}"))?;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "killed after {} s without finishing",
                    GIT_TIMEOUT.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(format!("cannot wait for git: {e}")),
        }
    };
    if status.success() {
        return Ok(());
    }
    // `-q` keeps stderr to a line or two: it fits the pipe while git runs.
    let mut said = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut said);
    }
    Err(format!("{status}: {}", said.trim()))
}
