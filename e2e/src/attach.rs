//! Objects and processes of the attacher tests and benchmark: PVs of
//! `csi-test-driver` volumes, VolumeAttachments as kube-controller-manager's
//! attach/detach controller creates them, the CSINode the registrar would
//! write, and an attacher process (ours or upstream's) against a cluster.

use std::collections::BTreeMap;
use std::path::Path;

use csiops_proto::client::CsiClient;
use csiops_proto::csi::v1::{volume_capability, CreateVolumeRequest, VolumeCapability};
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec,
};
use k8s_openapi::api::storage::v1::{
    CSINode, CSINodeDriver, CSINodeSpec, VolumeAttachment, VolumeAttachmentSource,
    VolumeAttachmentSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};

use crate::{Error, Result};

/// The attacher's finalizer for a driver name (upstream's spelling),
/// written out independently of the product's code on purpose: the tests
/// check the sidecar against upstream's rule, not against itself.
pub fn finalizer(driver: &str) -> String {
    format!("external-attacher/{}", csi_lib_utils_name(driver))
}

/// csi-lib-utils' rule for names made of a driver name (finalizers,
/// Leases): anything but `[A-Za-z0-9-]` becomes `-`, and a trailing `-`
/// gets an `X`.
pub fn csi_lib_utils_name(driver: &str) -> String {
    let mut s: String = driver
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if s.ends_with('-') {
        s.push('X');
    }
    s
}

/// A ReadWriteOnce filesystem PV of `driver`'s volume `handle`.
pub fn pv(name: &str, driver: &str, handle: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([("storage".into(), Quantity("1Gi".into()))])),
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            persistent_volume_reclaim_policy: Some("Retain".into()),
            csi: Some(CSIPersistentVolumeSource {
                driver: driver.into(),
                volume_handle: handle.into(),
                fs_type: Some("ext4".into()),
                volume_attributes: Some(BTreeMap::from([("origin".into(), "e2e".into())])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A VolumeAttachment of `pv` to `node`, as the attach/detach controller makes it.
pub fn va(name: &str, attacher: &str, pv: &str, node: &str) -> VolumeAttachment {
    VolumeAttachment {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: attacher.into(),
            node_name: node.into(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some(pv.into()),
                ..Default::default()
            },
        },
        status: None,
    }
}

/// Adds (or updates) `driver`'s entry with `node_id` and `topology_keys`
/// in the node's CSINode, as the registrar does.
pub async fn register_driver(
    client: &kube::Client,
    node: &str,
    driver: &str,
    node_id: &str,
    topology_keys: &[&str],
) -> Result<()> {
    let entry = CSINodeDriver {
        name: driver.into(),
        node_id: node_id.into(),
        topology_keys: (!topology_keys.is_empty())
            .then(|| topology_keys.iter().map(|k| k.to_string()).collect()),
        ..Default::default()
    };
    set_driver_entry(client, node, driver, Some(entry)).await
}

/// Removes `driver`'s entry from the node's CSINode (a driver that
/// unregistered, or a node whose plugin is gone).
pub async fn unregister_driver(client: &kube::Client, node: &str, driver: &str) -> Result<()> {
    set_driver_entry(client, node, driver, None).await
}

/// Replaces `driver`'s entry in the node's CSINode with `entry` (or drops
/// it), keeping the other drivers' entries.
async fn set_driver_entry(
    client: &kube::Client,
    node: &str,
    driver: &str,
    entry: Option<CSINodeDriver>,
) -> Result<()> {
    let api: Api<CSINode> = Api::all(client.clone());
    let mut drivers: Vec<CSINodeDriver> = api
        .get_opt(node)
        .await?
        .map(|c| c.spec.drivers)
        .unwrap_or_default();
    drivers.retain(|d| d.name != driver);
    drivers.extend(entry);
    let obj = CSINode {
        metadata: ObjectMeta {
            name: Some(node.into()),
            ..Default::default()
        },
        spec: CSINodeSpec { drivers },
    };
    api.patch(
        node,
        &PatchParams::apply("csiops-e2e").force(),
        &Patch::Apply(&obj),
    )
    .await?;
    Ok(())
}

/// Creates `n` volumes named `<prefix>-<i>` through CreateVolume; their IDs.
pub async fn create_volumes(csi: &CsiClient, prefix: &str, n: usize) -> Result<Vec<String>> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let resp = csi
            .controller()
            .create_volume(CreateVolumeRequest {
                name: format!("{prefix}-{i}"),
                volume_capabilities: vec![VolumeCapability {
                    access_mode: Some(volume_capability::AccessMode {
                        mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
                    }),
                    access_type: Some(volume_capability::AccessType::Mount(Default::default())),
                }],
                ..Default::default()
            })
            .await
            .map_err(|s| Error::Other(format!("CreateVolume: {s}")))?;
        let id = resp
            .into_inner()
            .volume
            .map(|v| v.volume_id)
            .ok_or_else(|| Error::Other("CreateVolume answered without a volume".into()))?;
        ids.push(id);
    }
    Ok(ids)
}

/// Arguments of `csiops-sidecar attacher` against `kubeconfig` and `socket`.
pub fn attacher_args(
    socket: &Path,
    kubeconfig: &Path,
    http_port: u16,
    extra: &[&str],
) -> Vec<String> {
    let mut args = vec![
        "attacher".to_string(),
        format!("--csi-address=unix://{}", socket.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--http-endpoint=127.0.0.1:{http_port}"),
        "--v=2".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Whether the attachment is attached with our finalizer.
pub fn attached(va: &VolumeAttachment, finalizer: &str) -> bool {
    va.status.as_ref().is_some_and(|s| s.attached) && has_finalizer(&va.metadata, finalizer)
}

pub fn has_finalizer(meta: &ObjectMeta, finalizer: &str) -> bool {
    meta.finalizers.iter().flatten().any(|f| f == finalizer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finalizer_names() {
        assert_eq!(
            finalizer("test.csi.csiops.dev"),
            "external-attacher/test-csi-csiops-dev"
        );
        assert_eq!(finalizer("a/"), "external-attacher/a-X");
    }
}
