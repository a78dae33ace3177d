//! StorageClass parameters: what goes to CreateVolume, which secrets are
//! referenced for which operation, and the filesystem type.
//!
//! - Keys with the reserved prefix `csi.storage.k8s.io/` are the
//!   provisioner's own and are stripped from `CreateVolumeRequest.parameters`;
//!   an unknown key with that prefix is an error (upstream: "found unknown
//!   parameter key ... with reserved namespace"), so a misspelt secret key
//!   fails loudly instead of provisioning without credentials.
//! - The deprecated secret keys of the CSI design doc (`csiProvisionerSecretName`,
//!   `csiProvisionerSecretNamespace`, `csiControllerPublishSecret*`,
//!   `csiNodeStageSecret*`, `csiNodePublishSecret*`) and the deprecated
//!   `fsType` are honoured but, as upstream, still passed through to the
//!   driver ("Deprecated parameters prefixed with "csi" are not stripped to
//!   preserve backwards compatibility").
//! - Secret names and namespaces may be templates; see [`secret_ref`].
//! - `--extra-create-metadata` adds `csi.storage.k8s.io/pvc/name`,
//!   `/pvc/namespace` and `/pv/name` after stripping, so a StorageClass cannot
//!   forge them.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use k8s_openapi::api::core::v1::SecretReference;

use super::naming::{is_dns1123_label, is_dns1123_subdomain};

/// Prefix of the parameters the provisioner keeps to itself.
pub const PARAMETER_PREFIX: &str = "csi.storage.k8s.io/";
/// Filesystem type of the volume.
pub const FS_TYPE_KEY: &str = "csi.storage.k8s.io/fstype";
/// Deprecated filesystem type key (matched case-insensitively, as upstream).
pub const DEPRECATED_FS_TYPE_KEY: &str = "fsType";
/// Secret used for every operation that has no secret keys of its own.
pub const DEFAULT_SECRET_NAME_KEY: &str = "csi.storage.k8s.io/secret-name";
pub const DEFAULT_SECRET_NAMESPACE_KEY: &str = "csi.storage.k8s.io/secret-namespace";
/// `--extra-create-metadata` parameters.
pub const PVC_NAME_KEY: &str = "csi.storage.k8s.io/pvc/name";
pub const PVC_NAMESPACE_KEY: &str = "csi.storage.k8s.io/pvc/namespace";
pub const PV_NAME_KEY: &str = "csi.storage.k8s.io/pv/name";

/// The operation a secret is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SecretKind {
    /// CreateVolume / DeleteVolume (fetched by the provisioner itself).
    Provisioner,
    /// ControllerPublish / ControllerUnpublish (`PV.spec.csi.controllerPublishSecretRef`).
    ControllerPublish,
    /// NodeStage / NodeUnstage (`nodeStageSecretRef`).
    NodeStage,
    /// NodePublish / NodeUnpublish (`nodePublishSecretRef`).
    NodePublish,
    /// ControllerExpandVolume (`controllerExpandSecretRef`).
    ControllerExpand,
    /// NodeExpandVolume (`nodeExpandSecretRef`).
    NodeExpand,
    /// ControllerModifyVolume (the external-resizer's, for a
    /// VolumeAttributesClass change): the PV has no field for it, so it is
    /// written as the PV annotations `volume.kubernetes.io/controller-modify-secret-name`
    /// and `-namespace` (see [`super::pv`]).
    ControllerModify,
}

impl SecretKind {
    pub const ALL: [SecretKind; 7] = [
        SecretKind::Provisioner,
        SecretKind::ControllerPublish,
        SecretKind::NodeStage,
        SecretKind::NodePublish,
        SecretKind::ControllerExpand,
        SecretKind::NodeExpand,
        SecretKind::ControllerModify,
    ];

