//! Git: the only module that knows gix or the git CLI.
//!
//! One bare cache per remote under `<state_dir>/git/`, fetched with gix's
//! blocking client inside `spawn_blocking`. Concurrent requests for the same
//! remote and branch share one fetch (a fetch that *started* after a request
//! was made satisfies it), and a file lock on the cache serialises fetches
//! across processes (daemon and one-shot CLI). Each target has its own
//! checkout under `<state_dir>/checkouts/<target>/`, a repository borrowing
//! the cache's objects, moved to the exact commit with `git reset --hard`:
//! tracked files match the commit, files git ignores survive (terraform's
//! `.terraform/`, local state). Credentials come from config, are handed to
//! gix or ssh directly, and never appear in a message.
//!
//! A tick with nothing to do runs no git process: a remote on this machine
//! has its branch read directly and is not fetched when the cache holds
//! that commit; a checkout already at the commit, its tracked files
//! untouched (`worktree`), is not reset; trees are read with gix.
//! Commit signatures are checked in the cache (`verify`) before a
//! checkout moves.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

mod fetch;
use fetch::fetch_blocking;
mod tags;
mod verify;
mod worktree;

pub use tags::{TagTip, version as tag_version};
pub use verify::{Refused, Verification};

use crate::error::chain;
use crate::model::CommitId;
use crate::process::{self, Spec};
use crate::redact::Redactor;
use crate::secret::SecretRef;

/// How long one fetch or checkout command may take.
const GIT_TIMEOUT: Duration = Duration::from_secs(10 * 60);

#[derive(Debug, Clone, thiserror::Error)]
pub enum GitError {
    #[error("git fetch of branch `{branch}` from {remote} failed: {reason}")]
    Fetch {
        remote: String,
        branch: String,
        reason: String,
    },
    #[error("branch `{branch}` does not exist in {remote}")]
    NoBranch { remote: String, branch: String },
    #[error("no tag matching `{pattern}` in {remote} is a version (semver, a leading v allowed)")]
    NoTag { remote: String, pattern: String },
    #[error("git checkout of {sha} into {dir} failed: {reason}")]
    Checkout {
        sha: String,
        dir: String,
        reason: String,
    },
    #[error("path `{path}` does not exist at commit {sha}")]
    NoPath { path: String, sha: String },
    #[error(
        "path `{path}` at commit {sha} resolves to {leads_to}, outside the checkout (a committed symlink); refused"
    )]
    Escapes {
        path: String,
        sha: String,
        leads_to: String,
    },
    #[error("cannot read the tree of commit {sha} in the cache of {remote}")]
    Tree { remote: String, sha: String },
    #[error("cannot read git credentials: {0}")]
    Credentials(String),
}

/// Credentials for fetching a target's repository.
#[derive(Debug, Clone, Default)]
pub struct GitAuth {
    /// https: token sent as the password.
    pub token: Option<SecretRef>,
    /// https: the user name sent with the token.
    pub username: Option<String>,
    /// ssh: private key file.
    pub identity_file: Option<PathBuf>,
    /// ssh: known_hosts file (host keys are always checked).
    pub known_hosts_file: Option<PathBuf>,
    /// https: extra CA certificates (PEM) to trust, for a self-hosted forge
    /// with a private CA. The system's roots are trusted as well.
    pub ca_file: Option<PathBuf>,
}

/// What git needs of a target: where its repository is, which branch, the
/// path inside it, and how to authenticate. Built by `config::Target::source`.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// The target's name: its checkout is `<state_dir>/checkouts/<target>`.
    pub target: &'a str,
    pub repo: &'a str,
    pub branch: &'a str,
    /// The target's directory inside the repository ("" = the root).
    pub path: &'a Path,
    /// The directories a sparse checkout holds (`path` among them); empty:
    /// the whole tree.
    pub sparse: &'a [PathBuf],
    pub auth: &'a GitAuth,
}

