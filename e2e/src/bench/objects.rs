//! Objects laid out directly through the API, as a long-running cluster
//! has them: Bound claims with their PVs (`pv.kubernetes.io/provisioned-by`
//! the driver, the provisioner's and attacher's finalizers), attached
//! VolumeAttachments, CSINodes of many nodes; and the `csi-test-driver`
//! state that knows the same volumes (published where the attachments
//! say), so the driver and the API agree when the sidecars start.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;

use futures::stream::{self, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::{
    CSINode, CSINodeDriver, CSINodeSpec, StorageClass, VolumeAttachment, VolumeAttachmentStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::testdriver::state::{write_state, ControllerPublication, State, Volume, STATE_VERSION};
use crate::{Error, Result};

/// Requests in flight while laying objects out.
pub const CONCURRENCY: usize = 32;
/// The PV finalizer of the provisioner (upstream's name, ours too).
pub const PROVISIONER_PV_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

/// Runs `f(i)` for `0..n`, [`CONCURRENCY`] at a time.
pub async fn for_each<F, Fut>(n: usize, f: F) -> Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    stream::iter(0..n)
        .map(f)
        .buffer_unordered(CONCURRENCY)
        .try_collect::<()>()
        .await
}

/// An Immediate, Delete StorageClass of `driver`.
pub async fn storage_class(client: &kube::Client, name: &str, driver: &str) -> Result<()> {
    let classes: Api<StorageClass> = Api::all(client.clone());
    let class = StorageClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        provisioner: driver.into(),
        reclaim_policy: Some("Delete".into()),
        volume_binding_mode: Some("Immediate".into()),
        ..Default::default()
    };
    classes.create(&PostParams::default(), &class).await?;
    Ok(())
}

