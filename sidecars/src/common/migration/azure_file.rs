//! `kubernetes.io/azure-file` ↔ `file.csi.azure.com`.
//!
//! - class: unchanged (the driver reads the in-tree parameters);
//! - volume: the handle is `<resource group>#<account>#<share>#<PV or
//!   volume name>#<secret namespace>`; the account comes from the Secret's
//!   name `azure-storage-account-<account>-secret` (else the whole name is
//!   taken for it), the resource group from the PV annotation
//!   `kubernetes.io/azure-file-resource-group`. The Secret becomes the
//!   node-stage secret, in the source's namespace, else the claim's (a PV)
//!   or the pod's (an inline volume, `default` without one). Back to
//!   in-tree, share and Secret come from the attributes or the node-stage
//!   secret, and what they leave out from the handle.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use k8s_openapi::api::core::v1::{
    AzureFilePersistentVolumeSource, CSIPersistentVolumeSource, PersistentVolume, SecretReference,
    Volume,
};
use regex::Regex;

use super::{csi_of, inline_pv, non_empty, only_true, MigrationError, Plugin};

const DRIVER: &str = Plugin::AzureFile.driver_name();
const SHARE_NAME: &str = "sharename";
const SECRET_NAME: &str = "secretname";
const SECRET_NAMESPACE: &str = "secretnamespace";
const DEFAULT_SECRET_NAMESPACE: &str = "default";
/// Where the in-tree PV keeps its storage account's resource group.
pub const RESOURCE_GROUP_ANNOTATION: &str = "kubernetes.io/azure-file-resource-group";

static SECRET_NAME_FORMAT: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"azure-storage-account-(.+)-secret").ok());

/// The storage account in a Secret name `azure-storage-account-<a>-secret`;
/// any other name is taken as the account itself.
pub fn account_of_secret(secret_name: &str) -> String {
    SECRET_NAME_FORMAT
        .as_ref()
        .and_then(|re| re.captures(secret_name))
        .and_then(|c| c.get(1))
        .map_or_else(|| secret_name.to_string(), |m| m.as_str().to_string())
}

fn handle(resource_group: &str, account: &str, share: &str, name: &str, namespace: &str) -> String {
    format!("{resource_group}#{account}#{share}#{name}#{namespace}")
}

fn csi_source(
    handle: String,
    share: &str,
    secret: &str,
    namespace: &str,
    read_only: Option<bool>,
) -> CSIPersistentVolumeSource {
    CSIPersistentVolumeSource {
        driver: DRIVER.to_string(),
        volume_handle: handle,
        read_only: only_true(read_only.unwrap_or(false)),
        volume_attributes: Some(BTreeMap::from([(
            SHARE_NAME.to_string(),
            share.to_string(),
        )])),
        node_stage_secret_ref: Some(SecretReference {
            name: non_empty(secret),
            namespace: non_empty(namespace),
        }),
        ..Default::default()
    }
}

pub(super) fn pv_to_csi(pv: &mut PersistentVolume) -> Result<(), MigrationError> {
    let source = pv
        .spec
        .as_ref()
        .and_then(|s| s.azure_file.clone())
        .ok_or(MigrationError::NotInTree)?;
    let account = account_of_secret(&source.secret_name);
    let resource_group = pv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RESOURCE_GROUP_ANNOTATION))
        .cloned()
        .unwrap_or_default();
    // The Secret's namespace: the source's (even empty), else the claim's.
    // Reading a pod for it is not possible: there may be none yet.
    let namespace = match &source.secret_namespace {
        Some(ns) => ns.clone(),
        None => pv
            .spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .and_then(|r| r.namespace.clone())
            .unwrap_or_default(),
    };
    if namespace.is_empty() {
        return Err(MigrationError::AzureFileSecretNamespace);
    }
    let name = pv.metadata.name.clone().unwrap_or_default();
    let csi = csi_source(
        handle(
            &resource_group,
            &account,
            &source.share_name,
            &name,
            &namespace,
        ),
        &source.share_name,
        &source.secret_name,
        &namespace,
        source.read_only,
    );
    let spec = pv.spec.get_or_insert_default();
    spec.azure_file = None;
    spec.csi = Some(csi);
    Ok(())
}

pub(super) fn pv_to_in_tree(pv: &mut PersistentVolume) -> Result<(), MigrationError> {
    let csi = csi_of(pv)?;
    let mut source = AzureFilePersistentVolumeSource {
        read_only: only_true(csi.read_only.unwrap_or(false)),
        ..Default::default()
    };
    for (k, v) in csi.volume_attributes.iter().flatten() {
        match k.to_lowercase().as_str() {
            SHARE_NAME => source.share_name = v.clone(),
            SECRET_NAME => source.secret_name = v.clone(),
            SECRET_NAMESPACE => source.secret_namespace = Some(v.clone()),
            _ => {}
        }
    }
    if let Some(r) = csi
        .node_stage_secret_ref
        .as_ref()
        .filter(|r| r.name.as_deref().is_some_and(|n| !n.is_empty()))
    {
        source.secret_name = r.name.clone().unwrap_or_default();
        source.secret_namespace = Some(r.namespace.clone().unwrap_or_default());
    }
    let mut resource_group = String::new();
    if source.share_name.is_empty() || source.secret_name.is_empty() {
        let parts: Vec<&str> = csi.volume_handle.split('#').collect();
        if parts.len() < 3 {
            return Err(MigrationError::VolumeHandle {
                handle: csi.volume_handle.clone(),
                why: "should contain at least two #".into(),
            });
        }
        if source.share_name.is_empty() {
            source.share_name = parts[2].to_string();
        }
        if source.secret_name.is_empty() {
            source.secret_name = format!("azure-storage-account-{}-secret", parts[1]);
        }
        resource_group = parts[0].to_string();
    }
    source
        .secret_namespace
        .get_or_insert_with(|| DEFAULT_SECRET_NAMESPACE.to_string());
    let spec = pv.spec.get_or_insert_default();
    spec.csi = None;
    spec.azure_file = Some(source);
    if !resource_group.is_empty() {
        pv.metadata
            .annotations
            .get_or_insert_default()
            .insert(RESOURCE_GROUP_ANNOTATION.to_string(), resource_group);
    }
    Ok(())
}

pub(super) fn inline_to_csi(volume: &Volume, pod_namespace: &str) -> PersistentVolume {
    let source = volume.azure_file.clone().unwrap_or_default();
    let account = account_of_secret(&source.secret_name);
    let namespace = if pod_namespace.is_empty() {
        DEFAULT_SECRET_NAMESPACE
    } else {
        pod_namespace
    };
    let id = handle("", &account, &source.share_name, &volume.name, namespace);
    // Unique per share and pod volume.
    let name = id.clone();
    let csi = csi_source(
        id,
        &source.share_name,
        &source.secret_name,
        namespace,
        source.read_only,
    );
    inline_pv(name, csi, "ReadWriteMany")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts() {
        assert_eq!(
            account_of_secret("azure-storage-account-acct1-secret"),
            "acct1"
        );
        assert_eq!(
            account_of_secret("x-azure-storage-account-a-b-secret-y"),
            "a-b"
        );
        assert_eq!(account_of_secret("plain"), "plain");
    }
}
