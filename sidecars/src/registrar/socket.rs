//! The registration socket kubelet's plugin watcher finds in
//! `<plugin-registration-path>/<driver>-reg.sock`.
//!
//! It is bound inside a fresh 0700 directory, made 0600, then renamed into
//! place: at no moment can anyone but root reach it. A stale file at the path
//! (a previous run killed with -9) is removed first.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

/// The socket's path for a driver.
pub fn socket_path(dir: &Path, driver: &str) -> PathBuf {
    dir.join(format!("{driver}-reg.sock"))
}

/// Identity of the file at `path` (device, inode), to notice a replacement.
pub fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// The private directory the socket at `path` is bound in before it is
/// moved into place: named after the socket (so after the driver), not the
/// process — every registrar is pid 1 in its container, and all share
/// kubelet's registration directory, so a pid-named one would be another
/// driver's, removed from under it. A hash keeps the name short: a unix
/// socket path must fit in sun_path (108 bytes) when bound; the rename into
/// place has no such limit.
pub fn private_dir(path: &Path) -> PathBuf {
    // FNV-1a, 64 bits: deterministic across builds, enough to tell drivers apart.
    let name = path
        .file_name()
        .map(|n| n.as_encoded_bytes())
        .unwrap_or_default();
    let hash = name.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    path.parent()
        .unwrap_or(Path::new("."))
        .join(format!(".reg-{hash:016x}"))
}

/// Binds privately at `path`; returns the listener and the socket's identity.
pub fn bind_private(path: &Path) -> std::io::Result<(UnixListener, (u64, u64))> {
    path.parent().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "socket path has no directory",
        )
    })?;
    if path.file_name().is_none() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "socket path has no file name",
        ));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} is a directory", path.display()),
            ))
        }
        Ok(_) => {
            tracing::info!(path = %path.display(), "removing stale registration socket");
            std::fs::remove_file(path)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let private = private_dir(path);
    if private.exists() {
        std::fs::remove_dir_all(&private)?;
    }
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let result = (|| {
        let tmp = private.join("s");
        let listener = std::os::unix::net::UnixListener::bind(&tmp)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&tmp, path)?;
        listener.set_nonblocking(true)?;
        Ok::<_, std::io::Error>(listener)
    })();
    let _ = std::fs::remove_dir_all(&private);
    let listener = UnixListener::from_std(result?)?;
    let id = identity(path).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotFound, "socket vanished after bind")
    })?;
    Ok((listener, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn binds_private_replaces_stale_and_is_connectable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = socket_path(dir.path(), "hostpath.csi.k8s.io");
        assert!(path.ends_with("hostpath.csi.k8s.io-reg.sock"));
        std::fs::write(&path, b"stale").expect("stale file");
        let (listener, id) = bind_private(&path).expect("binds");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(identity(&path), Some(id));
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .expect("read dir")
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect();
        assert_eq!(leftovers.len(), 1, "only the socket remains: {leftovers:?}");
        let client = tokio::net::UnixStream::connect(&path);
        let (accepted, connected) = tokio::join!(listener.accept(), client);
        assert!(accepted.is_ok() && connected.is_ok());
    }

    #[test]
    fn refuses_to_replace_a_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("d-reg.sock");
        std::fs::create_dir(&path).expect("dir");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt");
        let err = rt
            .block_on(async { bind_private(&path).map(|_| ()) })
            .expect_err("refused");
        assert!(err.to_string().contains("is a directory"));
    }

    #[tokio::test]
    async fn two_drivers_binding_at_once_never_share_a_private_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = socket_path(dir.path(), "a.csi.example.com");
        let b = socket_path(dir.path(), "b.csi.example.com");
        assert_ne!(private_dir(&a), private_dir(&b));
        assert_eq!(private_dir(&a), private_dir(&a.clone()), "stable");
        // b is midway through its bind (its private directory holds its
        // socket) when a binds: a leaves it alone.
        std::fs::create_dir(private_dir(&b)).expect("b's dir");
        std::fs::write(private_dir(&b).join("s"), "").expect("b's socket");
        let (_listener, _) = bind_private(&a).expect("a binds");
        assert!(a.exists());
        assert!(
            private_dir(&b).join("s").exists(),
            "b's bind was not disturbed"
        );
        assert!(!private_dir(&a).exists(), "a cleaned up its own");
        // Short enough for sun_path with the longest driver name in the
        // kubelet's default directory.
        let long = socket_path(
            Path::new("/var/lib/kubelet/plugins_registry"),
            &"d".repeat(63),
        );
        assert!(private_dir(&long).join("s").as_os_str().len() < 108);
    }
}
