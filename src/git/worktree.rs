//! Whether a checkout is already exactly at a commit, told without running
//! git: the cheap path of a tick that has nothing to do.
//!
//! After each `git reset --hard <sha>` the checkout's `.git/` gets a mark:
//! the commit, and the checksum of the index that reset wrote. A later sync
//! to the same commit may skip the reset only when HEAD is that commit, the
//! index is still the one the reset wrote (so nobody ran `git add`, `git
//! checkout` or another reset in there), and every tracked file's `lstat`
//! agrees with the stat data the index holds for it — size, whole-second
//! mtime and ctime, inode, owner and type (git's own test for "this file
//! may have changed", `ie_match_stat`). ctime is set by the kernel on every
//! write, chmod or rename and cannot be put back by hand, so an edit is
//! seen even when its size and mtime are restored. An entry written in the
//! same second as the index ("racily clean", as git calls it) proves
//! nothing and sends the sync down the slow path, as does anything this
//! module does not understand (a conflict, a submodule, a flag driftless
//! never sets). An entry outside a sparse checkout's directories
//! (skip-worktree) is not in the working tree, and a reset leaves it so:
//! it is not looked at. This module only reads and answers; it never changes a
//! checkout, and its mistakes can only ever cost a reset, never skip one
//! that was needed, as long as it answers `false` when unsure.

use std::path::Path;

use gix::index::entry::{Flags, Mode, Stage, Stat, stat};

/// The mark's file name, inside the checkout's `.git/`.
const MARK: &str = "driftless-synced";

/// The checkout in `dir` is exactly at `sha`, tracked files unchanged since
/// the reset that put it there. `false` whenever that cannot be shown.
pub(super) fn already_at(dir: &Path, sha: &str) -> bool {
    let git_dir = dir.join(".git");
    let Ok(mark) = std::fs::read_to_string(git_dir.join(MARK)) else {
        return false;
    };
    let Some((marked_sha, marked_index)) = mark.trim().split_once(' ') else {
        return false;
    };
    if marked_sha != sha {
        return false;
    }
    if head(&git_dir).as_deref() != Some(sha) {
        return false;
    }
    let Some(index) = read_index(&git_dir) else {
        return false;
    };
    if index.checksum().map(|c| c.to_hex().to_string()).as_deref() != Some(marked_index) {
        return false;
    }
    let checked_from = std::time::SystemTime::now();
    match tracked_files_unchanged(dir, &index) {
        Checked::Changed => false,
        Checked::Unchanged => true,
        Checked::UnchangedByContent => {
            // What git does after settling racily clean entries by their
            // content: the index's time moves to when the check began, so
            // the next check trusts their stat data (a file written since
            // then is racy again, and read again).
            let moved = std::fs::File::options()
                .write(true)
                .open(git_dir.join("index"))
                .and_then(|f| f.set_modified(checked_from));
            if let Err(error) = moved {
                tracing::debug!(checkout = %dir.display(), %error, "cannot move the index's time");
            }
            true
        }
    }
}

/// What the tracked files of a checkout were found to be.
enum Checked {
    /// Something may have changed: reset.
    Changed,
    /// Unchanged, by their stat data alone.
    Unchanged,
    /// Unchanged, racily clean entries among them settled by content.
    UnchangedByContent,
}

/// The commit HEAD names, read from the refs alone (HEAD, then the branch
/// it points to): no configuration and no object database are opened.
fn head(git_dir: &Path) -> Option<String> {
    let refs = gix::refs::file::Store::at(git_dir.to_path_buf(), gix::hash::Kind::Sha1);
    let mut name = "HEAD".to_string();
    // HEAD -> refs/heads/<branch> -> a commit; a chain longer than a few
    // links is not what a reset leaves.
    for _ in 0..5 {
        let found = refs.try_find(name.as_str()).ok()??;
        match found.target {
            gix::refs::Target::Object(id) => return Some(id.to_hex().to_string()),
            gix::refs::Target::Symbolic(to) => name = to.as_bstr().to_string(),
        }
    }
    None
}

