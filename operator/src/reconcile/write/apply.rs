//! Server-side apply that never takes over what this operator does not own.
//!
//! Before writing an object, the live one (if any) is read: a namespaced object
//! must carry our controller owner reference, a cluster-scoped one our
//! `csiops.dev/owner-uid` label. Anything else is a Conflict: the operator
//! never overwrites or deletes what it does not own.

use std::fmt::Debug;

use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions, PropagationPolicy};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::reconcile::error::Error;
use crate::reconcile::watch::owned::{Owned, APPLIED_HASH};
use crate::render::labels::{OWNER_NAME, OWNER_NAMESPACE, OWNER_UID};

/// The one field manager of every write this operator makes.
pub const FIELD_MANAGER: &str = "csiops-operator";

/// Who must own an object for us to touch it.
#[derive(Clone, Copy, Debug)]
pub struct Owner<'a> {
    pub uid: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

/// Whether `meta` belongs to `owner`: a controller owner reference with its
/// UID, or (cluster-scoped objects) the owner-uid label.
pub fn is_owned_by(meta: &kube::api::ObjectMeta, owner: Owner<'_>) -> bool {
    let by_ref = meta
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.uid == owner.uid && r.controller == Some(true));
    let by_label = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(OWNER_UID))
        .is_some_and(|u| u == owner.uid);
    by_ref || by_label
}

/// ` (owned by ns/name)` when the object names its csiops owner, else empty.
fn owner_detail(meta: &kube::api::ObjectMeta) -> String {
    let labels = meta.labels.as_ref();
    let ns = labels.and_then(|l| l.get(OWNER_NAMESPACE));
    let name = labels.and_then(|l| l.get(OWNER_NAME));
    match (ns, name) {
        (Some(ns), Some(name)) => format!(" (owned by CSIDriverDeployment {ns}/{name})"),
        _ => " (not managed by csiops)".to_string(),
    }
}

/// Stable hash of what we are about to apply.
pub fn content_hash<K: Serialize>(obj: &K) -> Result<String, serde_json::Error> {
    let bytes = serde_json::to_vec(obj)?;
    let digest = Sha256::digest(&bytes);
    Ok(digest.iter().take(8).map(|b| format!("{b:02x}")).collect())
}

/// What an apply did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    Created,
    Updated,
    /// Deleted and created again (an immutable object whose content changed).
    Recreated,
    Unchanged,
}

/// How [`apply`] treats a live object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Always apply. Workloads: their live replicas may have been changed by
    /// a scale-down and must be re-asserted.
    Always,
    /// Skip the write when the live `APPLIED_HASH` matches (supporting objects:
    /// an unchanged object costs a read and no write).
    IfChanged,
    /// Like `IfChanged`, but a changed object is deleted and created again,
    /// for kinds whose fields are immutable (StorageClass).
    RecreateIfChanged,
}

/// Applies `desired` as `mode` says. When the watches say the live object
/// already is what would be applied (see [`Owned`]), nothing is sent;
/// otherwise ownership of the live object is checked first (one read).
pub async fn apply<K>(
    api: &Api<K>,
    kind: &'static str,
    desired: K,
    owner: Owner<'_>,
    mode: Mode,
    known: &Owned,
) -> Result<Applied, Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    Ok(apply_inner(api, kind, desired, owner, mode, known, None)
        .await?
        .0)
}

/// How [`apply_checked`] finds the fields of an object that the API server
/// would not store.
pub struct StoreCheck<K> {
    /// The fields of a desired object (first) that the API server would
    /// not store (second: what a server-side dry run returned), e.g. a field
    /// behind a feature gate that is off, which the API server drops without
    /// an error.
    pub unstored: fn(&K, &K) -> Vec<String>,
    /// A field the API server does not know at all (its API is older than
    /// the field) makes it refuse the whole apply. Given the refusal's
    /// message, removes the field it names from the object and returns its
    /// name; `None` when the message names no field that may be left out.
    /// Each `Some` must remove a field that was set, so asking again until
    /// `None` ends.
    pub unknown: fn(&mut K, &str) -> Option<String>,
}

