//! Where the ACME account and the certificates are kept: a directory (`[tls.acme]
//! storage`), or in fleet mode the store under `PREFIX/acme/` (`store/acme.rs`), which
//! also holds the one orderer's lock and the challenge answers every instance gives.
//! The task that orders sees only this interface.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::PathBuf;

use futures_util::future::BoxFuture;

/// The right to order, held until dropped.
pub(crate) type Lock = Box<dyn Send + Sync>;

/// A challenge answer for the other instances of a fleet to give too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// `http-01`: the token and its key authorization.
    Http {
        token: String,
        key_authorization: String,
    },
    /// `tls-alpn-01`: the name and its challenge certificate and key, PEM.
    Alpn {
        name: String,
        cert: String,
        key: String,
    },
}

/// What an ACME task keeps: small named values (`account.json`, `certs/NAME.crt`,
/// `certs/NAME.key`), some of them secret; and, shared with other instances, the right
/// to order and the answers to the CA.
pub(crate) trait Storage: Send + Sync {
    /// The value of `name`, `None` when there is none.
    fn get<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, String>>;
    /// Keeps `value` as `name`, replacing what was there.
    fn put<'a>(&'a self, name: &'a str, value: Vec<u8>) -> BoxFuture<'a, Result<(), String>>;
    /// The right to order; `None` while another instance holds it.
    fn lock(&self) -> BoxFuture<'_, Result<Option<Lock>, String>>;
    /// Has every other instance give `answer` too, until the lock is dropped.
    fn publish(&self, answer: Answer) -> BoxFuture<'_, Result<(), String>>;
    /// Ticks when another instance stored a certificate; `None` when none can.
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>>;
}

/// A directory: 0700, each value a 0600 file written whole and renamed into place, so
/// a crash leaves the old value or the new one.
#[derive(Debug)]
pub(crate) struct Disk {
    dir: PathBuf,
}

impl Disk {
    /// Makes `dir` (0700) if it is missing, and makes it 0700 if it is not.
    pub(crate) fn open(dir: PathBuf) -> Result<Disk, String> {
        use std::os::unix::fs::PermissionsExt as _;
        make_dir(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("cannot make '{}' private (0700): {e}", dir.display()))?;
        Ok(Disk { dir })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

fn make_dir(dir: &std::path::Path) -> Result<(), String> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot make '{}': {e}", dir.display()))
}

impl Storage for Disk {
    fn get<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, String>> {
        Box::pin(async move {
            let path = self.path(name);
            let read = tokio::task::spawn_blocking({
                let path = path.clone();
                move || std::fs::read(path)
            });
            let read = read
                .await
                .map_err(|e| format!("the read was cancelled: {e}"))?;
            match read {
                Ok(v) => Ok(Some(v)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(format!("cannot read '{}': {e}", path.display())),
            }
        })
    }

    fn put<'a>(&'a self, name: &'a str, value: Vec<u8>) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let path = self.path(name);
            tokio::task::spawn_blocking(move || write_private(&path, &value))
                .await
                .map_err(|e| format!("the write was cancelled: {e}"))?
        })
    }

    /// One process orders alone.
    fn lock(&self) -> BoxFuture<'_, Result<Option<Lock>, String>> {
        Box::pin(async { Ok(Some(Box::new(()) as Lock)) })
    }

    /// Nobody else answers.
    fn publish(&self, _answer: Answer) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }

    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}

/// Writes `value` to a 0600 file beside `path`, syncs it, and renames it over `path`.
fn write_private(path: &std::path::Path, value: &[u8]) -> Result<(), String> {
    let shown = path.display();
    if let Some(parent) = path.parent() {
        make_dir(parent)?;
    }
    // A name of this process's own: a successor during an upgrade writes beside it.
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(value)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| format!("cannot write '{shown}': {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[tokio::test]
    async fn values_are_private_files_in_a_private_directory() {
        let dir = std::env::temp_dir().join(format!("fulcrum-acme-disk-{}", std::process::id()));
        let disk = Disk::open(dir.join("acme")).unwrap();
        assert_eq!(disk.get("account.json").await.unwrap(), None);
        disk.put("certs/a.test.key", b"secret".to_vec())
            .await
            .unwrap();
        disk.put("certs/a.test.key", b"newer".to_vec())
            .await
            .unwrap();
        assert_eq!(
            disk.get("certs/a.test.key").await.unwrap().unwrap(),
            b"newer"
        );
        let mode = |p: PathBuf| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(dir.join("acme")), 0o700);
        assert_eq!(mode(dir.join("acme/certs")), 0o700);
        assert_eq!(mode(dir.join("acme/certs/a.test.key")), 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