/// A target's checkout, moved to a commit.
#[derive(Debug, Clone)]
pub struct Synced {
    /// The full commit id now checked out.
    pub sha: CommitId,
    /// The checkout's root.
    pub checkout: PathBuf,
    /// `checkout/<target path>`: where the backend works.
    pub workdir: PathBuf,
    /// The git tree id of the target's path at `sha`: a content hash of every
    /// tracked file under it (changes exactly when those files change).
    pub source_digest: String,
}

type FetchResult = Result<String, GitError>;
/// One slot per remote, ref and set of credentials: a fetch made with one
/// target's credentials never answers a target with other ones (a wrong
/// token must fail, even while a right one just fetched the same branch).
type Slots = HashMap<(String, String, String), Arc<tokio::sync::Mutex<FetchSlot>>>;

#[derive(Default)]
struct FetchSlot {
    last: Option<(Instant, FetchResult)>,
}

/// Where the targets' checkouts live under a state directory.
pub fn checkout_root(state_dir: &Path) -> PathBuf {
    state_dir.join("checkouts")
}

/// What a target's checkout is a checkout of, as noted in it
/// (`.git/driftless-of`): the repository (its normalised URL), the path in
/// it and the backend kind. Untracked files in a checkout (terraform's
/// local state, `.terraform/`) belong to what made them: a checkout is
/// never reused for another repository, path or kind of backend.
pub fn checkout_identity(repo_key: &str, path: &Path, backend: &str) -> String {
    format!(
        "repository {repo_key}\npath {}\nbackend {backend}\n",
        if path.as_os_str().is_empty() {
            ".".to_string()
        } else {
            path.display().to_string()
        }
    )
}

/// What the checkout at `dir` was noted to be a checkout of, if anything
/// (a checkout made before this was kept has no note; it is adopted).
pub fn checkout_of(dir: &Path) -> Result<Option<String>, std::io::Error> {
    match std::fs::read_to_string(dir.join(".git").join("driftless-of")) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Note in the checkout at `dir` what it is a checkout of.
pub fn note_checkout_of(dir: &Path, identity: &str) -> Result<(), std::io::Error> {
    std::fs::write(dir.join(".git").join("driftless-of"), identity)
}

/// What [`Git::path_between`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathBetween {
    Same,
    Changed,
    Unknown,
}

/// What [`Git::dirs_at`] found: the matching directories, and the
/// symbolic links where a directory was looked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dirs {
    pub dirs: Vec<String>,
    pub links: Vec<String>,
}

/// Fetches remotes into caches and moves checkouts. Cheap to clone.
#[derive(Clone)]
pub struct Git {
    cache_root: PathBuf,
    checkout_root: PathBuf,
    preview_root: PathBuf,
    /// Commit-signature checks: a private GnuPG home per target while one
    /// runs, and a note of the last commit verified.
    verify_root: PathBuf,
    slots: Arc<std::sync::Mutex<Slots>>,
    fetches: Arc<AtomicU64>,
}

std::thread_local! {
    /// The caches this (blocking pool) thread opened for reading, and the
    /// remotes on this machine it read tips from, kept open: opening one
    /// reads its configuration and object database afresh, which was most
    /// of what reading one tree cost. gix looks at the disk again for an
    /// object it does not find (a pack a later fetch added), and reads a
    /// reference from disk at every lookup. Per thread: gix's repository handles are not `Send` as this
    /// crate builds gix.
    static OPENED: std::cell::RefCell<HashMap<PathBuf, gix::Repository>> =
        std::cell::RefCell::new(HashMap::new());
}

/// Run `f` on `cache` opened for reading (kept open by this thread);
/// `None` when it cannot be opened. When `f` finds nothing on a handle
/// kept open, it is asked once more on one opened afresh: a miss must not
/// come from a handle that has not seen what a fetch wrote since (the
/// chaos test once had a commit `git reset` had just checked out read as
/// missing here, failing the run with "path does not exist").
fn with_cache<T>(cache: &Path, f: impl Fn(&gix::Repository) -> Option<T>) -> Option<T> {
    OPENED.with(|opened| {
        let mut opened = opened.borrow_mut();
        if let Some(repo) = opened.get(cache)
            && let Some(found) = f(repo)
        {
            return Some(found);
        }
        let repo = gix::open_opts(cache, gix::open::Options::isolated()).ok()?;
        opened.insert(cache.to_path_buf(), repo);
        f(opened.get(cache)?)
    })
}