    /// `(name key, namespace key)` with the reserved prefix.
    pub fn keys(self) -> (&'static str, &'static str) {
        match self {
            SecretKind::Provisioner => (
                "csi.storage.k8s.io/provisioner-secret-name",
                "csi.storage.k8s.io/provisioner-secret-namespace",
            ),
            SecretKind::ControllerPublish => (
                "csi.storage.k8s.io/controller-publish-secret-name",
                "csi.storage.k8s.io/controller-publish-secret-namespace",
            ),
            SecretKind::NodeStage => (
                "csi.storage.k8s.io/node-stage-secret-name",
                "csi.storage.k8s.io/node-stage-secret-namespace",
            ),
            SecretKind::NodePublish => (
                "csi.storage.k8s.io/node-publish-secret-name",
                "csi.storage.k8s.io/node-publish-secret-namespace",
            ),
            SecretKind::ControllerExpand => (
                "csi.storage.k8s.io/controller-expand-secret-name",
                "csi.storage.k8s.io/controller-expand-secret-namespace",
            ),
            SecretKind::NodeExpand => (
                "csi.storage.k8s.io/node-expand-secret-name",
                "csi.storage.k8s.io/node-expand-secret-namespace",
            ),
            SecretKind::ControllerModify => (
                "csi.storage.k8s.io/controller-modify-secret-name",
                "csi.storage.k8s.io/controller-modify-secret-namespace",
            ),
        }
    }

    /// The deprecated `(name key, namespace key)`, where one exists.
    pub fn deprecated_keys(self) -> Option<(&'static str, &'static str)> {
        match self {
            SecretKind::Provisioner => {
                Some(("csiProvisionerSecretName", "csiProvisionerSecretNamespace"))
            }
            SecretKind::ControllerPublish => Some((
                "csiControllerPublishSecretName",
                "csiControllerPublishSecretNamespace",
            )),
            SecretKind::NodeStage => {
                Some(("csiNodeStageSecretName", "csiNodeStageSecretNamespace"))
            }
            SecretKind::NodePublish => {
                Some(("csiNodePublishSecretName", "csiNodePublishSecretNamespace"))
            }
            SecretKind::ControllerExpand
            | SecretKind::NodeExpand
            | SecretKind::ControllerModify => None,
        }
    }

    /// Whether the name template may use `${pvc.annotations['KEY']}`. The
    /// provisioner secret may not: upstream resolves it against a claim that
    /// carries only name and namespace (the same at deletion, from claimRef).
    pub fn allows_annotations(self) -> bool {
        self != SecretKind::Provisioner
    }
}

impl fmt::Display for SecretKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SecretKind::Provisioner => "Provisioner",
            SecretKind::ControllerPublish => "ControllerPublish",
            SecretKind::NodeStage => "NodeStage",
            SecretKind::NodePublish => "NodePublish",
            SecretKind::ControllerExpand => "ControllerExpand",
            SecretKind::NodeExpand => "NodeExpand",
            SecretKind::ControllerModify => "ControllerModify",
        })
    }
}

/// A resolved secret reference (the Secret may or may not exist).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    pub name: String,
    pub namespace: String,
}

impl From<&SecretRef> for SecretReference {
    fn from(r: &SecretRef) -> Self {
        SecretReference {
            name: Some(r.name.clone()),
            namespace: Some(r.namespace.clone()),
        }
    }
}

/// What templates are resolved against.
#[derive(Debug, Clone, Copy)]
pub struct TemplateContext<'a> {
    pub pv_name: &'a str,
    pub pvc_name: &'a str,
    pub pvc_namespace: &'a str,
    /// The claim's annotations (`None` at deletion, where only claimRef is known).
    pub pvc_annotations: Option<&'a BTreeMap<String, String>>,
}

