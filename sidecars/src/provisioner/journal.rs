//! The intent journal: what makes provisioning leak-free without a write
//! per claim on the way to its volume.
//!
//! Before CreateVolume, the provisioner records an *intent* (the volume
//! name, the claim, and the CreateVolume request without its secrets) in one
//! ConfigMap per driver, owned by the leader. Once the PV exists, the PV
//! carries the volume's lifecycle and the intent is *trimmed*.
//!
//! Writes are grouped: the writer takes its rate-limit token first and only
//! then gathers its batch, so every intent recorded while a write is in
//! flight or waits for its token goes into that one JSON merge patch of the
//! ConfigMap's `data`. At QPS 5 a hundred claims cost a write or two instead
//! of two hundred claim finalizer patches. A write with intents waits at the
//! rate limiter's normal priority, behind the PV creates and deletes that
//! users wait on (while those use every token, more intents gather, and a
//! CreateVolume gains nothing from going sooner); a write with only trims
//! goes at bookkeeping priority, after a short wait that lets more trims (or
//! the next intents) join it.
//!
//! Crash analysis (also in the README):
//! - crash before the intent is written: no CreateVolume was sent; nothing
//!   exists. The claim is provisioned by the next leader as usual.
//! - crash after the intent, before or during CreateVolume, or after it but
//!   before the PV: the volume may exist. The next leader reads the journal
//!   at start and sweeps every intent ([`intent_action`]): a live, pending
//!   claim is provisioned again (CreateVolume is idempotent by name, so the
//!   same volume comes back and gets its PV); for a claim that is gone,
//!   deleted or bound elsewhere, the stored request is sent again and the
//!   volume it returns is deleted, then the intent is trimmed. A driver
//!   that refuses the stored request (InvalidArgument after an upgrade,
//!   say) proves nothing about a volume an earlier call may have made: the
//!   intent stays and is reported (see `sweep`).
//! - crash after the PV, before the trim: the sweep finds the PV and trims.
//!
//! **Node deployment** (`--node-deployment`): every node's provisioner is
//! its own writer, so each keeps its own journal ConfigMap, in the same
//! namespace (`--leader-election-namespace`, else the pod's), named
//! [`node_journal_name`]: the driver's journal name, `-`, the node name,
//! made to fit the 253 characters of an object name deterministically
//! (longer ones keep a cut base, a hash and the node name). A node's
//! provisioner reads, writes and sweeps only its own: an intent stands for
//! a volume its own driver may hold, and only that driver can delete it.
//! Its sweep also cleans up after claims that moved to another node (or
//! have none selected any more), and after claims whose PV another node
//! made ([`intent_action`]). The journal of a node removed from the cluster
//! stays behind (its volumes went with the node); delete it by hand.
//!
//! The per-claim finalizer (`csiops.dev/volume-provisioning`, on a node
//! `csiops.dev/volume-provisioning-<node>`) remains for two cases: claims that still carry it from an earlier version, and a
//! provisioner that may not write ConfigMaps in its namespace (a drop-in
//! with upstream's RBAC), which falls back to it with one warning.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csiops_proto::csi::v1::CreateVolumeRequest;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use prost::Message;
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, Notify};

mod holds;
mod intent;
mod seal;

pub use holds::{Hold, Holds};
pub use intent::{intent_action, IntentAction};
pub use seal::{key_secret_name, JournalKey, SealError, KEY_FIELD, SEALED_PREFIX};

use super::naming::bounded_name;
use super::params::SecretRef;
use crate::common::controller::sanitize_name;
use crate::common::ratelimit::{Limiter, Prepaid, Priority};
use csiops_runtime::chain;
use csiops_runtime::shutdown::CancellationToken;

/// The ConfigMap's size limit is 1 MiB; intents beyond this budget wait for
/// trims (each intent is a few hundred bytes: thousands fit).
const SIZE_BUDGET: usize = 900 * 1024;
/// How long a write of trims alone waits for company.
const TRIM_LINGER: Duration = Duration::from_millis(500);
/// Pause after a failed write before the next one.
const RETRY_PAUSE: Duration = Duration::from_secs(1);
/// Label on the journal ConfigMap, so admins can find it.
pub const JOURNAL_LABEL: &str = "csiops.dev/provisioning-journal";