/// Credentials resolved from config for one fetch.
struct Auth {
    token: Option<(String, String)>,
    /// Extra `ssh` options (key, known_hosts) for ssh remotes.
    ssh_options: String,
    /// Extra CA roots for https, PEM.
    ca_pem: Option<Vec<u8>>,
}

impl Git {
    pub fn new(state_dir: &Path) -> Self {
        Git {
            cache_root: state_dir.join("git"),
            checkout_root: checkout_root(state_dir),
            preview_root: state_dir.join("previews").join("checkouts"),
            verify_root: state_dir.join("verify"),
            slots: Default::default(),
            fetches: Default::default(),
        }
    }

    /// How many fetches this instance has started.
    pub fn fetch_count(&self) -> u64 {
        self.fetches.load(Ordering::Relaxed)
    }

    /// The directory a target's checkout lives in (it may not exist yet).
    pub fn checkout_dir(&self, target: &str) -> PathBuf {
        self.checkout_root.join(target)
    }

    /// The redactor for messages about this target's remote: knows its token.
    pub fn redactor(auth: &GitAuth) -> Redactor {
        let mut r = Redactor::new();
        if let Some(t) = auth.token.as_ref().and_then(|t| t.load().ok()) {
            r.add(t);
        }
        r
    }

    /// Fetch the target's branch (or take a fetch of it that started at or
    /// after `since`, see [`Git::fetch_since`]) and move its checkout to the
    /// branch tip.
    pub async fn sync(&self, target: Source<'_>, since: Instant) -> Result<Synced, GitError> {
        let sha = self
            .fetch_since(target.repo, target.branch, target.auth, since)
            .await?;
        self.checkout(target, &sha).await
    }

    /// The directory a target's preview checkout lives in: apart from its
    /// own, so a preview never moves what an apply works in.
    pub fn preview_dir(&self, target: &str) -> PathBuf {
        self.preview_root.join(target)
    }

    /// Fetch `branch` of `remote` into its cache and return the tip's id.
    /// Requests arriving while a fetch runs wait for the next one that starts
    /// after them; requests satisfied by a fetch that started after they were
    /// made share its result.
    pub async fn fetch(&self, remote: &str, branch: &str, auth: &GitAuth) -> FetchResult {
        self.fetch_since(remote, branch, auth, Instant::now()).await
    }

    /// [`Git::fetch`], satisfied as well by a successful fetch that started
    /// at or after `since`: a push's tick passes the moment it began (any
    /// fetch since then sees the pushed commit, so its routing and its sync
    /// share one), an interval tick a moment one interval back — one fetch
    /// of a repository serves every target on it for a round. A failed
    /// fetch is never reused this way.
    pub async fn fetch_since(
        &self,
        remote: &str,
        branch: &str,
        auth: &GitAuth,
        since: Instant,
    ) -> FetchResult {
        self.fetch_wanted(remote, branch, format!("refs/heads/{branch}"), auth, since)
            .await
    }

    /// Fetch a ref that is not a branch (a forge's `refs/pull/<n>/head`)
    /// into the cache and return the commit it points at. Errors name the
    /// ref where a branch fetch names the branch.
    pub async fn fetch_ref(&self, remote: &str, git_ref: &str, auth: &GitAuth) -> FetchResult {
        self.fetch_wanted(remote, git_ref, git_ref.to_string(), auth, Instant::now())
            .await
    }