impl<K> Clone for StoreCheck<K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for StoreCheck<K> {}

/// Suffix of an [`APPLIED_HASH`] whose object the API server did not store
/// whole: it never equals a hash, so the object is applied again.
pub const INCOMPLETE: &str = "-incomplete";

/// [`apply`], asking the API server first (a server-side dry run) what it
/// would store of a changed object. When the server refuses a field it does
/// not know (`check.unknown`), that field is left out and the dry run asked
/// again; when `check.unstored` names fields it would drop, the object is
/// applied all the same. Either way the object is stamped with an applied
/// hash that never matches (`<hash>-incomplete`): each reconcile asks
/// again — a write of the same content, which changes nothing on the
/// server — and once the server stores the fields (upgraded, or its feature
/// gate turned on) the object is applied whole and settles. Also returns
/// the fields left out or dropped (empty when none, or when nothing had to
/// be applied).
pub async fn apply_checked<K>(
    api: &Api<K>,
    kind: &'static str,
    desired: K,
    owner: Owner<'_>,
    mode: Mode,
    known: &Owned,
    check: StoreCheck<K>,
) -> Result<(Applied, Vec<String>), Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    apply_inner(api, kind, desired, owner, mode, known, Some(check)).await
}

async fn apply_inner<K>(
    api: &Api<K>,
    kind: &'static str,
    mut desired: K,
    owner: Owner<'_>,
    mode: Mode,
    known: &Owned,
    check: Option<StoreCheck<K>>,
) -> Result<(Applied, Vec<String>), Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    let name = desired.name_any();
    let hash = content_hash(&desired).map_err(|source| Error::Serialize {
        kind,
        name: name.clone(),
        source,
    })?;
    let namespace = desired.namespace().unwrap_or_default();
    if let Some(k) = known.get(kind, &namespace, &name) {
        let same = k.applied_hash.as_deref() == Some(hash.as_str());
        // A workload is re-asserted unless its spec is still the one our
        // last apply left: its generation moves with any spec edit.
        let untouched = k.applied_generation.is_some() && k.generation == k.applied_generation;
        if same && (mode != Mode::Always || untouched) {
            return Ok((Applied::Unchanged, Vec::new()));
        }
    }
    let live = api
        .get_opt(&name)
        .await
        .map_err(|e| Error::read("get", format!("{kind} {name}"), e))?;
    if let Some(live) = &live {
        if !is_owned_by(live.meta(), owner) {
            return Err(Error::NotOwned {
                kind,
                name,
                detail: owner_detail(live.meta()),
            });
        }
        let unchanged = live.annotations().get(APPLIED_HASH) == Some(&hash);
        if unchanged && mode != Mode::Always {
            known.applied(kind, live.meta());
            return Ok((Applied::Unchanged, Vec::new()));
        }
    }
    let mut outcome = if live.is_some() {
        Applied::Updated
    } else {
        Applied::Created
    };
    if let (Some(live), Mode::RecreateIfChanged) = (&live, mode) {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: live.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(Error::from_write(kind, &name, e)),
        }
        outcome = Applied::Recreated;
    }
    desired
        .annotations_mut()
        .insert(APPLIED_HASH.to_string(), hash.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut dropped = Vec::new();
    if let Some(check) = check {
        let mut dry_run = params.clone();
        dry_run.dry_run = true;
        let would_store = loop {
            let refused = match api.patch(&name, &dry_run, &Patch::Apply(&desired)).await {
                Ok(would_store) => break would_store,
                Err(e) => e,
            };
            let unknown = match &refused {
                kube::Error::Api(s) => (check.unknown)(&mut desired, &s.message),
                _ => None,
            };
            match unknown {
                Some(field) => dropped.push(field),
                None => return Err(Error::from_write(kind, &name, refused)),
            }
        };
        dropped.extend((check.unstored)(&desired, &would_store));
        if !dropped.is_empty() {
            desired
                .annotations_mut()
                .insert(APPLIED_HASH.to_string(), format!("{hash}{INCOMPLETE}"));
        }
    }
    let written = api
        .patch(&name, &params, &Patch::Apply(&desired))
        .await
        .map_err(|e| Error::from_write(kind, &name, e))?;
    known.applied(kind, written.meta());
    Ok((outcome, dropped))
}