/// Why an intent could not be recorded, or the journal opened.
#[derive(Debug, Clone, thiserror::Error)]
pub enum JournalError {
    #[error("the provisioner may not {verb} {kind} {namespace}/{name} (no RBAC for it in its namespace)")]
    Forbidden {
        verb: &'static str,
        kind: &'static str,
        namespace: String,
        name: String,
    },
    #[error("the intent journal's key in Secret {namespace}/{name} is unusable: {why}")]
    Key {
        namespace: String,
        name: String,
        why: String,
    },
    #[error("cannot write the intent journal ConfigMap {namespace}/{name}: {why}")]
    Write {
        namespace: String,
        name: String,
        why: String,
    },
    #[error("the intent journal ConfigMap {namespace}/{name} is full ({entries} volumes being provisioned); waiting for them to finish")]
    Full {
        namespace: String,
        name: String,
        entries: usize,
    },
    #[error("the provisioner is shutting down")]
    Closed,
}

/// The claim an intent was recorded for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimId {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// A Secret by name (its content is never stored).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretName {
    pub namespace: String,
    pub name: String,
}

/// One intent: enough to call CreateVolume again, and so to find and delete
/// the volume, without the claim or its StorageClass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub claim: ClaimId,
    pub class: String,
    /// The CreateVolume request, protobuf-encoded, with `secrets` empty.
    pub request: ByteString,
    /// The provisioner Secret the request needs, read again at clean-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretName>,
}

impl Record {
    pub fn new(
        claim: &PersistentVolumeClaim,
        class: &str,
        request: &CreateVolumeRequest,
        secret: Option<&SecretRef>,
    ) -> Record {
        let mut request = request.clone();
        // Never stored: the journal is readable by whoever reads ConfigMaps.
        request.secrets.clear();
        Record {
            claim: ClaimId {
                namespace: claim.namespace().unwrap_or_default(),
                name: claim.name_any(),
                uid: claim.uid().unwrap_or_default(),
            },
            class: class.to_string(),
            request: ByteString(request.encode_to_vec()),
            secret: secret.map(|s| SecretName {
                namespace: s.namespace.clone(),
                name: s.name.clone(),
            }),
        }
    }

    /// The stored CreateVolume request (without secrets).
    pub fn request(&self) -> Result<CreateVolumeRequest, prost::DecodeError> {
        CreateVolumeRequest::decode(self.request.0.as_slice())
    }

    pub fn secret_ref(&self) -> Option<SecretRef> {
        self.secret.as_ref().map(|s| SecretRef {
            namespace: s.namespace.clone(),
            name: s.name.clone(),
        })
    }

    fn encode(&self) -> String {
        // A struct of strings and bytes always serialises.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The journal ConfigMap's name for a driver: lowercase (object names are
/// DNS subdomains), sanitised as Lease names are.
pub fn journal_name(driver: &str) -> String {
    format!(
        "csiops-provisioning-{}",
        sanitize_name(driver).to_ascii_lowercase()
    )
}

/// The journal ConfigMap's name for `driver`'s provisioner on `node`
/// (node deployment): [`journal_name`]`-<node>`, within an object name's
/// 253 characters (see [`bounded_name`]). Node names are DNS subdomains,
/// so the result is one too.
pub fn node_journal_name(driver: &str, node: &str) -> String {
    bounded_name(&journal_name(driver), node, 253)
}

/// A journal ConfigMap holding `data`.
fn journal_object(namespace: &str, name: &str, data: BTreeMap<String, String>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                JOURNAL_LABEL.to_string(),
                "true".to_string(),
            )])),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    }
}

/// The entries of a journal ConfigMap that open with `key`, with their
/// values; an entry that does not (not made with the key, or not parsing)
/// is returned apart: logged, never swept and never trimmed by us (a human
/// may need it). With `legacy`, unsealed entries are taken too: the
/// journal of an earlier version, read the first time a key is made for it.
pub fn parse_entries(
    cm: &ConfigMap,
    key: &JournalKey,
    legacy: bool,
) -> (BTreeMap<String, (Record, String)>, Vec<String>) {
    let mut good = BTreeMap::new();
    let mut bad = Vec::new();
    for (name, value) in cm.data.iter().flatten() {
        let plain = match key.open(name, value) {
            Ok(plain) => Some(plain),
            Err(SealError::NotSealed) if legacy => Some(value.as_bytes().to_vec()),
            Err(_) => None,
        };
        match plain.and_then(|p| serde_json::from_slice::<Record>(&p).ok()) {
            Some(r) => {
                good.insert(name.clone(), (r, value.clone()));
            }
            None => bad.push(name.clone()),
        }
    }
    (good, bad)
}

