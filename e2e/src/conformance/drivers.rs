//! The drivers the suite runs against, each a directory of
//! `e2e/conformance/`: the CSIDriverDeployment csiops deploys it with
//! (`csidriverdeployment.yaml`, a template), the StorageClass the suite
//! copies (`storageclass.yaml`) and the suite's definition
//! (`testdriver.yaml`, `-storage.testdriver=`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{io, Error, Result};
use crate::testkit::workspace_root;

/// One driver definition of the suite and how csiops deploys it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverSetup {
    /// Its directory under `e2e/conformance/`, and its name in reports.
    pub name: &'static str,
    /// The CSI driver name (`DriverInfo.Name`: the suite's specs say
    /// `[Driver: <driver>]`).
    pub driver: &'static str,
    /// The CSIDriverDeployment's namespace and name.
    pub namespace: &'static str,
    pub object: &'static str,
    /// Needs the VolumeSnapshot CRDs and upstream's snapshot-controller.
    pub snapshots: bool,
    /// An image not built by this repository: the variable naming its OCI
    /// archive, loaded into both nodes (the archive carries the image's
    /// name, which the template names).
    pub image_archive_env: Option<&'static str>,
}

/// csi-test-driver deployed centrally: controller (provisioner, attacher,
/// csi-snapshotter) and node pods, attach required.
pub const CENTRAL: DriverSetup = DriverSetup {
    name: "central",
    driver: "central.test.csi.csiops.dev",
    namespace: "csiops-conformance-central",
    object: "central",
    snapshots: true,
    image_archive_env: None,
};

/// csi-test-driver `--node-local` with `spec.topology: NodeLocal`.
pub const NODE_LOCAL: DriverSetup = DriverSetup {
    name: "node-local",
    driver: "local.test.csi.csiops.dev",
    namespace: "csiops-conformance-local",
    object: "local",
    snapshots: false,
    image_archive_env: None,
};

/// Upstream csi-driver-host-path's hostpathplugin v1.18.0 with
/// `spec.topology: NodeLocal`, as manifests/examples/hostpath-distributed.yaml
/// deploys it. Its image is upstream's, built from upstream's repository
/// (e2e/README.md, "Upstream hostpathplugin"), so it is not in [`ALL`]:
/// `csiops-conformance --drivers hostpath` with
/// `CSIOPS_HOSTPATHPLUGIN_IMAGE` naming the archive.
pub const HOSTPATH: DriverSetup = DriverSetup {
    name: "hostpath",
    driver: "hostpath.csi.k8s.io",
    namespace: "csiops-conformance-hostpath",
    object: "hostpath",
    snapshots: false,
    image_archive_env: Some("CSIOPS_HOSTPATHPLUGIN_IMAGE"),
};

/// Every driver `make conformance` runs.
pub const ALL: [DriverSetup; 2] = [CENTRAL, NODE_LOCAL];

/// Every driver `--drivers` can name.
pub const KNOWN: [DriverSetup; 3] = [CENTRAL, NODE_LOCAL, HOSTPATH];

impl DriverSetup {
    /// `e2e/conformance/<name>`.
    pub fn dir(&self) -> PathBuf {
        workspace_root().join("e2e/conformance").join(self.name)
    }

    /// The suite's definition file (`-storage.testdriver=`).
    pub fn definition(&self) -> PathBuf {
        self.dir().join("testdriver.yaml")
    }

    /// The CSIDriverDeployment (and its Namespace) with `vars` filled in.
    pub fn manifest(&self, vars: &BTreeMap<&str, String>) -> Result<String> {
        fill(&self.dir().join("csidriverdeployment.yaml"), vars)
    }

    /// The OCI archive of the image this repository does not build, if the
    /// driver has one: an error naming the variable when it is unset or
    /// names no file.
    pub fn image_archive(&self) -> Result<Option<PathBuf>> {
        let Some(var) = self.image_archive_env else {
            return Ok(None);
        };
        let path = std::env::var_os(var).map(PathBuf::from).ok_or_else(|| {
            Error::Other(format!(
                "the {} driver needs {var}: the OCI archive of its image, built as e2e/README.md says",
                self.name
            ))
        })?;
        if !path.is_file() {
            return Err(Error::Other(format!("{var}={} is no file", path.display())));
        }
        Ok(Some(path))
    }

    /// The `[Driver: …]` tag of this driver's specs.
    pub fn tag(&self) -> String {
        format!("[Driver: {}]", self.driver)
    }
}

/// The template file at `path` with `vars` filled in ([`substitute`]).
pub fn fill(path: &Path, vars: &BTreeMap<&str, String>) -> Result<String> {
    let text = std::fs::read_to_string(path).map_err(io("reading", path))?;
    substitute(&text, vars).map_err(|e| Error::Other(format!("{}: {e}", path.display())))
}

/// Replaces every `${NAME}` of `template` by `vars[NAME]`; `$(…)` (the
/// API's own expansion) is left alone. A `${NAME}` without a value is an
/// error, so nothing half-filled is applied.
pub fn substitute(
    template: &str,
    vars: &BTreeMap<&str, String>,
) -> std::result::Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unclosed ${{ at {:?}", &rest[i..rest.len().min(i + 20)]))?;
        let name = &after[..end];
        let value = vars
            .get(name)
            .ok_or_else(|| format!("no value for ${{{name}}}"))?;
        out.push_str(value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The values the templates use.
pub fn vars(
    test_driver_image: &str,
    snapshotter_image: &str,
    kubelet_dir: &Path,
    data_dir: &Path,
) -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("TEST_DRIVER_IMAGE", test_driver_image.to_string()),
        ("SNAPSHOTTER_IMAGE", snapshotter_image.to_string()),
        ("KUBELET_DIR", kubelet_dir.display().to_string()),
        ("DATA_DIR", data_dir.display().to_string()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_filled_and_api_expansions_kept() {
        let v = BTreeMap::from([("A", "x".to_string())]);
        assert_eq!(
            substitute("a: ${A}/$(KUBE_NODE_NAME) ${A}", &v).unwrap(),
            "a: x/$(KUBE_NODE_NAME) x"
        );
        assert!(substitute("${B}", &v).unwrap_err().contains("${B}"));
        assert!(substitute("${A", &v).is_err());
    }

    #[test]
    fn every_template_fills_with_the_harness_values() {
        let v = vars("img", "snap", Path::new("/k"), Path::new("/d"));
        for d in KNOWN {
            let m = d.manifest(&v).unwrap();
            assert!(m.contains(d.driver) && !m.contains("${"), "{m}");
            assert!(d.definition().is_file());
            let def = std::fs::read_to_string(d.definition()).unwrap();
            assert!(def.contains(&format!("Name: {}", d.driver)), "{def}");
        }
    }
}
