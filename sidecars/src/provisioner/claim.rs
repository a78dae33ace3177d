//! One claim's sync: provision it, let go of it, or clean up after it.
//!
//! Provisioning is ordered so that no crash can leak a volume:
//! 1. the intent goes into the journal ([`super::journal`]; batched with
//!    other claims' intents into one write). Without a journal (no RBAC for
//!    it) [`decide::CLAIM_FINALIZER`] goes on the claim instead;
//! 2. CreateVolume, named after the claim UID (idempotent across retries
//!    and restarts);
//! 3. the PV is created (it now carries the volume's lifecycle);
//! 4. the intent is trimmed (or the finalizer comes off), off the critical
//!    path.
//!
//! A crash before 3 leaves the intent: either the claim is still wanted and
//! the retry's CreateVolume returns the same volume, or the claim is gone
//! and the journal sweep ([`super::sweep`]) deletes the volume. A claim
//! still holding the finalizer (from the fallback, or an earlier version)
//! is cleaned up by [`Provisioner::clean_up`] before it is let go.
//!
//! In node deployment the central decision passes through
//! [`node_deployment::claim_action`] first: this node's claims only, the
//! race for unselected Immediate ones ([`super::become_owner`]), and this
//! node's own finalizer.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use csiops_proto::csi::v1::CreateVolumeRequest;

use futures::FutureExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttributesClass};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use tonic::{Code, Status};

use super::content_source::{ResolveError, SourceKind};
use super::controller::{ClaimKey, Provisioner};
use super::decide::{self, ClaimAction};
use super::journal::{JournalError, Record, Recorded};
use super::metrics::Operation;
use super::naming::NamingError;
use super::plan::{self, Cluster, FinishError, PrepareError, Prepared};
use super::secrets::{self, SecretError};
use super::topology::TopologyError;
use super::{csi, finalizer, node_deployment, topology};
use csiops_runtime::chain;

/// Why a claim is not provisioned yet (each becomes a Warning Event on the
/// claim and a retry with backoff).
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("storageclass.storage.k8s.io {0:?} not found")]
    ClassMissing(String),
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    #[error(transparent)]
    Naming(#[from] NamingError),
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error(transparent)]
    ContentSource(#[from] ResolveError),
    #[error("failed to provision volume with StorageClass {class:?}: {}", rpc(.status))]
    Create { class: String, status: Status },
    #[error("the driver refused this claim's CreateVolume as infeasible; the next attempt is in {left:?}")]
    RecentlyInfeasible { left: Duration },
    #[error("the created volume is unusable ({error}); it was deleted and will be created again")]
    Unusable { error: FinishError },
    #[error("the created volume is unusable ({error}) and deleting it failed: {}", rpc(.status))]
    UnusableNotDeleted { error: FinishError, status: Status },
    #[error("cannot build the PV")]
    Pv(#[source] FinishError),
    #[error("PV {0:?} exists and belongs to another claim")]
    PvTaken(String),
    #[error("the claim was deleted and re-created while being provisioned")]
    Recreated,
    #[error("the claim no longer needs volume {volume:?} (deleted, or bound to another PV) and cleaning it up failed: {}", rpc(.status))]
    CleanUpFailed { volume: String, status: Status },
    #[error("the claim no longer needs volume {volume:?} (deleted, bound to another PV, or moved to another node), and whether that volume exists cannot be told: {why}. Delete it on the storage backend if it exists, then remove finalizer {finalizer} from the claim")]
    CleanUpBlocked {
        volume: String,
        why: String,
        finalizer: String,
    },
    #[error("cannot record the intent to provision volume {volume:?}")]
    Journal {
        volume: String,
        source: JournalError,
    },
    #[error("cannot select node {node:?} for the claim")]
    BecomeOwner {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("PV {pv:?}: cannot tell which node holds its volume")]
    Affinity {
        pv: String,
        #[source]
        source: node_deployment::AffinityError,
    },
    #[error("PV {pv:?}: cannot translate the in-tree PV to CSI")]
    Migration {
        pv: String,
        #[source]
        source: crate::common::migration::MigrationError,
    },
    /// Not this node's claim yet, and not ready to be: retried with
    /// backoff, without an Event (see [`ClaimError::quiet`]).
    #[error("{0}")]
    NotYet(&'static str),
    #[error("Kubernetes API")]
    Kube(#[from] kube::Error),
}

impl ClaimError {
    /// Retried without an Event or a failure counted: node deployment's
    /// waits on claims that are not this node's (an Event from each node
    /// would flood the claim).
    pub fn quiet(&self) -> bool {
        matches!(self, ClaimError::NotYet(_))
    }

    /// The driver refused the request as infeasible (see [`super::infeasible`]).
    pub fn infeasible(&self) -> bool {
        matches!(self, ClaimError::Create { status, .. } if super::infeasible::is_infeasible(status))
    }

    /// The Event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            ClaimError::CleanUpFailed { .. } | ClaimError::CleanUpBlocked { .. } => {
                "ProvisioningCleanupFailed"
            }
            _ => "ProvisioningFailed",
        }
    }
}