/// Why the parameters cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamsError {
    #[error("found unknown parameter key {0:?} with reserved prefix {PARAMETER_PREFIX:?}")]
    UnknownReservedKey(String),
    #[error("fstype specified in parameters more than once: {0:?}")]
    FsTypeConflict(Vec<String>),
    #[error(
        "{secret} secret specified with both the deprecated {deprecated:?} and the {key:?} key"
    )]
    SecretConflict {
        secret: SecretKind,
        deprecated: &'static str,
        key: &'static str,
    },
    #[error("{secret} secret: {present:?} is set but {missing:?} is not; both must be specified")]
    SecretIncomplete {
        secret: SecretKind,
        present: &'static str,
        missing: &'static str,
    },
    #[error("{secret} secret: parameter {key:?} is empty")]
    SecretEmpty {
        secret: SecretKind,
        key: &'static str,
    },
    #[error("parameter {key:?}: malformed template {template:?} (a `$` must start `${{token}}`)")]
    TemplateSyntax { key: &'static str, template: String },
    #[error("parameter {key:?}: unknown token ${{{token}}} in {template:?}")]
    UnknownToken {
        key: &'static str,
        token: String,
        template: String,
    },
    #[error("parameter {key:?}: token ${{{token}}} is not allowed here (allowed: {allowed})")]
    TokenNotAllowed {
        key: &'static str,
        token: String,
        allowed: &'static str,
    },
    #[error(
        "parameter {key:?}: the claim has no annotation {annotation:?} (template {template:?})"
    )]
    MissingAnnotation {
        key: &'static str,
        annotation: String,
        template: String,
    },
    #[error("parameter {key:?}: {template:?} resolved to {resolved:?}, which is not a valid secret name")]
    InvalidSecretName {
        key: &'static str,
        template: String,
        resolved: String,
    },
    #[error("parameter {key:?}: {template:?} resolved to {resolved:?}, which is not a valid namespace name")]
    InvalidSecretNamespace {
        key: &'static str,
        template: String,
        resolved: String,
    },
}

/// Every reserved key a StorageClass may carry.
fn is_known_reserved(key: &str) -> bool {
    key == FS_TYPE_KEY
        || key == DEFAULT_SECRET_NAME_KEY
        || key == DEFAULT_SECRET_NAMESPACE_KEY
        || SecretKind::ALL.iter().any(|k| {
            let (n, ns) = k.keys();
            key == n || key == ns
        })
}

/// `--extra-create-metadata` values.
#[derive(Debug, Clone, Copy)]
pub struct ExtraCreateMetadata<'a> {
    pub pvc_name: &'a str,
    pub pvc_namespace: &'a str,
    pub pv_name: &'a str,
}

/// `CreateVolumeRequest.parameters`: the class's parameters without the
/// reserved keys, plus the extra metadata when enabled.
pub fn create_volume_parameters(
    class_params: &BTreeMap<String, String>,
    extra: Option<&ExtraCreateMetadata<'_>>,
) -> Result<HashMap<String, String>, ParamsError> {
    let mut out = HashMap::with_capacity(class_params.len() + 3);
    for (k, v) in class_params {
        if k.starts_with(PARAMETER_PREFIX) {
            if !is_known_reserved(k) {
                return Err(ParamsError::UnknownReservedKey(k.clone()));
            }
        } else {
            out.insert(k.clone(), v.clone());
        }
    }
    if let Some(m) = extra {
        out.insert(PVC_NAME_KEY.into(), m.pvc_name.into());
        out.insert(PVC_NAMESPACE_KEY.into(), m.pvc_namespace.into());
        out.insert(PV_NAME_KEY.into(), m.pv_name.into());
    }
    Ok(out)
}

/// The filesystem type: `csi.storage.k8s.io/fstype`, or the deprecated
/// `fsType` (any case), else `default` (`--default-fstype`). Both keys at once
/// is an error. `None` means "let the driver choose".
pub fn fs_type(
    class_params: &BTreeMap<String, String>,
    default: Option<&str>,
) -> Result<Option<String>, ParamsError> {
    let found: Vec<(&String, &String)> = class_params
        .iter()
        .filter(|(k, _)| *k == FS_TYPE_KEY || k.eq_ignore_ascii_case("fstype"))
        .collect();
    if found.len() > 1 {
        return Err(ParamsError::FsTypeConflict(
            found.into_iter().map(|(k, _)| k.clone()).collect(),
        ));
    }
    let value = found
        .first()
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty())
        .or(default);
    Ok(value.filter(|v| !v.is_empty()).map(str::to_string))
}

