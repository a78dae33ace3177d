//! Real bind mounts for `csi-test-driver --data-dir`: what a hostpath-style
//! driver does on a node, so that kubelet, the container runtime and a pod
//! see a real volume.
//!
//! - A filesystem volume is the directory `<data-dir>/<volume-id>`;
//!   NodeStageVolume bind-mounts it on the staging path and
//!   NodePublishVolume bind-mounts the staging path on the target.
//! - A block volume is the file `<data-dir>/<volume-id>.img` behind a loop
//!   device; NodePublishVolume bind-mounts the loop device on a file at the
//!   target (a container runtime only passes device nodes into a container).
//!
//! Every operation is idempotent: kubelet retries after a timeout or a
//! driver restart, and a second mount over a mounted path would stack.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// The mount points listed in `/proc/self/mountinfo` text (field 5, with the
/// kernel's octal escapes of space, tab, newline and backslash undone).
pub fn mount_points(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape_octal(field)))
        .collect()
}

fn unescape_octal(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            let digits = &bytes[i + 1..(i + 4).min(bytes.len())];
            if digits.len() == 3 && digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let v = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(b) = u8::try_from(v) {
                    out.push(b);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `path` is a mount point in this process's mount namespace.
pub fn is_mount_point(path: &Path) -> io::Result<bool> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(mount_points(&text).iter().any(|p| p == path))
}

fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn mount_syscall(src: Option<&Path>, target: &Path, flags: libc::c_ulong) -> io::Result<()> {
    let target_c = cstring(target)?;
    let src_c = src.map(cstring).transpose()?;
    let none = CString::new("none").map_err(|_| io::Error::other("CString"))?;
    // SAFETY: every pointer is a valid NUL-terminated string for the call.
    let r = unsafe {
        libc::mount(
            src_c.as_ref().map_or(none.as_ptr(), |s| s.as_ptr()),
            target_c.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Bind-mounts `src` on `target` unless `target` is already a mount point;
/// read-only binds are remounted read-only (a bind ignores `MS_RDONLY`).
pub fn bind(src: &Path, target: &Path, readonly: bool) -> io::Result<()> {
    if is_mount_point(target)? {
        return Ok(());
    }
    mount_syscall(Some(src), target, libc::MS_BIND)?;
    if readonly {
        let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
        if let Err(e) = mount_syscall(None, target, flags) {
            // Never leave a writable mount where a read-only one was asked.
            let _ = unmount(target);
            return Err(e);
        }
    }
    Ok(())
}

/// Unmounts `target` if it is a mount point (every stacked mount).
pub fn unmount(target: &Path) -> io::Result<()> {
    let c = cstring(target)?;
    while is_mount_point(target)? {
        // SAFETY: a valid NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Removes a target path kubelet handed us once nothing is mounted there:
/// an empty directory or a plain file, never anything recursively (a failed
/// unmount must not turn into deleting the volume's data).
pub fn remove_target(target: &Path) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(target) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if meta.is_dir() {
        std::fs::remove_dir(target)
    } else {
        std::fs::remove_file(target)
    }
}

// Loop device ioctls (linux/loop.h).
const LOOP_SET_FD: libc::c_ulong = 0x4C00;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LO_NAME_SIZE: usize = 64;

/// `struct loop_info64`.
#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; LO_NAME_SIZE],
    crypt_name: [u8; LO_NAME_SIZE],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

fn zeroed_info() -> LoopInfo64 {
    LoopInfo64 {
        device: 0,
        inode: 0,
        rdevice: 0,
        offset: 0,
        sizelimit: 0,
        number: 0,
        encrypt_type: 0,
        encrypt_key_size: 0,
        flags: 0,
        file_name: [0; LO_NAME_SIZE],
        crypt_name: [0; LO_NAME_SIZE],
        encrypt_key: [0; 32],
        init: [0; 2],
    }
}

fn ioctl(fd: &File, req: libc::c_ulong, arg: libc::c_ulong) -> io::Result<libc::c_int> {
    // SAFETY: the loop ioctls used here take an integer or a pointer to a
    // `LoopInfo64` that outlives the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The loop device whose backing file is `image` (by device and inode), if
/// one is set up.
pub fn find_loop(image: &Path) -> io::Result<Option<PathBuf>> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(image)?;
    for entry in std::fs::read_dir("/sys/block")? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with("loop") {
            continue;
        }
        let dev = PathBuf::from(format!("/dev/{name}"));
        let Ok(f) = File::open(&dev) else { continue };
        let mut info = zeroed_info();
        if ioctl(
            &f,
            LOOP_GET_STATUS64,
            std::ptr::addr_of_mut!(info) as libc::c_ulong,
        )
        .is_err()
        {
            continue; // not bound
        }
        if info.device == meta.dev() && info.inode == meta.ino() {
            return Ok(Some(dev));
        }
    }
    Ok(None)
}

/// Sets up (or finds) the loop device backed by `image`.
pub fn attach_loop(image: &Path) -> io::Result<PathBuf> {
    if let Some(dev) = find_loop(image)? {
        return Ok(dev);
    }
    let ctl = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    let n = ioctl(&ctl, LOOP_CTL_GET_FREE, 0)?;
    let dev = PathBuf::from(format!("/dev/loop{n}"));
    if !dev.exists() {
        // A container's /dev may lack nodes the host's udev created later.
        let c = cstring(&dev)?;
        let devno = libc::makedev(7, n as u32);
        // SAFETY: a valid path and a block device number.
        if unsafe { libc::mknod(c.as_ptr(), libc::S_IFBLK | 0o660, devno) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    let loopf = OpenOptions::new().read(true).write(true).open(&dev)?;
    let backing = OpenOptions::new().read(true).write(true).open(image)?;
    ioctl(&loopf, LOOP_SET_FD, backing.as_raw_fd() as libc::c_ulong)?;
    let mut info = zeroed_info();
    let name = image.as_os_str().as_bytes();
    let len = name.len().min(LO_NAME_SIZE - 1);
    info.file_name[..len].copy_from_slice(&name[..len]);
    if let Err(e) = ioctl(
        &loopf,
        LOOP_SET_STATUS64,
        std::ptr::addr_of!(info) as libc::c_ulong,
    ) {
        let _ = ioctl(&loopf, LOOP_CLR_FD, 0);
        return Err(e);
    }
    Ok(dev)
}

/// Releases the loop device backed by `image`, if any.
pub fn detach_loop(image: &Path) -> io::Result<()> {
    match find_loop(image)? {
        Some(dev) => detach_device(&dev),
        None => Ok(()),
    }
}

/// Releases the loop device `dev` (one that is not bound is fine).
pub fn detach_device(dev: &Path) -> io::Result<()> {
    let f = File::open(dev)?;
    match ioctl(&f, LOOP_CLR_FD, 0) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Every bound loop device and its backing file, as the kernel lists them
/// in `/sys/block/loop*/loop/backing_file` (what `losetup -a` shows).
pub fn loop_devices() -> io::Result<Vec<(PathBuf, PathBuf)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/sys/block")? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with("loop") {
            continue;
        }
        // Absent for a loop device that is not bound.
        let Ok(text) = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
        else {
            continue;
        };
        out.push((
            PathBuf::from(format!("/dev/{name}")),
            backing_file_path(&text),
        ));
    }
    out.sort();
    Ok(out)
}

/// The path in a `backing_file` attribute: without the newline, and
/// without the ` (deleted)` the kernel appends once the file is removed.
pub fn backing_file_path(text: &str) -> PathBuf {
    let line = text.trim_end_matches('\n');
    PathBuf::from(line.strip_suffix(" (deleted)").unwrap_or(line))
}

/// Creates the file a block volume is published on, then bind-mounts the
/// loop device of `image` over it.
pub fn publish_block(image: &Path, target: &Path, readonly: bool) -> io::Result<()> {
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)?;
    }
    if !target.exists() {
        File::create(target)?;
    }
    let dev = attach_loop(image)?;
    if !std::fs::metadata(&dev)?.file_type().is_block_device() {
        return Err(io::Error::other(format!(
            "{} is not a block device",
            dev.display()
        )));
    }
    bind(&dev, target, readonly)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_come_from_field_five_with_escapes_undone() {
        let text = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
97 22 0:45 / /var/lib/kubelet/pods/a\\040b/volumes rw shared:50 - tmpfs tmpfs rw
98 22 0:46 /x /tmp/back\\134slash rw - tmpfs tmpfs rw
";
        assert_eq!(
            mount_points(text),
            vec![
                PathBuf::from("/"),
                PathBuf::from("/var/lib/kubelet/pods/a b/volumes"),
                PathBuf::from("/tmp/back\\slash"),
            ]
        );
    }

    #[test]
    fn a_lone_backslash_or_a_short_escape_stays_as_it_is() {
        assert_eq!(unescape_octal("a\\"), "a\\");
        assert_eq!(unescape_octal("a\\04"), "a\\04");
        assert_eq!(unescape_octal("a\\089"), "a\\089");
    }

    #[test]
    fn backing_files_lose_newline_and_deleted_mark() {
        assert_eq!(backing_file_path("/d/v.img\n"), PathBuf::from("/d/v.img"));
        assert_eq!(
            backing_file_path("/d/v.img (deleted)\n"),
            PathBuf::from("/d/v.img")
        );
        assert_eq!(backing_file_path("/d/a b.img"), PathBuf::from("/d/a b.img"));
    }

    #[test]
    fn removing_a_target_never_recurses() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("target");
        std::fs::create_dir(&t).unwrap();
        std::fs::write(t.join("data"), b"keep").unwrap();
        assert!(remove_target(&t).is_err(), "a non-empty dir is kept");
        assert!(t.join("data").exists());
        std::fs::remove_file(t.join("data")).unwrap();
        remove_target(&t).unwrap();
        assert!(!t.exists());
        remove_target(&t).unwrap();
    }
}