/// How soon a claim whose volume name the sweep holds is tried again.
const HELD_RETRY: Duration = Duration::from_millis(500);

/// `namespace/name`, as admins write it.
pub fn display(key: &ClaimKey) -> String {
    format!(
        "{}/{}",
        key.namespace.as_deref().unwrap_or_default(),
        key.name
    )
}

/// An RPC error in upstream's words, which admins grep for.
pub(super) fn rpc(status: &Status) -> String {
    format!(
        "rpc error: code = {:?} desc = {}",
        status.code(),
        status.message()
    )
}

impl Provisioner {
    pub(super) async fn sync_claim(&self, key: &ClaimKey) -> Result<(), ClaimError> {
        let Some(claim) = self.caches.claims.get(key) else {
            return Ok(());
        };
        let class =
            decide::class_name(&claim).and_then(|n| self.caches.classes.get(&ObjectRef::new(n)));
        let pv_name = self
            .config
            .namer
            .pv_name(claim.uid().as_deref().unwrap_or_default())?;
        let pv = self.caches.volumes.get(&ObjectRef::new(&pv_name));
        let central = decide::claim_action(
            &claim,
            &self.config.driver_name,
            class.as_deref(),
            &pv_name,
            pv.is_some(),
            self.claim_finalizer(),
        );
        let action = match &self.node {
            None => central,
            Some(node) => {
                let view = node.view(node.pv_seen(pv.as_deref()));
                let action = node_deployment::claim_action(central, &claim, class.as_deref(), view);
                if action != ClaimAction::BecomeOwner {
                    // Selected (here or elsewhere), bound or gone: no race.
                    node.races
                        .forget(claim.uid().as_deref().unwrap_or_default());
                }
                action
            }
        };
        match action {
            ClaimAction::Nothing(why) => {
                tracing::debug!(why, "nothing to do");
                Ok(())
            }
            ClaimAction::ClassMissing(name) => Err(ClaimError::ClassMissing(name)),
            ClaimAction::ReleaseClaim => self.set_claim_finalizer(&claim, false).await.map(drop),
            ClaimAction::Provision => match class {
                Some(class) => {
                    let (claim_uid, class_uid) = (
                        claim.uid().unwrap_or_default(),
                        class.uid().unwrap_or_default(),
                    );
                    let now = tokio::time::Instant::now();
                    if let Some(left) = self.infeasible.remaining(&claim_uid, &class_uid, now) {
                        return Err(ClaimError::RecentlyInfeasible { left });
                    }
                    let done = self.provision(&claim, &class).await;
                    if done.is_ok() {
                        self.infeasible.forget(&claim_uid);
                    }
                    done
                }
                // claim_action decides Provision only with the class cached.
                None => Err(ClaimError::ClassMissing(
                    decide::class_name(&claim).unwrap_or_default().to_string(),
                )),
            },
            ClaimAction::CleanUp => self.clean_up(&claim, class.as_deref(), &pv_name).await,
            ClaimAction::BecomeOwner => match (&self.node, class) {
                (Some(node), Some(class)) => self.become_owner(node, &claim, &class).await,
                // Decided only in node deployment, with the class cached.
                _ => Ok(()),
            },
            ClaimAction::RetryQuietly(why) => Err(ClaimError::NotYet(why)),
        }
    }