/// The name and namespace templates of one key pair, if set.
fn templates<'p>(
    secret: SecretKind,
    params: &'p BTreeMap<String, String>,
    pairs: &[(&'static str, &'static str)],
) -> Result<Option<(Field<'p>, Field<'p>)>, ParamsError> {
    let pick = |which: fn(&(&'static str, &'static str)) -> &'static str| {
        let mut hit: Option<Field<'p>> = None;
        for pair in pairs {
            let key = which(pair);
            if let Some(v) = params.get(key) {
                if let Some(prev) = hit {
                    return Err(ParamsError::SecretConflict {
                        secret,
                        deprecated: prev.key,
                        key,
                    });
                }
                hit = Some(Field { key, template: v });
            }
        }
        Ok(hit)
    };
    let name = pick(|p| p.0)?;
    let namespace = pick(|p| p.1)?;
    match (name, namespace) {
        (None, None) => Ok(None),
        (Some(n), None) => Err(ParamsError::SecretIncomplete {
            secret,
            present: n.key,
            missing: pairs.last().map_or("", |p| p.1),
        }),
        (None, Some(ns)) => Err(ParamsError::SecretIncomplete {
            secret,
            present: ns.key,
            missing: pairs.last().map_or("", |p| p.0),
        }),
        (Some(n), Some(ns)) => {
            for f in [n, ns] {
                if f.template.is_empty() {
                    return Err(ParamsError::SecretEmpty { secret, key: f.key });
                }
            }
            Ok(Some((n, ns)))
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Field<'p> {
    key: &'static str,
    template: &'p str,
}

/// The secret for `kind`, resolved from the class parameters, or `None` when
/// the class names none (neither the operation's keys nor the default
/// `csi.storage.k8s.io/secret-name`/`-namespace`).
///
/// Templates (upstream's tokens; anything else is an error):
///
/// | field     | `${pv.name}` | `${pvc.namespace}` | `${pvc.name}` | `${pvc.annotations['KEY']}` |
/// |-----------|:---:|:---:|:---:|:---:|
/// | namespace | yes | yes | no  | no |
/// | name      | yes | yes | yes | all but the provisioner secret |
///
/// The namespace never depends on what the claim's owner controls (its name
/// or annotations); the resolved namespace must be a DNS-1123 label and the
/// name a DNS-1123 subdomain.
pub fn secret_ref(
    kind: SecretKind,
    class_params: &BTreeMap<String, String>,
    ctx: &TemplateContext<'_>,
) -> Result<Option<SecretRef>, ParamsError> {
    let mut pairs = Vec::with_capacity(2);
    if let Some(d) = kind.deprecated_keys() {
        pairs.push(d);
    }
    pairs.push(kind.keys());
    let found = match templates(kind, class_params, &pairs)? {
        Some(t) => Some(t),
        None => templates(
            kind,
            class_params,
            &[(DEFAULT_SECRET_NAME_KEY, DEFAULT_SECRET_NAMESPACE_KEY)],
        )?,
    };
    let Some((name, namespace)) = found else {
        return Ok(None);
    };

    let resolved_ns = resolve(namespace, false, false, ctx)?;
    if !is_dns1123_label(&resolved_ns) {
        return Err(ParamsError::InvalidSecretNamespace {
            key: namespace.key,
            template: namespace.template.to_string(),
            resolved: resolved_ns,
        });
    }
    let resolved_name = resolve(name, true, kind.allows_annotations(), ctx)?;
    if !is_dns1123_subdomain(&resolved_name) {
        return Err(ParamsError::InvalidSecretName {
            key: name.key,
            template: name.template.to_string(),
            resolved: resolved_name,
        });
    }
    Ok(Some(SecretRef {
        name: resolved_name,
        namespace: resolved_ns,
    }))
}

/// The secret references a provisioned PV carries: five in its CSI source,
/// the ControllerModify one in annotations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PvSecretRefs {
    pub controller_publish: Option<SecretRef>,
    pub node_stage: Option<SecretRef>,
    pub node_publish: Option<SecretRef>,
    pub controller_expand: Option<SecretRef>,
    pub node_expand: Option<SecretRef>,
    pub controller_modify: Option<SecretRef>,
}

