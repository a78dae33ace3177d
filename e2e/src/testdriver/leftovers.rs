//! What a test with real mounts and loop devices may leave on the machine
//! under its temp dir, and a guard that removes it however the test ends.
//!
//! Loop devices and mounts outlive the driver process that made them (they
//! belong to the kernel and the mount namespace), and a failed assertion
//! skips the test's own clean-up calls; [`LeftoverGuard`] runs on unwind.

use std::path::{Path, PathBuf};

use super::mounts;

/// Mounts and loop devices found under one directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Mount points under the directory, in `/proc/self/mountinfo` order.
    pub mounts: Vec<PathBuf>,
    /// `(device, backing file)` of loop devices backed by a file under it.
    pub loops: Vec<(PathBuf, PathBuf)>,
}

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        self.mounts.is_empty() && self.loops.is_empty()
    }
}

/// The mounts and loop devices under `root` (compared with its canonical
/// path, as the kernel reports them). Unreadable sources count as none.
pub fn leftovers_under(root: &Path) -> Leftovers {
    let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| mounts::mount_points(&t))
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.starts_with(&root) && *p != root)
        .collect();
    let loops = mounts::loop_devices()
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, backing)| backing.starts_with(&root))
        .collect();
    Leftovers { mounts, loops }
}

/// On drop, unmounts everything mounted under `root` (deepest first, lazily
/// so a busy mount cannot stop the rest) and releases every loop device
/// backed by a file under it. Declare it after the temp dir it guards, so it
/// drops first.
#[derive(Debug)]
pub struct LeftoverGuard {
    root: PathBuf,
}

impl LeftoverGuard {
    pub fn new(root: &Path) -> LeftoverGuard {
        LeftoverGuard {
            root: root.to_path_buf(),
        }
    }

    /// Removes what is left now; returns what was found.
    pub fn clean(&self) -> Leftovers {
        let found = leftovers_under(&self.root);
        let mut mounts = found.mounts.clone();
        mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for m in &mounts {
            if let Ok(c) = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()) {
                // SAFETY: a valid NUL-terminated path.
                let r = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
                if r != 0 {
                    tracing::warn!(mount = %m.display(), error = %std::io::Error::last_os_error(), "leftover unmount");
                }
            }
        }
        for (dev, backing) in &found.loops {
            if let Err(e) = mounts::detach_device(dev) {
                tracing::warn!(device = %dev.display(), backing = %backing.display(), error = %e, "leftover loop device");
            }
        }
        found
    }
}

impl Drop for LeftoverGuard {
    fn drop(&mut self) {
        let found = self.clean();
        if !found.is_empty() {
            eprintln!(
                "LeftoverGuard: removed what a test left under {}: {found:?}",
                self.root.display()
            );
        }
    }
}