    /// The claim finalizer of this provisioner: [`decide::CLAIM_FINALIZER`],
    /// or this node's own in node deployment.
    pub fn claim_finalizer(&self) -> &str {
        match &self.node {
            Some(node) => &node.finalizer,
            None => decide::CLAIM_FINALIZER,
        }
    }

    /// Whether the PV carries this provisioner's volume: always centrally,
    /// on a node if its affinity (under the driver's keys, for a migrated
    /// in-tree PV) holds for the node.
    fn holds(&self, pv: &PersistentVolume) -> Result<bool, ClaimError> {
        match &self.node {
            None => Ok(true),
            Some(node) => {
                let csi = crate::common::migration::csi_view(pv).map_err(|source| {
                    ClaimError::Migration {
                        pv: pv.name_any(),
                        source,
                    }
                })?;
                node.local
                    .holds(&csi)
                    .map_err(|source| ClaimError::Affinity {
                        pv: pv.name_any(),
                        source,
                    })
            }
        }
    }

    /// The VolumeAttributesClass the claim names (`None` when it names
    /// none, or it does not exist): from the cache once it has listed;
    /// before that, or when the provisioner may not list classes (its
    /// watch keeps failing), read from the API server, as upstream always
    /// does.
    pub(super) async fn attributes_class(
        &self,
        claim: &PersistentVolumeClaim,
    ) -> Result<Option<Arc<VolumeAttributesClass>>, ClaimError> {
        let Some(name) =
            super::attributes_class::requested(claim, self.config.volume_attributes_class)
        else {
            return Ok(None);
        };
        let cache = &self.caches.attributes_classes;
        if cache.wait_until_ready().now_or_never().is_some() {
            return Ok(cache.get(&ObjectRef::new(name)));
        }
        let api: Api<VolumeAttributesClass> = Api::all(self.client.clone());
        Ok(api.get_opt(name).await?.map(Arc::new))
    }

    /// The CreateVolume request for the claim. On a node, always with this
    /// node selected: a claim raced for has none yet, and one cleaned up
    /// after it moved names another. `attributes_class`: see
    /// [`Self::attributes_class`].
    pub(super) fn prepare(
        &self,
        claim: &PersistentVolumeClaim,
        class: &StorageClass,
        attributes_class: Option<&VolumeAttributesClass>,
    ) -> Result<Prepared, PrepareError> {
        let claim = match &self.node {
            Some(node) if node_deployment::selected_node(claim) != Some(node.name()) => {
                Cow::Owned(node.as_selected(claim))
            }
            _ => Cow::Borrowed(claim),
        };
        let nodes = self.caches.nodes.state();
        let csi_nodes = self.caches.csi_nodes.state();
        plan::prepare(
            &claim,
            class,
            attributes_class,
            &self.config,
            self.caps,
            Cluster {
                nodes: &nodes,
                csi_nodes: &csi_nodes,
            },
        )
    }

    /// The CreateVolume request with the provisioner Secret's content.
    async fn request_with_secrets(
        &self,
        prepared: &Prepared,
    ) -> Result<CreateVolumeRequest, SecretError> {
        let mut request = prepared.request.clone();
        if let Some(r) = &prepared.provisioner_secret {
            request.secrets = secrets::fetch(&self.client, r).await?;
        }
        Ok(request)
    }