/// All six PV secret references (every one but the provisioner's). As
/// upstream, the ControllerModify one is resolved (and falls back to the
/// default `csi.storage.k8s.io/secret-name`) whether or not the claim names
/// a VolumeAttributesClass: the class may be set on the claim later.
pub fn pv_secret_refs(
    class_params: &BTreeMap<String, String>,
    ctx: &TemplateContext<'_>,
) -> Result<PvSecretRefs, ParamsError> {
    Ok(PvSecretRefs {
        controller_publish: secret_ref(SecretKind::ControllerPublish, class_params, ctx)?,
        node_stage: secret_ref(SecretKind::NodeStage, class_params, ctx)?,
        node_publish: secret_ref(SecretKind::NodePublish, class_params, ctx)?,
        controller_expand: secret_ref(SecretKind::ControllerExpand, class_params, ctx)?,
        node_expand: secret_ref(SecretKind::NodeExpand, class_params, ctx)?,
        controller_modify: secret_ref(SecretKind::ControllerModify, class_params, ctx)?,
    })
}

const ANNOTATION_OPEN: &str = "pvc.annotations['";
const ANNOTATION_CLOSE: &str = "']";

fn resolve(
    field: Field<'_>,
    is_name: bool,
    annotations_allowed: bool,
    ctx: &TemplateContext<'_>,
) -> Result<String, ParamsError> {
    let allowed = match (is_name, annotations_allowed) {
        (false, _) => "${pv.name}, ${pvc.namespace}",
        (true, false) => "${pv.name}, ${pvc.namespace}, ${pvc.name}",
        (true, true) => "${pv.name}, ${pvc.namespace}, ${pvc.name}, ${pvc.annotations['KEY']}",
    };
    let template = field.template;
    let syntax = || ParamsError::TemplateSyntax {
        key: field.key,
        template: template.to_string(),
    };
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(dollar) = rest.find('$') {
        out.push_str(&rest[..dollar]);
        let after = rest[dollar + 1..].strip_prefix('{').ok_or_else(syntax)?;
        let close = after.find('}').ok_or_else(syntax)?;
        let token = &after[..close];
        if token.is_empty() {
            return Err(syntax());
        }
        let not_allowed = || ParamsError::TokenNotAllowed {
            key: field.key,
            token: token.to_string(),
            allowed,
        };
        let value: &str = match token {
            "pv.name" => ctx.pv_name,
            "pvc.namespace" => ctx.pvc_namespace,
            "pvc.name" if is_name => ctx.pvc_name,
            "pvc.name" => return Err(not_allowed()),
            t if t.starts_with(ANNOTATION_OPEN)
                && t.ends_with(ANNOTATION_CLOSE)
                && t.len() > ANNOTATION_OPEN.len() + ANNOTATION_CLOSE.len() =>
            {
                if !(is_name && annotations_allowed) {
                    return Err(not_allowed());
                }
                let key = &t[ANNOTATION_OPEN.len()..t.len() - ANNOTATION_CLOSE.len()];
                match ctx.pvc_annotations.and_then(|a| a.get(key)) {
                    Some(v) => v,
                    None => {
                        return Err(ParamsError::MissingAnnotation {
                            key: field.key,
                            annotation: key.to_string(),
                            template: template.to_string(),
                        })
                    }
                }
            }
            t => {
                return Err(ParamsError::UnknownToken {
                    key: field.key,
                    token: t.to_string(),
                    template: template.to_string(),
                })
            }
        };
        out.push_str(value);
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests;