/// The journal's key from its Secret, made (and the Secret created) when
/// there is none yet; with whether it was made now.
async fn load_or_create_key(
    secrets: &Api<Secret>,
    namespace: &str,
    name: &str,
) -> Result<(JournalKey, bool), JournalError> {
    let unusable = |why: String| JournalError::Key {
        namespace: namespace.to_string(),
        name: name.to_string(),
        why,
    };
    let from_secret = |s: &Secret| -> Result<JournalKey, JournalError> {
        let bytes = s
            .data
            .as_ref()
            .and_then(|d| d.get(KEY_FIELD))
            .ok_or_else(|| unusable(format!("no field {KEY_FIELD:?}")))?;
        JournalKey::from_bytes(&bytes.0).map_err(|e| unusable(e.to_string()))
    };
    match secrets.get_opt(name).await {
        Ok(Some(s)) => return Ok((from_secret(&s)?, false)),
        Ok(None) => {}
        Err(e) => return Err(forbidden_or_kind(e, "get", "Secret", namespace, name)),
    }
    let (key, bytes) = JournalKey::generate().map_err(|e| unusable(e.to_string()))?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                JOURNAL_LABEL.to_string(),
                "true".to_string(),
            )])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(KEY_FIELD.to_string(), ByteString(bytes))])),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok((key, true)),
        // Another provisioner made it first: use theirs.
        Err(kube::Error::Api(s)) if s.is_already_exists() => {
            let s = secrets
                .get(name)
                .await
                .map_err(|e| forbidden_or_kind(e, "get", "Secret", namespace, name))?;
            Ok((from_secret(&s)?, false))
        }
        Err(e) => Err(forbidden_or_kind(e, "create", "Secret", namespace, name)),
    }
}

type Waiter = oneshot::Sender<Result<(), JournalError>>;

/// What [`Journal::record`] found before the intent it recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// No intent of the name stood (none, or its trim was on its way: the
    /// attempt before ended knowing there was no volume, or a PV): only
    /// the attempt about to be made may make a volume.
    Fresh,
    /// An intent of the name stood already: an earlier attempt whose outcome
    /// is unknown (it timed out, or a leader died during it) may have made
    /// the volume, whatever the attempt about to be made is answered.
    Carried,
}

/// An intent as the ConfigMap holds it.
struct Written {
    record: Record,
    /// Its value in the ConfigMap (sealed once).
    json: String,
}

impl Written {
    /// `record` sealed as entry `name`.
    fn new(key: &JournalKey, name: &str, record: Record) -> Result<Written, SealError> {
        let json = key.seal(name, record.encode().as_bytes())?;
        Ok(Written { record, json })
    }
}

/// Bytes the ConfigMap's `data` takes for these entries.
fn data_size(entries: &BTreeMap<String, Written>) -> usize {
    entries.iter().map(|(k, w)| k.len() + w.json.len()).sum()
}

#[derive(Default)]
struct State {
    /// What the ConfigMap holds, as of our last write.
    entries: BTreeMap<String, Written>,
    /// Intents for the next write, with whoever waits for them.
    adds: BTreeMap<String, (Record, Vec<Waiter>)>,
    /// Trims for the next write.
    trims: BTreeSet<String>,
    /// Trims of the write in flight: gone for everyone but the ConfigMap.
    trimming: BTreeSet<String>,
    closed: bool,
}

/// The journal of one driver, owned by the leader. Cheap to share.
pub struct Journal {
    namespace: String,
    name: String,
    /// Seals every entry written, opens every entry read.
    key: JournalKey,
    /// The ConfigMap, through the throttled client (its writes are
    /// [`Prepaid`]: see [`Journal::take_token`]).
    api: Api<ConfigMap>,
    /// The client's token bucket, which each write takes its token from
    /// before it gathers its batch.
    limiter: Limiter,
    state: Mutex<State>,
    wake: Notify,
    /// The names the journal held when this leader opened it, until the
    /// sweep first looks at them: intents an earlier leader left.
    inherited: Mutex<BTreeSet<String>>,
}