/// A 1Mi ReadWriteOnce claim of `class`.
pub fn claim(name: &str, namespace: &str, class: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some(class.into()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".into(), Quantity("1Mi".into()))])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// What the bound volumes of [`create_bound`] are.
#[derive(Clone, Debug)]
pub struct BoundSet {
    pub driver: String,
    pub class: String,
    pub namespace: String,
    /// Name prefix of claims (`<prefix>-<i>`), PVs (`<prefix>-pv-<i>`),
    /// volume handles (`<prefix>-vol-<i>`) and attachments (`<prefix>-va-<i>`).
    pub prefix: String,
    pub count: usize,
    /// Attachment `i` is on node `nodes[i % nodes.len()]` (none if empty).
    pub nodes: Vec<String>,
}

impl BoundSet {
    pub fn claim_name(&self, i: usize) -> String {
        format!("{}-{i:05}", self.prefix)
    }
    pub fn pv_name(&self, i: usize) -> String {
        format!("{}-pv-{i:05}", self.prefix)
    }
    pub fn handle(&self, i: usize) -> String {
        format!("{}-vol-{i:05}", self.prefix)
    }
    pub fn va_name(&self, i: usize) -> String {
        format!("{}-va-{i:05}", self.prefix)
    }
    fn node(&self, i: usize) -> Option<&str> {
        (!self.nodes.is_empty()).then(|| self.nodes[i % self.nodes.len()].as_str())
    }

    /// The claims, Bound to their PVs, as dynamic provisioning leaves
    /// them, and (with nodes) the attached VolumeAttachments. The claim
    /// goes first (its UID is the PV's claimRef); kube-controller-manager
    /// then marks both Bound.
    pub async fn create(&self, client: &kube::Client) -> Result<()> {
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &self.namespace);
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let vas: Api<VolumeAttachment> = Api::all(client.clone());
        for_each(self.count, |i| {
            let (pvcs, pvs, vas) = (pvcs.clone(), pvs.clone(), vas.clone());
            async move {
                let mut c = claim(&self.claim_name(i), &self.namespace, &self.class);
                c.metadata.annotations = Some(self.claim_annotations());
                if let Some(spec) = c.spec.as_mut() {
                    spec.volume_name = Some(self.pv_name(i));
                }
                let c = pvcs.create(&PostParams::default(), &c).await?;
                pvs.create(&PostParams::default(), &self.pv(i, &c)).await?;
                if let Some(node) = self.node(i) {
                    let va =
                        crate::attach::va(&self.va_name(i), &self.driver, &self.pv_name(i), node);
                    let mut va = va;
                    va.metadata.finalizers = Some(vec![crate::attach::finalizer(&self.driver)]);
                    vas.create(&PostParams::default(), &va).await?;
                    let status = serde_json::json!({"status": VolumeAttachmentStatus {
                        attached: true,
                        ..Default::default()
                    }});
                    vas.patch_status(
                        &self.va_name(i),
                        &PatchParams::default(),
                        &Patch::Merge(&status),
                    )
                    .await?;
                }
                Ok(())
            }
        })
        .await
    }

    fn claim_annotations(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("pv.kubernetes.io/bind-completed".into(), "yes".into()),
            ("pv.kubernetes.io/bound-by-controller".into(), "yes".into()),
            (
                "volume.beta.kubernetes.io/storage-provisioner".into(),
                self.driver.clone(),
            ),
            (
                "volume.kubernetes.io/storage-provisioner".into(),
                self.driver.clone(),
            ),
        ])
    }

    fn pv(&self, i: usize, claim: &PersistentVolumeClaim) -> PersistentVolume {
        let mut pv = crate::attach::pv(&self.pv_name(i), &self.driver, &self.handle(i));
        let mut finalizers = vec![
            "kubernetes.io/pv-protection".to_string(),
            PROVISIONER_PV_FINALIZER.to_string(),
        ];
        if self.node(i).is_some() {
            finalizers.push(crate::attach::finalizer(&self.driver));
        }
        pv.metadata.finalizers = Some(finalizers);
        pv.metadata.annotations = Some(BTreeMap::from([(
            "pv.kubernetes.io/provisioned-by".into(),
            self.driver.clone(),
        )]));
        if let Some(spec) = pv.spec.as_mut() {
            spec.persistent_volume_reclaim_policy = Some("Delete".into());
            spec.storage_class_name = Some(self.class.clone());
            spec.capacity = Some(BTreeMap::from([("storage".into(), Quantity("1Mi".into()))]));
            spec.claim_ref = Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: Some(self.namespace.clone()),
                name: claim.metadata.name.clone(),
                uid: claim.metadata.uid.clone(),
                resource_version: claim.metadata.resource_version.clone(),
                ..Default::default()
            });
        }
        pv
    }

    /// The driver's state for these volumes plus `extra` unpublished ones
    /// (handles `<prefix>-extra-<j>`), each published to its attachment's
    /// node, the nodes known: `csi-test-driver --in-memory` reads it once.
    pub fn write_driver_state(&self, state_dir: &Path, extra: usize) -> Result<()> {
        let mut state = State {
            version: STATE_VERSION,
            ..State::default()
        };
        state.nodes.extend(self.nodes.iter().cloned());
        let handles = (0..self.count)
            .map(|i| (self.handle(i), self.node(i)))
            .chain((0..extra).map(|j| (self.extra_handle(j), None)));
        for (seq, (id, node)) in handles.enumerate() {
            let mut v = Volume {
                id: id.clone(),
                name: id.clone(),
                seq: seq as u64,
                capacity_bytes: 1 << 20,
                ..Volume::default()
            };
            if let Some(node) = node {
                v.published_nodes
                    .insert(node.to_string(), ControllerPublication::default());
            }
            state.volumes.insert(id, v);
        }
        state.next_seq = state.volumes.len() as u64;
        std::fs::create_dir_all(state_dir).map_err(|e| Error::Other(e.to_string()))?;
        write_state(state_dir, &state).map_err(|e| Error::Other(e.to_string()))
    }

    /// The handle of unpublished volume `j` of [`Self::write_driver_state`].
    pub fn extra_handle(&self, j: usize) -> String {
        format!("{}-extra-{j}", self.prefix)
    }
}

/// CSINodes of `n` nodes named `<prefix>-<i>` (no Node objects), each with
/// an entry of `driver`: the CSINodes a cluster of `n` nodes has.
pub async fn csinodes(client: &kube::Client, prefix: &str, n: usize, driver: &str) -> Result<()> {
    let api: Api<CSINode> = Api::all(client.clone());
    for_each(n, |i| {
        let api = api.clone();
        async move {
            let name = format!("{prefix}-{i:05}");
            let obj = CSINode {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..Default::default()
                },
                spec: CSINodeSpec {
                    drivers: vec![CSINodeDriver {
                        name: driver.into(),
                        node_id: name,
                        ..Default::default()
                    }],
                },
            };
            api.create(&PostParams::default(), &obj).await?;
            Ok(())
        }
    })
    .await
}

/// Claims of `namespace` whose phase is Bound.
pub fn is_bound(c: &PersistentVolumeClaim) -> bool {
    c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}