    async fn fetch_wanted(
        &self,
        remote: &str,
        branch: &str,
        wanted: String,
        auth: &GitAuth,
        since: Instant,
    ) -> FetchResult {
        let requested = Instant::now();
        let slot = {
            let mut slots = self
                .slots
                .lock()
                .map_err(|_| fetch_err(remote, branch, "internal lock poisoned"))?;
            // The credentials' references (files, variables), never their
            // values: GitAuth's Debug names references only.
            slots
                .entry((remote.to_string(), wanted.clone(), format!("{auth:?}")))
                .or_default()
                .clone()
        };
        let mut slot = slot.lock().await;
        if let Some((started, result)) = &slot.last
            && (*started >= requested || (*started >= since && result.is_ok()))
        {
            return result.clone();
        }
        let started = Instant::now();
        self.fetches.fetch_add(1, Ordering::Relaxed);
        let resolved = resolve_auth(auth)?;
        let redactor = Self::redactor(auth);
        let dir = self.cache_dir(remote);
        let (remote_s, branch_s) = (remote.to_string(), branch.to_string());
        let result = tokio::task::spawn_blocking(move || {
            fetch_blocking(&dir, &remote_s, &branch_s, &wanted, resolved)
        })
        .await
        .unwrap_or_else(|e| {
            Err(fetch_err(
                remote,
                branch,
                &format!("fetch task failed: {e}"),
            ))
        })
        .map_err(|e| redact_err(e, &redactor));
        slot.last = Some((started, result.clone()));
        result
    }

    /// Move the target's checkout to `sha` (which must be in the cache).
    pub async fn checkout(&self, target: Source<'_>, sha: &str) -> Result<Synced, GitError> {
        self.checkout_into(self.checkout_dir(target.target), target, sha, None)
            .await
    }

    /// [`Git::checkout`] for a caller that has just asked [`Git::is_at`]:
    /// its answer is not asked again (a checkout found already there is
    /// not reset).
    pub async fn checkout_known(
        &self,
        target: Source<'_>,
        sha: &str,
        already: bool,
    ) -> Result<Synced, GitError> {
        self.checkout_into(self.checkout_dir(target.target), target, sha, Some(already))
            .await
    }

    /// Move the target's preview checkout to `sha` (in the cache). The
    /// caller holds the target's preview lock, never its apply lock.
    pub async fn checkout_preview(
        &self,
        target: Source<'_>,
        sha: &str,
    ) -> Result<Synced, GitError> {
        self.checkout_into(self.preview_dir(target.target), target, sha, None)
            .await
    }

    /// Whether the target's checkout is already exactly at `sha`, its
    /// tracked files untouched (read-only; `checkout` looks again before it
    /// skips a reset).
    pub async fn is_at(&self, target: &str, sha: &str) -> bool {
        let (dir, sha) = (self.checkout_dir(target), sha.to_string());
        tokio::task::spawn_blocking(move || worktree::already_at(&dir, &sha))
            .await
            .unwrap_or(false)
    }

    /// The merge base of commits `a` and `b` in `remote`'s cache (`None`:
    /// they share no history). Read-only.
    pub async fn merge_base(
        &self,
        remote: &str,
        a: &str,
        b: &str,
    ) -> Result<Option<String>, GitError> {
        let cache = self.cache_dir(remote);
        let fail = |reason: String| GitError::Checkout {
            sha: format!("{a}...{b}"),
            dir: cache.display().to_string(),
            reason: format!("git merge-base failed: {reason}"),
        };
        let (spec, out) = git_run(&cache, &["merge-base", a, b]).await.map_err(fail)?;
        match out.code {
            _ if out.success() => Ok(Some(out.stdout.trim().to_string())),
            // exit 1 with nothing said: no common ancestor
            Some(1) if out.stderr.trim().is_empty() => Ok(None),
            _ if !out.stderr.trim().is_empty() => Err(fail(out.stderr.trim().to_string())),
            _ => Err(fail(process::describe_exit(&spec, &out, Some(GIT_TIMEOUT)))),
        }
    }

    /// Whether `sha` is a commit in `remote`'s cache.
    pub async fn has_commit(&self, remote: &str, sha: &str) -> bool {
        let Some(id) = object_id(sha) else {
            return false;
        };
        let cache = self.cache_dir(remote);
        tokio::task::spawn_blocking(move || {
            with_cache(&cache, |repo| repo.find_commit(id).ok().map(|_| true)).unwrap_or(false)
        })
        .await
        .unwrap_or(false)
    }