    async fn provision(
        &self,
        cached: &PersistentVolumeClaim,
        class: &StorageClass,
    ) -> Result<(), ClaimError> {
        let started = Instant::now();
        let attributes_class = self.attributes_class(cached).await?;
        let mut prepared = match self.prepare(cached, class, attributes_class.as_deref()) {
            Ok(p) => p,
            Err(e) => {
                // The scheduler chose a node that is gone: let it choose
                // again, as upstream does.
                if matches!(
                    e,
                    PrepareError::Topology(TopologyError::SelectedNodeNotFound(_))
                ) {
                    self.reschedule(cached).await?;
                }
                return Err(e.into());
            }
        };
        // One sync per volume name at a time: the journal sweep may be
        // looking at this claim's intent. It is quick; come back shortly.
        let Some(_hold) = self.holds.take(&prepared.name) else {
            self.claims
                .add_after(ObjectRef::from_obj(cached), HELD_RETRY);
            return Ok(());
        };
        let class_name = class.name_any();
        // A snapshot or claim to copy (see `content_source`).
        let resolved = self.content_source(cached, class).await?;
        prepared.request.volume_content_source = resolved.as_ref().map(|r| r.content.clone());
        // 1. The intent first: from here on a volume may exist, and the
        //    journal says so whatever happens to the claim or to us.
        //    Whether one stood already (an earlier attempt of unknown
        //    outcome) decides what a refusal below proves.
        let (claim, recorded) = match &self.journal {
            Some(journal) => {
                let record = Record::new(
                    cached,
                    &class_name,
                    &prepared.request,
                    prepared.provisioner_secret.as_ref(),
                );
                let recorded = journal
                    .record(&prepared.name, record)
                    .await
                    .map_err(|source| ClaimError::Journal {
                        volume: prepared.name.clone(),
                        source,
                    })?;
                (cached.clone(), recorded)
            }
            None => {
                let recorded = if decide::claim_has_finalizer(cached, self.claim_finalizer()) {
                    Recorded::Carried
                } else {
                    Recorded::Fresh
                };
                let claim = self.set_claim_finalizer(cached, true).await?;
                if claim.metadata.deletion_timestamp.is_some()
                    || claim
                        .spec
                        .as_ref()
                        .and_then(|s| s.volume_name.as_ref())
                        .is_some()
                {
                    // The cached claim was stale: it is bound or being
                    // deleted now, and the watch event saying so is on its
                    // way; that event brings the claim back here with the
                    // right decision.
                    return Ok(());
                }
                (claim, recorded)
            }
        };
        if let Some(resolved) = &resolved {
            self.protect_source(resolved).await?;
        }
        // No "Provisioning" Event, unlike upstream: the PV controller's
        // ExternalProvisioning Event already says it, and every write counts
        // against --kube-api-qps.
        let request = self.request_with_secrets(&prepared).await?;
        let secrets = request.secrets.clone();
        // 2. The volume.
        let created = {
            let _permit = self.calls.acquire().await;
            self.create_volume(request).await
        };
        let volume = match created {
            Ok(v) => v,
            Err(status) => {
                // A refusal of the request itself: this call made nothing.
                // If no earlier attempt of unknown outcome stood, there is
                // no volume, and nothing to remember (the claim, still
                // wanted, is retried). Otherwise an earlier call may have
                // made it (a driver upgraded since may refuse the same
                // request): the intent or finalizer stays.
                if csi::rejects_request(&status) {
                    match recorded {
                        Recorded::Fresh if self.journal.is_some() => self.trim(&prepared.name),
                        Recorded::Fresh => {
                            self.set_claim_finalizer(&claim, false).await?;
                        }
                        Recorded::Carried => tracing::warn!(
                            volume = %prepared.name, error = %rpc(&status),
                            "the driver refuses the request, but an earlier attempt may have made the volume: its intent stays"
                        ),
                    }
                }
                if self.may_reschedule(&claim, &status) {
                    self.reschedule(&claim).await?;
                }
                return Err(ClaimError::Create {
                    class: class_name,
                    status,
                });
            }
        };
        let pv = match plan::finish(&prepared, &claim, class, &self.config, self.caps, &volume) {
            Ok(pv) => pv,
            Err(error) if error.unusable() => {
                // Too small, or without the content asked for: no PV may
                // point at it; delete and start over.
                let _permit = self.calls.acquire().await;
                return match self.delete_volume(&volume.volume_id, secrets).await {
                    Ok(()) => {
                        self.trim(&prepared.name);
                        Err(ClaimError::Unusable { error })
                    }
                    Err(status) => Err(ClaimError::UnusableNotDeleted { error, status }),
                };
            }
            Err(e) => return Err(ClaimError::Pv(e)),
        };
        // 3. The PV.
        self.create_pv(&pv, &claim).await?;
        // 4. The PV holds the volume now.
        if self.journal.is_some() {
            self.trim(&prepared.name);
        } else {
            self.set_claim_finalizer(&claim, false).await?;
        }
        // A restored snapshot may go now.
        if let Some(r) = resolved
            .as_ref()
            .filter(|r| r.source.kind == SourceKind::Snapshot)
        {
            self.release_snapshot(&r.source).await;
        }
        self.metrics
            .succeeded(Operation::Provision, &class_name, started.elapsed());
        tracing::info!(pv = %prepared.name, volume = %volume.volume_id, "provisioned");
        self.event(
            &claim,
            EventType::Normal,
            "ProvisioningSucceeded",
            format!("Successfully provisioned volume {}", prepared.name),
        )
        .await;
        Ok(())
    }

