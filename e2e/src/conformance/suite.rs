//! The built storage e2e suite: `e2e/cluster-bins/e2e-suite.sh`'s output
//! dir (`e2e.test`, `ginkgo`, the suite's image archives and the
//! `KUBE_TEST_REPO_LIST` that names them).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::bins::{dir_from_env_or_script, parse_env};
use crate::error::{io, Error, Result};

/// The suite's output dir, as `e2e-suite.sh` leaves it.
#[derive(Debug, Clone)]
pub struct Suite {
    dir: PathBuf,
    /// Image name (`busybox`, `agnhost`, …) → full reference.
    images: BTreeMap<String, String>,
}

impl Suite {
    /// `CSIOPS_E2E_SUITE` when set (`make test` passes it), otherwise the
    /// stdout of `e2e/cluster-bins/e2e-suite.sh` (a cold build takes
    /// minutes).
    pub fn resolve() -> Result<Suite> {
        Suite::load(&dir_from_env_or_script(
            "CSIOPS_E2E_SUITE",
            "cluster-bins/e2e-suite.sh",
        )?)
    }

    /// Reads `dir`, checking that everything the runs need is there.
    pub fn load(dir: &Path) -> Result<Suite> {
        for f in ["e2e.test", "ginkgo", "repo-list.yaml", "images.env"] {
            if !dir.join(f).is_file() {
                return Err(Error::Bins(format!(
                    "{} has no {f}; run e2e/cluster-bins/e2e-suite.sh",
                    dir.display()
                )));
            }
        }
        let env = dir.join("images.env");
        let text = std::fs::read_to_string(&env).map_err(io("reading", &env))?;
        let images = parse_env(&text);
        for name in images.keys() {
            let archive = dir.join("images").join(format!("{name}.tar"));
            if !archive.is_file() {
                return Err(Error::Bins(format!("{} is missing", archive.display())));
            }
        }
        if !images.contains_key("busybox") || !images.contains_key("agnhost") {
            return Err(Error::Bins(format!(
                "{} names no busybox or agnhost image",
                env.display()
            )));
        }
        Ok(Suite {
            dir: dir.to_path_buf(),
            images,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn e2e_test(&self) -> PathBuf {
        self.dir.join("e2e.test")
    }

    pub fn ginkgo(&self) -> PathBuf {
        self.dir.join("ginkgo")
    }

    /// `KUBE_TEST_REPO_LIST` for e2e.test.
    pub fn repo_list(&self) -> PathBuf {
        self.dir.join("repo-list.yaml")
    }

    /// The image archives, to import into every real node
    /// (`ClusterOptions::extra_images`).
    pub fn image_archives(&self) -> Vec<PathBuf> {
        self.images
            .keys()
            .map(|name| self.dir.join("images").join(format!("{name}.tar")))
            .collect()
    }

    /// The full reference of the suite's image `name` (`busybox`, `agnhost`).
    pub fn image(&self, name: &str) -> Result<&str> {
        self.images
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| Error::Bins(format!("the suite has no {name} image")))
    }
}