    async fn checkout_into(
        &self,
        dir: PathBuf,
        target: Source<'_>,
        sha: &str,
        known: Option<bool>,
    ) -> Result<Synced, GitError> {
        let cache = self.cache_dir(target.repo);
        let err = |reason: String| GitError::Checkout {
            sha: sha.to_string(),
            dir: dir.display().to_string(),
            reason,
        };
        // Checkouts hold decrypted secrets and local state for the length
        // of an apply: their root is the service user's alone, whatever
        // the umask or the state directory's mode (systemd makes it 0755).
        if let Some(root) = dir.parent() {
            private_dir(root).map_err(|e| err(chain(&e)))?;
        }
        if !dir.join(".git").is_dir() {
            std::fs::create_dir_all(&dir).map_err(|e| err(chain(&e)))?;
            // No template: a checkout needs none of git's sample hooks
            // (most of an empty repository's disk, times every target).
            git_cli(&dir, &["init", "-q", "--template=", "."])
                .await
                .map_err(&err)?;
        }
        // Borrow the cache's objects instead of copying them (as `clone --shared`).
        let alternates = dir.join(".git/objects/info/alternates");
        let objects = cache.join("objects");
        let want = format!("{}\n", objects.display());
        if std::fs::read_to_string(&alternates).ok().as_deref() != Some(want.as_str()) {
            std::fs::create_dir_all(dir.join(".git/objects/info"))
                .and_then(|()| std::fs::write(&alternates, &want))
                .map_err(|e| err(chain(&e)))?;
        }
        // A sparse checkout holds only its directories; a change of them
        // (or to or from full) is made by git, and the tree is then reset.
        let resparsed = set_sparse(&dir, target.sparse).await.map_err(&err)?;
        // Already there, tracked files untouched since (told from the
        // index's stat data, without running git): nothing to move.
        let already = match known {
            _ if resparsed => false,
            Some(k) => k,
            None => {
                let at = (dir.clone(), sha.to_string());
                tokio::task::spawn_blocking(move || worktree::already_at(&at.0, &at.1))
                    .await
                    .unwrap_or(false)
            }
        };
        if !already {
            // The caller holds the target's lock: a git lock file left in
            // the checkout is from a tick that was killed mid-reset.
            clear_stale_locks(&dir.join(".git"));
            worktree::forget(&dir).map_err(|e| err(chain(&e)))?;
            // No reflog: nobody reads a checkout's history of resets, and
            // its files would be a fifth of a sparse checkout's disk.
            let args = [
                "-c",
                "core.logAllRefUpdates=false",
                "reset",
                "-q",
                "--hard",
                sha,
            ];
            git_cli(&dir, &args).await.map_err(&err)?;
            if !target.sparse.is_empty() {
                worktree::drop_skipped(&dir).map_err(&err)?;
            }
            worktree::mark(&dir, sha);
        }
        let path = target.path.to_string_lossy().into_owned();
        let tree = self
            .tree_at(target.repo, sha, target.path)
            .await
            .ok_or_else(|| GitError::NoPath {
                path: path.clone(),
                sha: sha.to_string(),
            })?;
        let workdir = dir.join(target.path);
        // A committed symlink must not take the backend out of the checkout.
        if let Some(to) = crate::paths::leads_outside(&dir, &workdir) {
            return Err(GitError::Escapes {
                path,
                sha: sha.to_string(),
                leads_to: to.display().to_string(),
            });
        }
        if !workdir.is_dir() {
            return Err(GitError::NoPath {
                path,
                sha: sha.to_string(),
            });
        }
        Ok(Synced {
            sha: CommitId::new(sha),
            checkout: dir,
            workdir,
            source_digest: tree,
        })
    }