    /// Drops the journal's intent of `volume` (with a later write).
    fn trim(&self, volume: &str) {
        if let Some(journal) = &self.journal {
            journal.trim(volume);
        }
    }

    /// Whether to hand the claim back to the scheduler, as upstream does:
    /// only with delayed binding (a selected node), a driver with topology
    /// (another node changes the request) and an error saying the node's
    /// storage is exhausted.
    fn may_reschedule(&self, claim: &PersistentVolumeClaim, status: &Status) -> bool {
        self.caps.topology
            && topology::selected_node(claim).is_some()
            && status.code() == Code::ResourceExhausted
    }

    /// Removes the selected-node annotations, so the scheduler picks again.
    async fn reschedule(&self, claim: &PersistentVolumeClaim) -> Result<(), ClaimError> {
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &claim.namespace().unwrap_or_default());
        let patch = serde_json::json!({"metadata": {"annotations": {
            topology::SELECTED_NODE_ANNOTATION: null,
            topology::ALPHA_SELECTED_NODE_ANNOTATION: null,
        }}});
        api.patch(
            &claim.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
        tracing::info!(claim = %claim.name_any(), "storage exhausted on the selected node; rescheduling");
        Ok(())
    }

    /// Creates the PV; one already there for this claim (an earlier attempt)
    /// is fine, one for another claim is an error.
    async fn create_pv(
        &self,
        pv: &PersistentVolume,
        claim: &PersistentVolumeClaim,
    ) -> Result<(), ClaimError> {
        let api: Api<PersistentVolume> = Api::all(self.critical.clone());
        match api.create(&PostParams::default(), pv).await {
            Ok(created) => {
                self.caches.volumes.wrote(created);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.is_already_exists() => {
                let name = pv.name_any();
                let existing = api.get(&name).await?;
                let claim_uid = existing
                    .spec
                    .as_ref()
                    .and_then(|s| s.claim_ref.as_ref())
                    .and_then(|r| r.uid.clone());
                // On a node, only a PV of this node's volume: another
                // node's PV for the claim leaves ours to the sweep.
                if claim_uid.is_some() && claim_uid == claim.uid() && self.holds(&existing)? {
                    self.caches.volumes.wrote(existing);
                    Ok(())
                } else {
                    Err(ClaimError::PvTaken(name))
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The claim holds our finalizer but no longer needs its volume: it was
    /// deleted, or bound to another PV. If its PV exists, the PV's reclaim
    /// policy takes it from here. If not, the volume may exist without any
    /// object pointing at it: CreateVolume with the same name returns it if
    /// it does (and creates it if it did not, which the DeleteVolume that
    /// follows undoes), then the claim is let go.
    async fn clean_up(
        &self,
        claim: &PersistentVolumeClaim,
        class: Option<&StorageClass>,
        pv_name: &str,
    ) -> Result<(), ClaimError> {
        // The cache may lag behind our own writes: a claim we let go a
        // moment ago may still show our finalizer there, and its volume is
        // deleted already. CreateVolume below would create it again, with
        // nothing left to delete it. So only the server's word counts.
        let claims: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &claim.namespace().unwrap_or_default());
        let claim = match claims.get_opt(&claim.name_any()).await? {
            Some(fresh)
                if fresh.uid() == claim.uid()
                    && decide::claim_has_finalizer(&fresh, self.claim_finalizer()) =>
            {
                fresh
            }
            _ => return Ok(()),
        };
        let claim = &claim;
        // Likewise for a PV created a moment ago. On a node, another
        // node's PV for the claim does not hold this node's volume.
        let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
        if let Some(pv) = volumes.get_opt(pv_name).await? {
            if self.holds(&pv)? {
                self.set_claim_finalizer(claim, false).await?;
                return Ok(());
            }
        }
        let blocked = |why: String| ClaimError::CleanUpBlocked {
            volume: pv_name.to_string(),
            why,
            finalizer: self.claim_finalizer().to_string(),
        };
        let class = class.ok_or_else(|| {
            blocked(format!(
                "StorageClass {:?} is gone",
                decide::class_name(claim).unwrap_or_default()
            ))
        })?;
        // Its VolumeAttributesClass too: a request without its mutable
        // parameters may not find the volume. A class deleted since blocks
        // the clean-up (said, with what to do).
        let attributes_class = self
            .attributes_class(claim)
            .await
            .map_err(|e| blocked(chain(&e).to_string()))?;
        let mut prepared = self
            .prepare(claim, class, attributes_class.as_deref())
            .map_err(|e| blocked(chain(&e).to_string()))?;
        // The same request as the provisioning's, content source included,
        // or a driver holding the volume answers AlreadyExists.
        prepared.request.volume_content_source = self
            .content_source(claim, class)
            .await
            .map_err(|e| blocked(chain(&e).to_string()))?
            .map(|r| r.content);
        // A Secret deleted with its namespace blocks the clean-up: say so,
        // with what to do, rather than retry in silence.
        let request = self
            .request_with_secrets(&prepared)
            .await
            .map_err(|e| blocked(chain(&e).to_string()))?;
        let secrets = request.secrets.clone();
        let permit = self.calls.acquire().await;
        match self.create_volume(request).await {
            Ok(volume) => {
                self.delete_volume(&volume.volume_id, secrets)
                    .await
                    .map_err(|status| ClaimError::CleanUpFailed {
                        volume: pv_name.to_string(),
                        status,
                    })?;
                tracing::info!(pv = %pv_name, volume = %volume.volume_id, "deleted the volume of a claim that no longer needs it");
            }
            // The name is taken by a volume this request does not match:
            // it may be ours, so it must not be forgotten.
            Err(status) if status.code() == Code::AlreadyExists => {
                return Err(blocked(rpc(&status)));
            }
            // The driver rejects the request itself: that proves nothing
            // about the volume the attempt that set the finalizer may have
            // made (the finalizer comes off at once when an attempt is
            // refused with nothing before it). Kept, said, and retried.
            Err(status) if csi::rejects_request(&status) => {
                return Err(blocked(format!(
                    "the driver refuses the CreateVolume request that would find it ({}); a driver upgraded since may refuse an older request",
                    rpc(&status)
                )));
            }
            Err(status) => {
                return Err(ClaimError::CleanUpFailed {
                    volume: pv_name.to_string(),
                    status,
                })
            }
        }
        drop(permit);
        self.set_claim_finalizer(claim, false).await?;
        Ok(())
    }

    /// Adds (`present`) or removes [`Self::claim_finalizer`] (see [`finalizer`]
    /// for the patches); when the patch no longer fits the claim, reads it
    /// again and retries. Returns the claim as written.
    async fn set_claim_finalizer(
        &self,
        claim: &PersistentVolumeClaim,
        present: bool,
    ) -> Result<PersistentVolumeClaim, ClaimError> {
        let namespace = claim.namespace().unwrap_or_default();
        let name = claim.name_any();
        // On: the volume waits for it. Off: the claim is bound (or gone)
        // already, so it waits behind the writes users wait on.
        let client = if present {
            &self.client
        } else {
            &self.bookkeeping
        };
        let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
        let mut current = claim.clone();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let written = if present {
                let Some(patch) = finalizer::add(&current.metadata, self.claim_finalizer()) else {
                    return Ok(current);
                };
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
            } else {
                let Some(patch) =
                    finalizer::remove_at_index(&current.metadata, self.claim_finalizer())
                else {
                    return Ok(current);
                };
                api.patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
                    .await
            };
            match written {
                Ok(written) => {
                    self.caches.claims.wrote(written.clone());
                    return Ok(written);
                }
                // 409 for a stale version, 422 for a failed JSON-patch test.
                Err(kube::Error::Api(s)) if (s.is_conflict() || s.code == 422) && attempt <= 3 => {
                    match api.get_opt(&name).await? {
                        Some(fresh) if fresh.uid() == claim.uid() => current = fresh,
                        // Gone: nothing holds a finalizer any more.
                        None if !present => return Ok(current),
                        _ => return Err(ClaimError::Recreated),
                    }
                }
                Err(kube::Error::Api(s)) if s.is_not_found() && !present => return Ok(current),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests;