/// What one write carries.
struct Batch {
    adds: BTreeMap<String, (Record, Vec<Waiter>)>,
    trims: BTreeSet<String>,
}

fn forbidden_or(e: kube::Error, verb: &'static str, ns: &str, name: &str) -> JournalError {
    forbidden_or_kind(e, verb, "ConfigMap", ns, name)
}

fn forbidden_or_kind(
    e: kube::Error,
    verb: &'static str,
    kind: &'static str,
    ns: &str,
    name: &str,
) -> JournalError {
    match e {
        kube::Error::Api(s) if s.code == 403 => JournalError::Forbidden {
            verb,
            kind,
            namespace: ns.to_string(),
            name: name.to_string(),
        },
        e => JournalError::Write {
            namespace: ns.to_string(),
            name: name.to_string(),
            why: chain(&e).to_string(),
        },
    }
}

impl Journal {
    /// Reads the journal (creating an empty one if there is none). Returns
    /// it with the entries to sweep, and the keys that do not parse.
    pub async fn open(
        client: kube::Client,
        limiter: Limiter,
        namespace: &str,
        name: &str,
    ) -> Result<(Arc<Journal>, Vec<String>), JournalError> {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let (key, new_key) =
            load_or_create_key(&secrets, namespace, &key_secret_name(name)).await?;
        let api: Api<ConfigMap> = Api::namespaced(client, namespace);
        let cm = match api.get_opt(name).await {
            Ok(Some(cm)) => cm,
            Ok(None) => {
                let cm = journal_object(namespace, name, BTreeMap::new());
                match api.create(&PostParams::default(), &cm).await {
                    Ok(cm) => cm,
                    // A second process (or a former leader) made it.
                    Err(kube::Error::Api(s)) if s.is_already_exists() => api
                        .get(name)
                        .await
                        .map_err(|e| forbidden_or(e, "get", namespace, name))?,
                    Err(e) => return Err(forbidden_or(e, "create", namespace, name)),
                }
            }
            Err(e) => return Err(forbidden_or(e, "get", namespace, name)),
        };
        let (entries, bad) = parse_entries(&cm, &key, new_key);
        let inherited = entries.keys().cloned().collect();
        // An earlier version's unsealed intents (read once, as the key is
        // made): sealed in place before anything else is written.
        let mut resealed = serde_json::Map::new();
        let mut written = BTreeMap::new();
        for (k, (record, value)) in entries {
            let w = if value.starts_with(SEALED_PREFIX) {
                Written {
                    record,
                    json: value,
                }
            } else {
                let w = Written::new(&key, &k, record).map_err(|e| JournalError::Key {
                    namespace: namespace.to_string(),
                    name: key_secret_name(name),
                    why: e.to_string(),
                })?;
                resealed.insert(k.clone(), serde_json::Value::String(w.json.clone()));
                w
            };
            written.insert(k, w);
        }
        if !resealed.is_empty() {
            let patch = serde_json::json!({ "data": resealed });
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| forbidden_or(e, "patch", namespace, name))?;
        }
        let entries = written;
        let journal = Journal {
            namespace: namespace.to_string(),
            name: name.to_string(),
            key,
            api,
            limiter,
            state: Mutex::new(State {
                entries,
                ..Default::default()
            }),
            wake: Notify::new(),
            inherited: Mutex::new(inherited),
        };
        Ok((Arc::new(journal), bad))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The ConfigMap as far as an Event about it needs (kind, name,
    /// namespace).
    pub fn object_ref(&self) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// `namespace/name` of the ConfigMap, for logs.
    pub fn display(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The volume names the journal holds (written or on their way), but
    /// those whose trim is on its way.
    pub fn names(&self) -> Vec<String> {
        let state = self.state();
        state
            .entries
            .keys()
            .filter(|k| !state.trims.contains(*k) && !state.trimming.contains(*k))
            .chain(state.adds.keys())
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    /// The written intent of `name`, unless a trim of it is on its way.
    pub fn get(&self, name: &str) -> Option<Record> {
        let state = self.state();
        if state.trims.contains(name) || state.trimming.contains(name) {
            return None;
        }
        state.entries.get(name).map(|w| w.record.clone())
    }

    /// Whether `name` was in the journal when this leader opened it and
    /// has not been asked about before: an intent an earlier leader left.
    pub fn take_inherited(&self, name: &str) -> bool {
        self.inherited
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name)
    }

    /// Records the intent and returns once it is written, with whether an
    /// intent of the name stood already (see [`Recorded`]). An identical
    /// intent already written returns at once (a retried claim costs no
    /// write).
    pub async fn record(&self, name: &str, record: Record) -> Result<Recorded, JournalError> {
        let (rx, recorded) = {
            let mut state = self.state();
            if state.closed {
                return Err(JournalError::Closed);
            }
            let recorded = if state.entries.contains_key(name)
                && !state.trims.contains(name)
                && !state.trimming.contains(name)
            {
                Recorded::Carried
            } else {
                Recorded::Fresh
            };
            state.trims.remove(name);
            if state.entries.get(name).is_some_and(|w| w.record == record)
                && !state.adds.contains_key(name)
                && !state.trimming.contains(name)
            {
                return Ok(recorded);
            }
            let (tx, rx) = oneshot::channel();
            let slot = state
                .adds
                .entry(name.to_string())
                .or_insert_with(|| (record.clone(), Vec::new()));
            slot.0 = record;
            slot.1.push(tx);
            (rx, recorded)
        };
        self.wake.notify_one();
        rx.await.unwrap_or(Err(JournalError::Closed))?;
        Ok(recorded)
    }

    /// Drops the intent of `name` with a later write; returns at once.
    pub fn trim(&self, name: &str) {
        {
            let mut state = self.state();
            if !state.entries.contains_key(name) && !state.adds.contains_key(name) {
                return;
            }
            state.trims.insert(name.to_string());
        }
        self.wake.notify_one();
    }

    /// Writes batches until `shutdown`, then answers every waiter.
    pub async fn run_writer(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let batch = tokio::select! {
                b = self.next_batch() => b,
                () = shutdown.cancelled() => break,
            };
            let ok = tokio::select! {
                ok = self.write(batch) => ok,
                () = shutdown.cancelled() => break,
            };
            if !ok {
                tokio::select! {
                    () = tokio::time::sleep(RETRY_PAUSE) => {}
                    () = shutdown.cancelled() => break,
                }
            }
        }
        let mut state = self.state();
        state.closed = true;
        for (_, (_, waiters)) in std::mem::take(&mut state.adds) {
            for w in waiters {
                let _ = w.send(Err(JournalError::Closed));
            }
        }
    }

    /// Waits for work and a token for it, then takes everything queued by
    /// then; a batch of trims alone waits a little longer first, so that
    /// more trims, or intents, share its write.
    async fn next_batch(&self) -> Batch {
        loop {
            let (has_adds, has_trims) = {
                let state = self.state();
                (!state.adds.is_empty(), !state.trims.is_empty())
            };
            if has_adds {
                break;
            }
            if has_trims {
                // Until intents arrive (they take the trims along now) or
                // the wait is over.
                let _ = tokio::time::timeout(TRIM_LINGER, self.intent_arrives()).await;
                break;
            }
            self.wake.notified().await;
        }
        self.take_token().await;
        let mut state = self.state();
        let trims = std::mem::take(&mut state.trims);
        state.trimming = trims.clone();
        Batch {
            adds: std::mem::take(&mut state.adds),
            trims,
        }
    }

    /// A token for the next write, taken before its batch is gathered: at
    /// normal priority when intents wait, at bookkeeping priority for trims
    /// alone (raised when an intent arrives meanwhile). Refused only when
    /// the limiter has stopped (the process is ending); the write then goes
    /// out and fails or succeeds on its own.
    async fn take_token(&self) {
        loop {
            if !self.state().adds.is_empty() {
                let _ = self.limiter.acquire(Priority::Normal).await;
                return;
            }
            tokio::select! {
                _ = self.limiter.acquire(Priority::Bookkeeping) => return,
                () = self.intent_arrives() => {}
            }
        }
    }

    /// Returns once an intent waits for a write.
    async fn intent_arrives(&self) {
        loop {
            self.wake.notified().await;
            if !self.state().adds.is_empty() {
                return;
            }
        }
    }

    /// The merge patch of a write, its token already taken.
    async fn patch_prepaid(&self, patch: &serde_json::Value) -> Result<ConfigMap, kube::Error> {
        let mut req = kube::core::Request::new(self.api.resource_url())
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(patch))
            .map_err(kube::Error::BuildRequest)?;
        req.extensions_mut().insert(Prepaid);
        self.api.clone().into_client().request(req).await
    }

