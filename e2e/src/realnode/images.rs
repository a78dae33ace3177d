//! The images the real node runs: OCI archives built by `make images`
//! (`e2e/images/build.sh`), imported into the node's containerd with
//! `ctr images import`. Nothing is ever pulled.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::bins::{dir_from_env_or_script, parse_env};
use crate::error::{io, Error, Result};

/// The images of `make images`: (key in `refs.env`, archive name).
pub type Image = (&'static str, &'static str);
pub const OPERATOR: Image = ("OPERATOR_IMAGE", "csiops-operator");
pub const SIDECAR: Image = ("SIDECAR_IMAGE", "csiops-sidecar");
pub const TEST_DRIVER: Image = ("TEST_DRIVER_IMAGE", "csi-test-driver");
pub const PAUSE: Image = ("PAUSE_IMAGE", "pause");
const ALL: [Image; 4] = [OPERATOR, SIDECAR, TEST_DRIVER, PAUSE];

/// A directory of `<archive>.tar` OCI archives and their references
/// (`refs.env`: `<KEY>=<ref>` lines).
#[derive(Debug, Clone)]
pub struct ImageSet {
    dir: PathBuf,
    refs: BTreeMap<String, String>,
    /// More archives to import (e.g. the storage e2e suite's images).
    extra: Vec<PathBuf>,
}

impl ImageSet {
    /// `CSIOPS_IMAGES_DIR` when set, otherwise the stdout of
    /// `e2e/images/build.sh` (which builds only what changed). Resolved once
    /// per process.
    pub fn resolve() -> Result<ImageSet> {
        static DIR: OnceLock<PathBuf> = OnceLock::new();
        let dir = match DIR.get() {
            Some(d) => d.clone(),
            None => {
                let d = resolve_dir()?;
                DIR.get_or_init(|| d).clone()
            }
        };
        ImageSet::load(&dir)
    }

    /// Reads `dir/refs.env` and checks every archive is there.
    pub fn load(dir: &Path) -> Result<ImageSet> {
        let path = dir.join("refs.env");
        let text = std::fs::read_to_string(&path).map_err(io("reading", &path))?;
        let refs = parse_env(&text);
        for (key, name) in ALL {
            if !refs.contains_key(key) {
                return Err(Error::Other(format!("{} has no {key}", path.display())));
            }
            let archive = dir.join(format!("{name}.tar"));
            if !archive.is_file() {
                return Err(Error::Other(format!(
                    "image archive {} is missing; run `make images`",
                    archive.display()
                )));
            }
        }
        Ok(ImageSet {
            dir: dir.to_path_buf(),
            refs,
            extra: Vec::new(),
        })
    }

    /// This set plus the OCI archives `extra`, imported as they are (each
    /// archive's index names its image).
    pub fn with_extra(mut self, extra: Vec<PathBuf>) -> ImageSet {
        self.extra.extend(extra);
        self
    }

    /// The full reference of an image, e.g. `ghcr.io/csiops/csiops-sidecar:v0.1.0`.
    pub fn reference(&self, (key, _): Image) -> Result<&str> {
        self.refs
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| Error::Other(format!("no {key} in refs.env")))
    }

    /// containerd's sandbox image.
    pub fn pause(&self) -> Result<&str> {
        self.reference(PAUSE)
    }

    /// Imports every archive into the containerd at `socket` (CRI namespace).
    pub fn import(&self, socket: &Path) -> Result<()> {
        let ours = ALL
            .iter()
            .map(|(_, name)| self.dir.join(format!("{name}.tar")));
        for archive in ours.chain(self.extra.iter().cloned()) {
            super::ctr(socket, &["images", "import", &archive.to_string_lossy()])?;
        }
        let listed = super::ctr(socket, &["images", "ls", "-q"])?;
        for image @ (_, name) in ALL {
            let r = self.reference(image)?;
            if !listed.lines().any(|l| l == r) {
                return Err(Error::Other(format!(
                    "after importing {name}.tar containerd has no {r}; it has:\n{listed}"
                )));
            }
        }
        Ok(())
    }
}

fn resolve_dir() -> Result<PathBuf> {
    dir_from_env_or_script("CSIOPS_IMAGES_DIR", "images/build.sh")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refs_env_must_name_every_image() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("refs.env"), "PAUSE_IMAGE=p\n").unwrap();
        let err = ImageSet::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("no OPERATOR_IMAGE"), "{err}");
    }
}