/// Forget the mark: called before a reset, so a reset cut short (a kill)
/// never leaves a mark behind for a checkout it half moved.
pub(super) fn forget(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(dir.join(".git").join(MARK)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Mark the checkout as reset to `sha` with the index as it is now. A mark
/// that cannot be written only costs the next sync a reset.
pub(super) fn mark(dir: &Path, sha: &str) {
    let git_dir = dir.join(".git");
    let Some(checksum) = read_index(&git_dir).and_then(|i| i.checksum()) else {
        tracing::debug!(checkout = %dir.display(), "no index checksum to mark the checkout with");
        return;
    };
    let tmp = git_dir.join(format!("{MARK}.tmp"));
    let written = std::fs::write(&tmp, format!("{sha} {}\n", checksum.to_hex()))
        .and_then(|()| std::fs::rename(&tmp, git_dir.join(MARK)));
    if let Err(error) = written {
        tracing::debug!(checkout = %dir.display(), %error, "cannot mark the checkout as synced");
    }
}

/// Drop from a sparse checkout's index the entries outside its directories
/// (skip-worktree). git keeps one for every file of the whole tree, so on a
/// monorepo the index is most of a sparse checkout's disk, times every
/// target. The next `git reset --hard` puts back what it needs: an entry the
/// index lacks is a file it writes when it is inside the directories, and
/// marks skip-worktree (dropped again here) when outside. The cache-tree
/// extension no longer describes the index and goes too.
pub(super) fn drop_skipped(dir: &Path) -> Result<(), String> {
    let git_dir = dir.join(".git");
    let path = git_dir.join("index");
    let mut index = gix::index::File::at(&path, gix::hash::Kind::Sha1, false, Default::default())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let before = index.entries().len();
    index.remove_entries(|_, _, e| {
        e.flags.contains(Flags::SKIP_WORKTREE) && e.stage() == Stage::Unconflicted
    });
    if index.entries().len() == before {
        return Ok(());
    }
    index.remove_tree();
    index
        .write(gix::index::write::Options::default())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(())
}

fn read_index(git_dir: &Path) -> Option<gix::index::File> {
    // The checksum is verified over the whole file as it is read.
    gix::index::File::at(
        git_dir.join("index"),
        gix::hash::Kind::Sha1,
        false,
        Default::default(),
    )
    .ok()
}

/// The most file content one check reads to settle racily clean entries;
/// past it, the reset (which leaves an index that is not racy) is cheaper.
const RACY_READ_MAX: u64 = 1 << 20;

/// Every entry of `index` is a plain file or symlink whose `lstat` matches
/// the stat data the index holds; a racily clean one (written in the same
/// second as the index, where whole-second times prove nothing) also has
/// the content its blob id says, as git checks it.
fn tracked_files_unchanged(dir: &Path, index: &gix::index::File) -> Checked {
    // git's defaults on Linux (core.checkStat = default, no nanoseconds,
    // no device numbers), with the ctime trusted.
    let options = stat::Options::default();
    let written = index.timestamp();
    let mut racy_budget = RACY_READ_MAX;
    let mut by_content = false;
    // Each file is looked up from the checkout's directory, not from the
    // root: resolving the state directory's path again for every tracked
    // file was most of a no-op tick's checkout check.
    let Ok(root) = rustix::fs::open(
        dir,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) else {
        return Checked::Changed;
    };
    for entry in index.entries() {
        // Outside a sparse checkout's directories: not in the working tree,
        // and left alone by a reset too.
        if entry.flags.contains(Flags::SKIP_WORKTREE) && entry.stage() == Stage::Unconflicted {
            continue;
        }
        if entry.stage() != Stage::Unconflicted
            || entry
                .flags
                .intersects(Flags::ASSUME_VALID | Flags::INTENT_TO_ADD)
        {
            return Checked::Changed;
        }
        let rel: &[u8] = entry.path(index);
        let Some(found) = lstat_at(&root, rel) else {
            return Checked::Changed;
        };
        let kind_matches = match entry.mode {
            Mode::FILE => found.kind == Kind::File,
            Mode::FILE_EXECUTABLE => found.kind == Kind::Executable,
            Mode::SYMLINK => found.kind == Kind::Symlink,
            // submodules, and anything else: not this module's to judge
            _ => false,
        };
        if !kind_matches || !entry.stat.matches(&found.stat, options) {
            return Checked::Changed;
        }
        if entry.stat.is_racy(written, options) {
            if found.len > racy_budget {
                return Checked::Changed;
            }
            racy_budget -= found.len;
            by_content = true;
            let Ok(rel) = gix::path::from_bstr(entry.path(index)) else {
                return Checked::Changed;
            };
            let path = dir.join(rel);
            let content = if entry.mode == Mode::SYMLINK {
                std::fs::read_link(&path).map(|to| to.into_os_string().into_encoded_bytes())
            } else {
                std::fs::read(&path)
            };
            let Ok(content) = content else {
                return Checked::Changed;
            };
            match gix::objs::compute_hash(gix::hash::Kind::Sha1, gix::objs::Kind::Blob, &content) {
                Ok(id) if id == entry.id => {}
                _ => return Checked::Changed,
            }
        }
    }
    if by_content {
        Checked::UnchangedByContent
    } else {
        Checked::Unchanged
    }
}

/// What a tracked path is in the working tree, as the index's checks see
/// it.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Kind {
    File,
    /// A plain file its owner may run (git's one executable bit).
    Executable,
    Symlink,
    /// A directory, a device, a socket: never what a reset leaves.
    Other,
}

/// One tracked path's `lstat`, in the index's terms.
#[derive(Debug)]
struct Found {
    kind: Kind,
    stat: Stat,
    len: u64,
}

/// `lstat` of `rel` (an index path: relative, `/`-separated) under the
/// directory `root`, the last component not followed, converted as
/// `gix::index::entry::Stat::from_fs` converts it (times before 1970 or
/// out of range as zero; device, inode and size cut to 32 bits, as git
/// does). None when it cannot be read or `rel` is not relative.
fn lstat_at(root: &std::os::fd::OwnedFd, rel: &[u8]) -> Option<Found> {
    if rel.first() == Some(&b'/') {
        return None;
    }
    let st = rustix::fs::statat(root, rel, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).ok()?;
    let time = |secs: i64, nsecs: u64| match (u64::try_from(secs), u32::try_from(nsecs)) {
        (Ok(secs), Ok(nsecs)) if nsecs < 1_000_000_000 => stat::Time {
            secs: secs as u32,
            nsecs,
        },
        _ => stat::Time::default(),
    };
    let mode = st.st_mode;
    let kind = match rustix::fs::FileType::from_raw_mode(mode) {
        rustix::fs::FileType::RegularFile if mode & 0o100 != 0 => Kind::Executable,
        rustix::fs::FileType::RegularFile => Kind::File,
        rustix::fs::FileType::Symlink => Kind::Symlink,
        _ => Kind::Other,
    };
    #[allow(clippy::unnecessary_cast)] // the field types differ between targets
    Some(Found {
        kind,
        stat: Stat {
            mtime: time(st.st_mtime as i64, st.st_mtime_nsec as u64),
            ctime: time(st.st_ctime as i64, st.st_ctime_nsec as u64),
            dev: st.st_dev as u32,
            ino: st.st_ino as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            size: st.st_size as u32,
        },
        len: st.st_size as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.net")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.net")
            .output()
            .expect("git runs");
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A checkout reset to a commit and marked, its index no longer racy
    /// (written a second after its files).
    fn marked_checkout() -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        git(d, &["init", "-q", "."]);
        std::fs::create_dir_all(d.join("site")).expect("mkdir");
        std::fs::write(d.join("site/index.html"), "v1").expect("write");
        std::fs::write(d.join("run.sh"), "#!/bin/sh\n").expect("write");
        std::os::unix::fs::symlink("site/index.html", d.join("link")).expect("symlink");
        git(d, &["add", "-A"]);
        git(d, &["commit", "-qm", "one"]);
        let sha = git(d, &["rev-parse", "HEAD"]);
        std::thread::sleep(std::time::Duration::from_millis(1100));
        git(d, &["reset", "-q", "--hard", &sha]);
        mark(d, &sha);
        (dir, sha)
    }

    /// A path stat'ed from the checkout's directory reads as gix reads it
    /// from the root, for every kind of tracked path, and a path that
    /// leaves the directory is refused.
    #[test]
    fn a_path_looked_up_from_the_checkout_reads_as_gix_reads_it() {
        let (dir, _) = marked_checkout();
        let d = dir.path();
        let root = rustix::fs::open(
            d,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .expect("open");
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(d.join("tool"), "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(d.join("tool"), std::fs::Permissions::from_mode(0o744))
            .expect("chmod");
        // mtime, ctime and size all different, so a field read for another
        // is seen.
        std::fs::File::options()
            .write(true)
            .open(d.join("tool"))
            .and_then(|f| {
                f.set_modified(
                    std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000),
                )
            })
            .expect("set mtime");
        for (rel, kind) in [
            ("site/index.html", Kind::File),
            ("run.sh", Kind::File),
            ("tool", Kind::Executable),
            ("link", Kind::Symlink),
            ("site", Kind::Other),
        ] {
            let found = lstat_at(&root, rel.as_bytes()).expect(rel);
            let gix = gix::index::fs::Metadata::from_path_no_follow(&d.join(rel)).expect(rel);
            assert_eq!(found.kind, kind, "{rel}");
            assert_eq!(found.stat, Stat::from_fs(&gix).expect(rel), "{rel}");
            assert_eq!(found.len, gix.len(), "{rel}");
        }
        assert!(lstat_at(&root, b"missing").is_none());
        let abs = d.join("run.sh");
        assert!(lstat_at(&root, abs.as_os_str().as_encoded_bytes()).is_none());
    }

    #[test]
    fn a_marked_checkout_at_its_commit_is_already_there() {
        let (dir, sha) = marked_checkout();
        assert!(already_at(dir.path(), &sha));
        assert!(!already_at(dir.path(), &"0".repeat(40)), "another commit");
    }

    /// Every way a person changes tracked files sends the sync down the
    /// slow path: an edit with size and mtime put back, a deletion, a
    /// chmod, a file made a directory, a `git add`, a forgotten mark.
    #[test]
    fn any_change_to_tracked_files_is_seen() {
        type Change = fn(&Path);
        let changes: [(&str, Change); 7] = [
            ("edit, same size, mtime put back", |d| {
                let f = d.join("site/index.html");
                let before = std::fs::metadata(&f)
                    .expect("meta")
                    .modified()
                    .expect("mtime");
                std::fs::write(&f, "v2").expect("write");
                std::fs::File::options()
                    .write(true)
                    .open(&f)
                    .and_then(|f| f.set_modified(before))
                    .expect("set mtime");
            }),
            ("delete", |d| {
                std::fs::remove_file(d.join("run.sh")).expect("rm")
            }),
            ("chmod +x", |d| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(d.join("run.sh"), std::fs::Permissions::from_mode(0o755))
                    .expect("chmod")
            }),
            ("file made a directory", |d| {
                std::fs::remove_file(d.join("run.sh")).expect("rm");
                std::fs::create_dir(d.join("run.sh")).expect("mkdir");
            }),
            ("symlink retargeted", |d| {
                std::fs::remove_file(d.join("link")).expect("rm");
                std::os::unix::fs::symlink("run.sh", d.join("link")).expect("symlink");
            }),
            ("git add of an edit", |d| {
                std::fs::write(d.join("site/index.html"), "v3").expect("write");
                git(d, &["add", "site/index.html"]);
            }),
            ("mark forgotten", |d| forget(d).expect("forget")),
        ];
        for (what, change) in changes {
            let (dir, sha) = marked_checkout();
            change(dir.path());
            assert!(!already_at(dir.path(), &sha), "{what}: not seen");
        }
    }

    /// Files written in the same second as the index: their whole-second
    /// times prove nothing, so their content decides (as git does). An
    /// in-place edit of the same size within that second keeps every
    /// stat field and is still seen.
    #[test]
    fn a_racily_clean_checkout_is_judged_by_its_content() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        git(d, &["init", "-q", "."]);
        std::fs::write(d.join("a"), "1").expect("write");
        git(d, &["add", "a"]);
        git(d, &["commit", "-qm", "one"]);
        let sha = git(d, &["rev-parse", "HEAD"]);
        let secs = |p: &Path| {
            std::fs::metadata(p)
                .expect("meta")
                .modified()
                .expect("mtime")
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_secs()
        };
        // Each attempt starts just after a second begins, and its reset
        // writes the file anew (a reset leaves an unchanged file alone: its
        // time would stay in the second it was first written, and every
        // attempt after a slow first one would find nothing racy), so the
        // reset, the check and the edit fall in one second even on a
        // loaded machine.
        let next_second = || {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970");
            std::thread::sleep(std::time::Duration::from_millis(1005).saturating_sub(
                std::time::Duration::from_nanos(u64::from(now.subsec_nanos())),
            ));
        };
        let mut judged = false;
        for _ in 0..20 {
            next_second();
            std::fs::remove_file(d.join("a")).expect("rm");
            git(d, &["reset", "-q", "--hard", &sha]);
            mark(d, &sha);
            if secs(&d.join("a")) != secs(&d.join(".git/index")) {
                continue; // not racy after all: try again
            }
            let index_time = || {
                std::fs::metadata(d.join(".git/index"))
                    .expect("meta")
                    .modified()
                    .expect("mtime")
            };
            let before = index_time();
            assert!(already_at(d, &sha), "racily clean and unchanged");
            assert!(index_time() > before, "the index's time did not move on");
            std::fs::OpenOptions::new()
                .write(true)
                .open(d.join("a"))
                .and_then(|mut f| std::io::Write::write_all(&mut f, b"2"))
                .expect("edit in place");
            if secs(&d.join("a")) != secs(&d.join(".git/index")) {
                continue; // the edit fell in the next second
            }
            assert!(!already_at(d, &sha), "an edit in the index's second");
            judged = true;
            break;
        }
        assert!(judged, "never managed an edit within the index's second");
    }
}