    /// What git says of `path` between commits `a` and `b` in `remote`'s
    /// cache: the same tree (or the same commit), a different one (or the
    /// path at only one of them), or nothing either way (the path at
    /// neither, or a commit not in the cache). The one place "did the
    /// target's path change" is decided: for a push (`tick`), for a plan
    /// made at another commit (`tick::review`), for a pull request
    /// (`tick::preview`).
    pub async fn path_between(&self, remote: &str, path: &Path, a: &str, b: &str) -> PathBetween {
        if a == b {
            return PathBetween::Same;
        }
        match (
            self.tree_at(remote, a, path).await,
            self.tree_at(remote, b, path).await,
        ) {
            (Some(x), Some(y)) if x == y => PathBetween::Same,
            (None, None) => PathBetween::Unknown,
            _ => PathBetween::Changed,
        }
    }

    /// The files that differ between commits `a` and `b` in `remote`'s
    /// cache, relative to the repository, in git's order (`git diff
    /// --name-only`, renames as a delete and an add); `Err` says why git
    /// could not tell (a commit not in the cache).
    pub async fn files_between(
        &self,
        remote: &str,
        a: &str,
        b: &str,
    ) -> Result<Vec<String>, String> {
        let cache = self.cache_dir(remote);
        let stdout = git_cli(
            &cache,
            &["diff", "--no-renames", "--name-only", "-z", a, b, "--"],
        )
        .await
        .map_err(|e| {
            format!(
                "git diff {} {} failed: {}",
                crate::model::short_sha(a),
                crate::model::short_sha(b),
                e.trim()
            )
        })?;
        Ok(stdout
            .split('\0')
            .filter(|f| !f.is_empty())
            .map(str::to_string)
            .collect())
    }

    /// The git tree id of `path` ("" = the root) at commit `sha` in
    /// `remote`'s cache: `None` when the commit or the path is not there.
    /// Read-only (no checkout moves), read by gix: no process.
    pub async fn tree_at(&self, remote: &str, sha: &str, path: &Path) -> Option<String> {
        let (cache, sha, path) = (self.cache_dir(remote), sha.to_string(), path.to_path_buf());
        tokio::task::spawn_blocking(move || {
            with_cache(&cache, |repo| {
                let tree = repo.find_commit(object_id(&sha)?).ok()?.tree().ok()?;
                if path.as_os_str().is_empty() {
                    return Some(tree.id.to_hex().to_string());
                }
                let entry = tree.lookup_entry_by_path(&path).ok()??;
                Some(entry.oid().to_hex().to_string())
            })
        })
        .await
        .ok()
        .flatten()
    }

    /// The directories at commit `sha` in `remote`'s cache whose path
    /// matches `pattern` level by level (`stacks/*`: each level a glob, see
    /// `glob::glob_match`; no level matches across a `/`), sorted, and the
    /// symbolic links found where a directory was looked for (a link is
    /// never followed: it may point anywhere). Submodules and files are not
    /// directories; a level that is not there matches nothing. Read by gix:
    /// no process, no checkout moves.
    pub async fn dirs_at(&self, remote: &str, sha: &str, pattern: &str) -> Result<Dirs, GitError> {
        let (cache, sha_s, pattern) =
            (self.cache_dir(remote), sha.to_string(), pattern.to_string());
        let found = tokio::task::spawn_blocking(move || {
            with_cache(&cache, |repo| {
                let levels: Vec<&str> = pattern.split('/').collect();
                let root = repo.find_commit(object_id(&sha_s)?).ok()?.tree_id().ok()?;
                let mut at: Vec<(String, gix::ObjectId)> = vec![(String::new(), root.detach())];
                let mut links = Vec::new();
                for level in levels {
                    let mut next = Vec::new();
                    for (path, id) in at {
                        let tree = repo.find_tree(id).ok()?;
                        for entry in tree.iter() {
                            let entry = entry.ok()?;
                            let name = entry.inner.filename.to_string();
                            let mode = entry.inner.mode;
                            if !(mode.is_tree() || mode.is_link())
                                || !crate::glob::glob_match(level, &name)
                            {
                                continue;
                            }
                            let full = if path.is_empty() {
                                name
                            } else {
                                format!("{path}/{name}")
                            };
                            if mode.is_link() {
                                links.push(full);
                            } else {
                                next.push((full, entry.inner.oid.to_owned()));
                            }
                        }
                    }
                    at = next;
                }
                let mut dirs: Vec<String> = at.into_iter().map(|(p, _)| p).collect();
                dirs.sort();
                links.sort();
                Some(Dirs { dirs, links })
            })
        })
        .await
        .ok()
        .flatten();
        found.ok_or_else(|| GitError::Tree {
            remote: remote.to_string(),
            sha: sha.to_string(),
        })
    }

