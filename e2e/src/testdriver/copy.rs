//! Copies of volume data for `--data-dir` snapshots and clones: a
//! filesystem volume's directory tree, or a block volume's sparse image.
//!
//! A block volume's image is as large as its capacity (gigabytes) but
//! mostly holes, so its copy keeps the holes: only the data ranges
//! (`SEEK_DATA`/`SEEK_HOLE`) are copied, and the copy is sized like the
//! source. A directory tree keeps modes, owners and symlinks (a pod's
//! fsGroup and file modes must survive a restore); other special files
//! (sockets, FIFOs, devices) are not volume data and are skipped.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// Copies the regular file `src` to a new file `dst` (it must not exist),
/// keeping its holes, size and mode.
pub fn copy_sparse(src: &Path, dst: &Path) -> io::Result<()> {
    let mut from = File::open(src)?;
    let meta = from.metadata()?;
    let len = meta.len();
    let mut to = OpenOptions::new().write(true).create_new(true).open(dst)?;
    let mut offset: u64 = 0;
    let mut buf = vec![0u8; 1 << 20];
    while offset < len {
        let Some(start) = seek(&from, offset, libc::SEEK_DATA)? else {
            break; // only a hole is left
        };
        let end = seek(&from, start, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
        from.seek(SeekFrom::Start(start))?;
        to.seek(SeekFrom::Start(start))?;
        let mut left = end - start;
        while left > 0 {
            let want = usize::try_from(left.min(buf.len() as u64)).unwrap_or(buf.len());
            let n = from.read(&mut buf[..want])?;
            if n == 0 {
                break;
            }
            to.write_all(&buf[..n])?;
            left -= n as u64;
        }
        offset = end;
    }
    to.set_len(len)?;
    to.set_permissions(std::fs::Permissions::from_mode(meta.mode() & 0o7777))?;
    to.sync_all()
}

/// `lseek(fd, offset, whence)`; `None` when there is no more data (ENXIO).
fn seek(f: &File, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    let off = libc::off_t::try_from(offset).map_err(|_| io::Error::other("offset too large"))?;
    // SAFETY: lseek on an fd we own; no memory is passed.
    let r = unsafe { libc::lseek(f.as_raw_fd(), off, whence) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENXIO) {
            return Ok(None);
        }
        return Err(e);
    }
    Ok(Some(r as u64))
}

/// Copies the contents of the directory `src` into the existing directory
/// `dst`, recursively, keeping modes, owners and symlinks. `dst` itself
/// takes `src`'s mode and owner.
pub fn copy_tree(src: &Path, dst: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(src)? {
        let entry = entry?;
        let from = entry.path();
        let to = dst.join(entry.file_name());
        let meta = std::fs::symlink_metadata(&from)?;
        let kind = meta.file_type();
        if kind.is_dir() {
            std::fs::create_dir(&to)?;
            copy_tree(&from, &to)?;
        } else if kind.is_file() {
            copy_sparse(&from, &to)?;
            chown(&to, &meta)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)?;
            lchown(&to, &meta)?;
        }
    }
    let meta = std::fs::metadata(src)?;
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(meta.mode() & 0o7777))?;
    chown(dst, &meta)
}

fn chown(path: &Path, meta: &std::fs::Metadata) -> io::Result<()> {
    std::os::unix::fs::chown(path, Some(meta.uid()), Some(meta.gid()))
}

fn lchown(path: &Path, meta: &std::fs::Metadata) -> io::Result<()> {
    std::os::unix::fs::lchown(path, Some(meta.uid()), Some(meta.gid()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sparse_copy_keeps_data_size_and_holes() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("a.img");
        let mut f = File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        f.seek(SeekFrom::Start(10 << 20)).unwrap();
        f.write_all(b"hello").unwrap();
        f.seek(SeekFrom::Start(40 << 20)).unwrap();
        f.write_all(b"world").unwrap();
        f.sync_all().unwrap();
        let dst = dir.path().join("b.img");
        copy_sparse(&src, &dst).unwrap();
        assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
        let blocks = std::fs::metadata(&dst).unwrap().blocks();
        assert!(
            blocks * 512 < 8 << 20,
            "{blocks} blocks: the holes were filled"
        );
    }

    #[test]
    fn a_tree_copy_keeps_files_dirs_modes_and_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let (src, dst) = (dir.path().join("s"), dir.path().join("d"));
        std::fs::create_dir_all(src.join("sub")).unwrap();
        std::fs::create_dir(&dst).unwrap();
        std::fs::write(src.join("sub/f"), "data").unwrap();
        std::fs::set_permissions(src.join("sub/f"), std::fs::Permissions::from_mode(0o640))
            .unwrap();
        std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o2775)).unwrap();
        std::os::unix::fs::symlink("sub/f", src.join("link")).unwrap();
        copy_tree(&src, &dst).unwrap();
        assert_eq!(std::fs::read_to_string(dst.join("sub/f")).unwrap(), "data");
        assert_eq!(std::fs::read_to_string(dst.join("link")).unwrap(), "data");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(mode(&dst.join("sub/f")), 0o640);
        assert_eq!(mode(&dst), 0o2775);
        assert_eq!(
            std::fs::read_link(dst.join("link")).unwrap(),
            Path::new("sub/f")
        );
    }
}