    /// One merge patch for the batch; `false` if it failed (intents are
    /// answered with the error and retried by their claims' syncs; trims
    /// go back for the next write).
    async fn write(&self, mut batch: Batch) -> bool {
        let mut written = BTreeMap::new();
        let mut unsealed = Vec::new();
        for (name, (record, _)) in &batch.adds {
            match Written::new(&self.key, name, record.clone()) {
                Ok(w) => {
                    written.insert(name.clone(), w);
                }
                Err(e) => unsealed.push((name.clone(), e)),
            }
        }
        for (name, e) in unsealed {
            if let Some((_, waiters)) = batch.adds.remove(&name) {
                for w in waiters {
                    let _ = w.send(Err(JournalError::Write {
                        namespace: self.namespace.clone(),
                        name: self.name.clone(),
                        why: e.to_string(),
                    }));
                }
            }
        }
        // Over budget: refuse the newest intents, keep trims.
        {
            let state = self.state();
            let mut size = data_size(&state.entries);
            for t in &batch.trims {
                if let Some(w) = state.entries.get(t) {
                    size = size.saturating_sub(t.len() + w.json.len());
                }
            }
            let mut refused = Vec::new();
            for (name, w) in &written {
                let old = state
                    .entries
                    .get(name)
                    .map_or(0, |o| name.len() + o.json.len());
                let new = name.len() + w.json.len();
                if size.saturating_sub(old) + new > SIZE_BUDGET {
                    refused.push(name.clone());
                } else {
                    size = size.saturating_sub(old) + new;
                }
            }
            let entries = state.entries.len();
            for name in refused {
                written.remove(&name);
                if let Some((_, waiters)) = batch.adds.remove(&name) {
                    for w in waiters {
                        let _ = w.send(Err(JournalError::Full {
                            namespace: self.namespace.clone(),
                            name: self.name.clone(),
                            entries,
                        }));
                    }
                }
            }
        }
        if batch.adds.is_empty() && batch.trims.is_empty() {
            self.state().trimming.clear();
            return true;
        }
        let mut data = serde_json::Map::new();
        for t in &batch.trims {
            data.insert(t.clone(), serde_json::Value::Null);
        }
        for (name, w) in &written {
            data.insert(name.clone(), serde_json::Value::String(w.json.clone()));
        }
        let patch = serde_json::json!({ "data": data });
        let api = &self.api;
        let mut result = self.patch_prepaid(&patch).await;
        if matches!(&result, Err(kube::Error::Api(s)) if s.is_not_found()) {
            // Deleted behind our back: write it anew with all it held, then
            // this batch on top.
            let held = {
                let state = self.state();
                state
                    .entries
                    .iter()
                    .map(|(k, w)| (k.clone(), w.json.clone()))
                    .collect()
            };
            tracing::warn!(journal = %self.display(), "the intent journal was deleted; writing it anew");
            let cm = journal_object(&self.namespace, &self.name, held);
            result = match api.create(&PostParams::default(), &cm).await {
                Ok(_) => {
                    api.patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                }
                Err(e) => Err(e),
            };
        }
        match result {
            Ok(_) => {
                let mut state = self.state();
                state.trimming.clear();
                for t in &batch.trims {
                    state.entries.remove(t);
                }
                state.entries.append(&mut written);
                for (_, (_, waiters)) in batch.adds {
                    for w in waiters {
                        let _ = w.send(Ok(()));
                    }
                }
                true
            }
            Err(e) => {
                let error = forbidden_or(e, "patch", &self.namespace, &self.name);
                tracing::warn!(journal = %self.display(), error = %error, "journal write failed");
                let mut state = self.state();
                state.trimming.clear();
                for t in batch.trims {
                    // Unless a new intent for the name came meanwhile.
                    if !state.adds.contains_key(&t) {
                        state.trims.insert(t);
                    }
                }
                for (_, (_, waiters)) in batch.adds {
                    for w in waiters {
                        let _ = w.send(Err(error.clone()));
                    }
                }
                false
            }
        }
    }
}

/// A token bucket that never makes a test wait.
#[cfg(test)]
pub(crate) fn test_limiter() -> Limiter {
    Limiter::new(1e6, 1_000_000, Default::default())
}

#[cfg(test)]
mod tests;