    /// Where target `target`'s checkout is (whether or not there is one).
    pub fn checkout_path(&self, target: &str) -> PathBuf {
        self.checkout_dir(target)
    }

    /// The commit the target's checkout is at, if it has one.
    pub async fn checked_out(&self, target: &str) -> Option<String> {
        let dir = self.checkout_dir(target);
        if !dir.join(".git").is_dir() {
            return None;
        }
        tokio::task::spawn_blocking(move || {
            let repo = gix::open_opts(&dir, gix::open::Options::isolated()).ok()?;
            Some(repo.head_id().ok()?.to_hex().to_string())
        })
        .await
        .ok()
        .flatten()
    }

    fn cache_dir(&self, remote: &str) -> PathBuf {
        let hash = hex::encode(Sha256::digest(remote.as_bytes()));
        let slug: String = remote
            .rsplit(['/', ':'])
            .find(|s| !s.is_empty())
            .unwrap_or("repo")
            .trim_end_matches(".git")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .take(40)
            .collect();
        self.cache_root.join(format!("{slug}-{}.git", &hash[..16]))
    }
}

/// A full commit id (40 hex digits); `None` for anything else.
fn object_id(sha: &str) -> Option<gix::ObjectId> {
    gix::ObjectId::from_hex(sha.as_bytes()).ok()
}

/// Remove git's `*.lock` files (top level and under `refs/`) from `git_dir`.
/// Only call while holding the lock that keeps other driftless processes out
/// of this repository: then any lock file is stale, left by a process that
/// died, and would otherwise block every later fetch or checkout.
fn clear_stale_locks(git_dir: &Path) {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>, recurse: bool) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "lock") && p.is_file() {
                out.push(p);
            } else if recurse && p.is_dir() {
                walk(&p, out, true);
            }
        }
    }
    let mut stale = Vec::new();
    walk(git_dir, &mut stale, false);
    walk(&git_dir.join("refs"), &mut stale, true);
    for p in stale {
        match std::fs::remove_file(&p) {
            Ok(()) => {
                tracing::warn!(file = %p.display(), "removed a git lock file left by an interrupted run")
            }
            Err(e) => {
                tracing::warn!(file = %p.display(), error = %e, "cannot remove a stale git lock file")
            }
        }
    }
}

fn fetch_err(remote: &str, branch: &str, reason: &str) -> GitError {
    GitError::Fetch {
        remote: remote.to_string(),
        branch: branch.to_string(),
        reason: reason.to_string(),
    }
}

fn redact_err(e: GitError, r: &Redactor) -> GitError {
    match e {
        GitError::Fetch {
            remote,
            branch,
            reason,
        } => GitError::Fetch {
            remote: r.redact(&remote),
            branch,
            reason: r.redact(&reason),
        },
        GitError::NoBranch { remote, branch } => GitError::NoBranch {
            remote: r.redact(&remote),
            branch,
        },
        other => other,
    }
}

