//! Paths a repository controls: where they really lead.
//!
//! A repository may commit symlinks to anywhere; every path driftless or a
//! backend reads or writes on the repository's behalf is checked here
//! against the checkout it must stay in. Pure file-system reads: no git, no
//! writes. Also how a path written in the config resolves against the
//! config file's directory.

use std::path::{Component, Path, PathBuf};

/// Relative paths in the config are relative to the config file's directory.
pub fn resolve(base: &Path, raw: &str) -> PathBuf {
    let p = Path::new(raw);
    let joined = if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    };
    // Fold `.` and `..` so paths read well in logs and errors.
    let mut out = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push(c);
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// Where `path` really leads, when that is outside `root` (symlinks
/// resolved, dangling ones included); `None` when it stays inside or does not
/// exist.
pub fn leads_outside(root: &Path, path: &Path) -> Option<PathBuf> {
    let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    // The deepest part of `path` that exists (a dangling symlink counts).
    let mut existing = path.to_path_buf();
    let mut rest = Vec::new();
    while std::fs::symlink_metadata(&existing).is_err() {
        let name = existing.file_name()?.to_os_string();
        rest.push(name);
        if !existing.pop() {
            return None;
        }
    }
    let resolved = match existing.canonicalize() {
        Ok(c) => c,
        // A dangling symlink: where it points.
        Err(_) => {
            let target = std::fs::read_link(&existing).ok()?;
            let joined = if target.is_absolute() {
                target
            } else {
                existing.parent()?.join(target)
            };
            let mut clean = PathBuf::new();
            for c in joined.components() {
                match c {
                    Component::ParentDir => {
                        clean.pop();
                    }
                    Component::CurDir => {}
                    other => clean.push(other),
                }
            }
            clean
        }
    };
    let full = rest.iter().rev().fold(resolved, |p, n| p.join(n));
    (!full.starts_with(&root)).then_some(full)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_out_of_the_root_are_caught_dangling_or_not() {
        let d = tempfile::tempdir().expect("tempdir");
        let root = d.path().join("checkout");
        std::fs::create_dir_all(root.join("app/sub")).expect("mkdir");
        std::fs::write(root.join("app/sub/f"), "x").expect("write");
        let link = |name: &str, to: &Path| {
            std::os::unix::fs::symlink(to, root.join(name)).expect("symlink")
        };
        link("app/etc", Path::new("/etc"));
        link("app/gone", Path::new("/nonexistent/place"));
        link("app/up", Path::new("../../outside"));
        link("app/fine", Path::new("sub/f"));
        assert_eq!(leads_outside(&root, &root.join("app/sub/f")), None);
        assert_eq!(leads_outside(&root, &root.join("app/fine")), None);
        assert_eq!(leads_outside(&root, &root.join("app/not-there")), None);
        assert_eq!(
            leads_outside(&root, &root.join("app/etc/passwd")),
            Some(PathBuf::from("/etc/passwd"))
        );
        assert_eq!(
            leads_outside(&root, &root.join("app/gone")),
            Some(PathBuf::from("/nonexistent/place"))
        );
        assert_eq!(
            leads_outside(&root, &root.join("app/gone/deeper")),
            Some(PathBuf::from("/nonexistent/place/deeper"))
        );
        assert!(leads_outside(&root, &root.join("app/up")).is_some());
    }
}
