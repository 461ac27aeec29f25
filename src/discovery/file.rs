//! The file source (`docs/discovery.md`, "A watched file"): a JSON list of backends,
//! read again when inotify (through `notify`) says it changed — the directory is
//! watched, so a file renamed over the old one is seen as well as a write in place —
//! and every `interval` in case a change went unseen (a network file system).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::Notify;

use crate::config::{BackendEntry, BackendSpec};

/// Changes closer together than this are read once: an editor's save is several.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// The largest file read: a list of ten thousand backends fits many times over.
const MAX_FILE: u64 = 16 << 20;

/// [`read`] on a thread of its own: a file on a hung network mount must not stall the
/// admin API and the health checks that share this runtime (and a stop does not wait
/// for it: the runtime's end gives up on it, `server.rs`).
pub(super) async fn read_off_runtime(
    path: &Path,
    max_backends: usize,
) -> Result<Vec<BackendSpec>, String> {
    let p = path.to_path_buf();
    (tokio::task::spawn_blocking(move || read(&p, max_backends)).await)
        .unwrap_or_else(|e| Err(format!("cannot read {}: {e}", path.display())))
}

/// Reads the backends of `path`: all of them, or an error that says why. An empty
/// list is an error too: a file being replaced can be read empty, and a failure never
/// empties a pool; so is a list of more than `max_backends`, counted before any entry
/// is built.
pub(super) fn read(path: &Path, max_backends: usize) -> Result<Vec<BackendSpec>, String> {
    let shown = path.display();
    let text = read_regular(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let count = serde_json::from_slice::<Vec<serde::de::IgnoredAny>>(&text)
        .map_err(|e| format!("{shown}: not a JSON list of backends ({e})"))?
        .len();
    if count > max_backends {
        return Err(format!(
            "{shown}: {count} backends, over the pool's max_backends ({max_backends})"
        ));
    }
    let list: Vec<serde_json::Value> = serde_json::from_slice(&text)
        .map_err(|e| format!("{shown}: not a JSON list of backends ({e})"))?;
    if list.is_empty() {
        return Err(format!(
            "{shown}: an empty list (a failure never empties a pool; to send a pool nothing, take its routes away)"
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, v) in list.into_iter().enumerate() {
        let entry: BackendEntry =
            serde_json::from_value(v).map_err(|e| format!("{shown}: entry {i}: {e}"))?;
        out.push((entry.spec()).map_err(|e| format!("{shown}: entry {i}: {e}"))?);
    }
    if let Some(dup) = crate::config::duplicate_backends(&out).first() {
        return Err(format!("{shown}: {dup}"));
    }
    Ok(out)
}

/// The bytes of `path` when it is a regular file (after symbolic links), up to
/// [`MAX_FILE`]. A FIFO, a device or a directory is refused before it is opened, and
/// the file is opened without blocking and checked again, so one swapped in between
/// cannot hold the reader in `open()` for good.
fn read_regular(path: &Path) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let described = |e: std::io::Error| match e.raw_os_error() {
        Some(libc::ELOOP) => "a loop of symbolic links".to_string(),
        _ => e.to_string(),
    };
    if !std::fs::metadata(path).map_err(described)?.is_file() {
        return Err("not a regular file".into());
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(described)?;
    if !f.metadata().map_err(described)?.is_file() {
        return Err("not a regular file".into());
    }
    let mut text = Vec::new();
    f.take(MAX_FILE + 1)
        .read_to_end(&mut text)
        .map_err(described)?;
    if text.len() as u64 > MAX_FILE {
        return Err(format!("larger than {MAX_FILE} bytes"));
    }
    Ok(text)
}

/// A watch of a file's directory (see [`watch`]).
pub(super) struct Watch {
    /// Ends the watch when dropped.
    _watcher: RecommendedWatcher,
    /// Set when the directory itself went: this watch sees nothing more.
    pub(super) lost: Arc<AtomicBool>,
}

/// Watches `path`'s directory: `changed` hears of every event in it, not only those
/// naming the file, since a symbolic link swapped over names another entry
/// (Kubernetes' ConfigMap volumes swap `..data`); the reads after are debounced. The
/// watch lasts as long as the [`Watch`] returned.
pub(super) fn watch(path: &Path, changed: Arc<Notify>) -> Result<Watch, String> {
    let dir: PathBuf = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let lost = Arc::new(AtomicBool::new(false));
    let (gone, watched) = (Arc::clone(&lost), dir.clone());
    let mut w = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        let Ok(ev) = ev else { return };
        let removed = matches!(ev.kind, notify::EventKind::Remove(_));
        if removed && ev.paths.contains(&watched) {
            gone.store(true, Ordering::Relaxed);
        }
        changed.notify_one();
    })
    .map_err(|e| format!("cannot watch {}: {e}", dir.display()))?;
    (w.watch(&dir, RecursiveMode::NonRecursive))
        .map_err(|e| format!("cannot watch {}: {e}", dir.display()))?;
    Ok(Watch { _watcher: w, lost })
}

/// Waits for a change of the file (then lets the writer finish, [`DEBOUNCE`]) or for
/// `interval`, whichever comes first.
pub(super) async fn next_change(changed: &Notify, interval: Duration) {
    tokio::select! {
        _ = changed.notified() => tokio::time::sleep(DEBOUNCE).await,
        _ = tokio::time::sleep(interval) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_whole_or_not_at_all() {
        let dir = std::env::temp_dir().join(format!("fulcrum-disc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("b.json");
        let write = |t: &str| std::fs::write(&f, t).unwrap();
        write(
            r#"[{"url": "http://127.0.0.1:1", "weight": 3, "backup": true}, {"url": "http://127.0.0.1:2", "max_conns": 5}]"#,
        );
        let list = read(&f, 1000).unwrap();
        assert_eq!((list[0].weight, list[0].backup), (3, true));
        assert_eq!(list[1].max_conns, 5);
        for (bad, why) in [
            (r#"[{"url": "http://127.0.0.1:1"}"#, "not a JSON list"),
            (r#"[{"url": "gopher://x"}]"#, "entry 0"),
            (
                r#"[{"url": "http://127.0.0.1:1"}, {"url": "http://127.0.0.1:1"}]"#,
                "URL",
            ),
            (r#"[{"url": "http://127.0.0.1:1", "colour": 1}]"#, "colour"),
            ("", "not a JSON list"),
            ("[]", "an empty list"),
        ] {
            write(bad);
            let e = read(&f, 1000).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        write(r#"[{"url": "http://127.0.0.1:1"}, {"url": "http://127.0.0.1:2"}]"#);
        let e = read(&f, 1).unwrap_err();
        assert!(
            e.contains("2 backends, over the pool's max_backends (1)"),
            "{e}"
        );
        assert!(read(&dir.join("none.json"), 1000)
            .unwrap_err()
            .contains("cannot read"));
        let (a, b) = (dir.join("loop-a"), dir.join("loop-b"));
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();
        let e = read(&a, 1000).unwrap_err();
        assert!(e.contains("a loop of symbolic links"), "{e}");
        let e = read(&dir, 1000).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