fn resolve_auth(auth: &GitAuth) -> Result<Auth, GitError> {
    let token = match &auth.token {
        Some(t) => {
            let secret = t.load().map_err(|e| GitError::Credentials(e.to_string()))?;
            let user = auth
                .username
                .clone()
                .unwrap_or_else(|| "x-access-token".to_string());
            Some((user, secret))
        }
        None => None,
    };
    let mut ssh_options = String::new();
    if let Some(key) = &auth.identity_file {
        ssh_options.push_str(&format!(
            " -o IdentitiesOnly=yes -i {}",
            shell_quote(&key.to_string_lossy())
        ));
    }
    if let Some(kh) = &auth.known_hosts_file {
        ssh_options.push_str(&format!(
            " -o StrictHostKeyChecking=yes -o UserKnownHostsFile={}",
            shell_quote(&kh.to_string_lossy())
        ));
    }
    let ca_pem = match &auth.ca_file {
        Some(p) => Some(std::fs::read(p).map_err(|e| {
            GitError::Credentials(format!("cannot read git.ca_file {}: {e}", p.display()))
        })?),
        None => None,
    };
    Ok(Auth {
        token,
        ssh_options,
        ca_pem,
    })
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn is_ssh(remote: &str) -> bool {
    remote.starts_with("ssh://")
        || remote.starts_with("git+ssh://")
        || (!remote.contains("://") && remote.contains('@') && remote.contains(':'))
}

/// `dir`, created if need be, readable by its owner only (0700); an
/// existing one that others may read is made so.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    match std::fs::metadata(dir) {
        Ok(m) if m.permissions().mode() & 0o077 == 0 => Ok(()),
        Ok(_) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir),
        Err(e) => Err(e),
    }
}

/// Run the git CLI in `dir`; the error is what kept it from running.
async fn git_run(dir: &Path, args: &[&str]) -> Result<(Spec, process::Output), String> {
    let mut argv = vec!["git".to_string()];
    argv.extend(args.iter().map(|s| s.to_string()));
    let mut spec = Spec::new(argv, dir);
    spec.deadline = Some(Instant::now() + GIT_TIMEOUT);
    // Keep the user's global git config out of the checkout's behaviour.
    spec.env.insert("GIT_CONFIG_NOSYSTEM".into(), "1".into());
    spec.env
        .insert("GIT_CONFIG_GLOBAL".into(), "/dev/null".into());
    let out = process::run(&spec, &Redactor::new())
        .await
        .map_err(|e| e.to_string())?;
    Ok((spec, out))
}

/// Run the git CLI in `dir` and return its stdout; the error is git's stderr.
/// The note, in a checkout's `.git/`, of the directories its sparse
/// checkout holds (none: a full checkout), so a tick that changes nothing
/// runs no git to find out.
const SPARSE_NOTE: &str = "driftless-sparse";

/// Make the checkout in `dir` hold only `dirs` (git's sparse checkout, cone
/// mode: those directories and the top-level files), or everything when
/// `dirs` is empty; whether that changed anything (the tree must then be
/// reset). The note is written only once git has done it.
async fn set_sparse(dir: &Path, dirs: &[PathBuf]) -> Result<bool, String> {
    let note = dir.join(".git").join(SPARSE_NOTE);
    let want: String = dirs
        .iter()
        .map(|d| format!("{}\n", d.to_string_lossy()))
        .collect();
    let have = match std::fs::read_to_string(&note) {
        Ok(h) => h,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("{}: {}", note.display(), chain(&e))),
    };
    if have == want {
        return Ok(false);
    }
    if dirs.is_empty() {
        git_cli(dir, &["sparse-checkout", "disable"]).await?;
        std::fs::remove_file(&note).map_err(|e| format!("{}: {}", note.display(), chain(&e)))?;
    } else {
        let mut args = vec!["sparse-checkout", "set", "--cone", "--"];
        let names: Vec<String> = dirs
            .iter()
            .map(|d| d.to_string_lossy().into_owned())
            .collect();
        args.extend(names.iter().map(String::as_str));
        git_cli(dir, &args).await?;
        std::fs::write(&note, want).map_err(|e| format!("{}: {}", note.display(), chain(&e)))?;
    }
    Ok(true)
}

async fn git_cli(dir: &Path, args: &[&str]) -> Result<String, String> {
    let (spec, out) = git_run(dir, args).await?;
    if out.success() {
        Ok(out.stdout)
    } else {
        let msg = out.stderr.trim();
        Err(if msg.is_empty() {
            process::describe_exit(&spec, &out, Some(GIT_TIMEOUT))
        } else {
            msg.to_string()
        })
    }
}