/// Deletes the named object if it exists and is ours; `Ok(false)` if absent.
/// The UID precondition makes sure a same-named replacement is never hit.
pub async fn delete_owned<K>(
    api: &Api<K>,
    kind: &'static str,
    name: &str,
    owner: Owner<'_>,
    known: &Owned,
) -> Result<bool, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let Some(live) = api
        .get_opt(name)
        .await
        .map_err(|e| Error::read("get", format!("{kind} {name}"), e))?
    else {
        return Ok(false);
    };
    known.forget(kind, &live.namespace().unwrap_or_default(), name);
    if !is_owned_by(live.meta(), owner) {
        return Err(Error::NotOwned {
            kind,
            name: name.to_string(),
            detail: owner_detail(live.meta()),
        });
    }
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        preconditions: Some(Preconditions {
            uid: live.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(false),
        Err(e) => Err(Error::from_write(kind, name, e)),
    }
}

/// A cached object, if it exists and is ours; a Conflict if someone else's.
pub fn owned_only<K>(
    live: Option<K>,
    kind: &'static str,
    owner: Owner<'_>,
) -> Result<Option<K>, Error>
where
    K: Resource,
{
    match live {
        Some(live) if !is_owned_by(live.meta(), owner) => Err(Error::NotOwned {
            kind,
            name: live.meta().name.clone().unwrap_or_default(),
            detail: owner_detail(live.meta()),
        }),
        other => Ok(other),
    }
}

/// The live object, if it exists and is ours; a Conflict if someone else's.
pub async fn get_owned<K>(
    api: &Api<K>,
    kind: &'static str,
    name: &str,
    owner: Owner<'_>,
) -> Result<Option<K>, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    match api
        .get_opt(name)
        .await
        .map_err(|e| Error::read("get", format!("{kind} {name}"), e))?
    {
        Some(live) if !is_owned_by(live.meta(), owner) => Err(Error::NotOwned {
            kind,
            name: name.to_string(),
            detail: owner_detail(live.meta()),
        }),
        other => Ok(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn meta(json: serde_json::Value) -> kube::api::ObjectMeta {
        serde_json::from_value(json).expect("meta fixture")
    }

    const OWNER: Owner<'static> = Owner {
        uid: "u-1",
        namespace: "ns",
        name: "hp",
    };

    #[test]
    fn ownership_needs_our_controller_reference_or_our_uid_label() {
        let ours = meta(serde_json::json!({"ownerReferences": [
            {"apiVersion": "csiops.dev/v1alpha1", "kind": "CSIDriverDeployment", "name": "hp", "uid": "u-1", "controller": true}
        ]}));
        assert!(is_owned_by(&ours, OWNER));
        let not_controller = meta(serde_json::json!({"ownerReferences": [
            {"apiVersion": "v1", "kind": "X", "name": "hp", "uid": "u-1"}
        ]}));
        assert!(!is_owned_by(&not_controller, OWNER));
        let labelled = meta(serde_json::json!({"labels": {OWNER_UID: "u-1"}}));
        assert!(is_owned_by(&labelled, OWNER));
        let other = meta(
            serde_json::json!({"labels": {OWNER_UID: "u-2", OWNER_NAMESPACE: "a", OWNER_NAME: "b"}}),
        );
        assert!(!is_owned_by(&other, OWNER));
        assert_eq!(owner_detail(&other), " (owned by CSIDriverDeployment a/b)");
        assert_eq!(
            owner_detail(&meta(serde_json::json!({}))),
            " (not managed by csiops)"
        );
    }

    #[test]
    fn content_hash_is_stable_and_content_sensitive() {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("a".into());
        let h1 = content_hash(&cm).expect("hash");
        assert_eq!(h1, content_hash(&cm.clone()).expect("hash"));
        cm.data = Some([("k".to_string(), "v".to_string())].into());
        assert_ne!(h1, content_hash(&cm).expect("hash"));
        assert_eq!(h1.len(), 16);
    }
}
