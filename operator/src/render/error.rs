//! Why a `CSIDriverDeployment` could not be rendered.
//!
//! Each message names the offending field and what to do about it, because it
//! ends up verbatim in the object's `Degraded` condition where a storage admin
//! reads it.

use thiserror::Error;

/// A `CSIDriverDeployment` that cannot be turned into Kubernetes objects.
///
/// None of these is transient: the reconciler should report it and wait for
/// the object to be edited rather than retry quickly.
#[derive(Debug, Error)]
pub enum RenderError {
    /// The object lacks metadata that every object read from the API server has.
    #[error("CSIDriverDeployment has no metadata.{field}; only objects read from the API server can be rendered")]
    MissingMetadata { field: &'static str },

    /// The name is too long for the controller StatefulSet's pods.
    #[error(
        "CSIDriverDeployment name {name:?} is {len} characters, at most {max} are allowed: \
         the controller StatefulSet `<name>-controller` must be at most {sts_max} characters \
         because Kubernetes puts `<statefulset>-<revision hash>` into a pod label (63 characters)"
    )]
    NameTooLong {
        name: String,
        len: usize,
        max: usize,
        sts_max: usize,
    },

    /// A node-local object asks for something only controller pods could
    /// run (the CRD refuses it too; this holds if it was bypassed).
    #[error("{field}: {why}")]
    NodeLocal { field: String, why: &'static str },

    /// A class names the namespace of a Secret the controller side reads by
    /// template, and the spec grants no namespace it could resolve to.
    #[error(
        "spec.storageClasses {class:?} names the namespace of a Secret by template \
         ({key}: {value:?}); csiops grants a driver Secret reads only in the namespaces its \
         classes name (a RoleBinding in each), which a template cannot name: set \
         spec.secretAccess.clusterWide: true to let the driver read Secrets in every \
         namespace (host access), or name the namespace"
    )]
    TemplatedSecretNamespace {
        class: String,
        key: String,
        value: String,
    },

    /// A namespace in `spec.secretAccess.namespaces` or a class's secret
    /// parameters that no namespace can have.
    #[error("{name:?} is not a namespace name (a DNS-1123 label): spec.secretAccess.namespaces and the classes' *-secret-namespace parameters name namespaces whose Secrets the driver reads")]
    SecretNamespace { name: String },

    /// An `extraArgs` entry tries to set a flag that the operator wires itself.
    #[error(
        "spec.sidecars.{sidecar}.extraArgs contains {arg:?}, which sets --{flag}; the operator \
         manages --{flag} for the {sidecar} sidecar, remove it from extraArgs"
    )]
    ManagedFlag {
        sidecar: &'static str,
        flag: String,
        arg: String,
    },

    /// An `env` entry names the sidecar's node, which the operator sets.
    #[error(
        "spec.sidecars.{sidecar}.env sets {name}, which names the node the {sidecar} works for; \
         the operator sets it from the pod's spec.nodeName (a sidecar may only touch its own \
         node), remove it from env"
    )]
    ManagedEnv { sidecar: &'static str, name: String },

    /// An image field is present but empty.
    #[error("{field} is set but empty; set an image reference or remove the field")]
    EmptyImage { field: &'static str },

    /// An extra container's image is empty.
    #[error("{field} is empty; set an image reference")]
    EmptyContainerImage { field: String },

    /// An extra container's name is not a DNS-1123 label.
    #[error(
        "{field} {name:?} is not a valid container name: use at most 63 lowercase letters, \
         digits and '-', starting and ending with a letter or digit"
    )]
    InvalidContainerName { field: String, name: String },

    /// `spec.controller.disruptionBudget` is malformed, or would keep every
    /// controller replica from being evicted (every drain of their nodes
    /// would wait forever). The CRD refuses most of it; a percentage
    /// `minAvailable` is only caught here, where it is rounded.
    #[error("{field}: {why}")]
    DisruptionBudget { field: &'static str, why: String },

    /// A sidecar is enabled but there is no image to run it from.
    #[error(
        "the {sidecar} sidecar is enabled but no sidecar image is configured: set \
         spec.sidecars.image, configure the operator's default sidecar image, or disable \
         spec.sidecars.{sidecar}"
    )]
    NoSidecarImage { sidecar: &'static str },

    /// `spec.node.kubeletDir` is not a clean absolute path.
    #[error("spec.node.kubeletDir {dir:?} is invalid: {reason}")]
    InvalidKubeletDir { dir: String, reason: &'static str },

    /// `spec.driver.socketName` would not be a plain file name.
    #[error(
        "spec.driver.socketName {name:?} is invalid: it must be a non-empty file name without '/'"
    )]
    InvalidSocketName { name: String },

    /// A user-chosen name or path is one the operator manages itself.
    #[error("{field} {value:?} collides with {what}; choose another {noun}")]
    Collision {
        /// Where the user set it, e.g. `spec.node.volumes[2].name`.
        field: String,
        value: String,
        /// What the operator uses it for.
        what: String,
        /// `name`, `path`, `key`.
        noun: &'static str,
    },

    /// A volumeMount names a volume the pod does not have.
    #[error(
        "{field} mounts volume {volume:?}, which is neither in {volumes_field} nor one the \
         operator manages ({managed}); add it to {volumes_field}"
    )]
    UnknownVolume {
        field: String,
        volume: String,
        volumes_field: &'static str,
        managed: String,
    },

    /// Bidirectional mount propagation without a privileged container: the
    /// API server would refuse the workload.
    #[error(
        "{field}: the driver container in {workload} pods has a Bidirectional mount ({mount}) \
         but its securityContext is not privileged; Kubernetes allows Bidirectional propagation \
         only in privileged containers, so set privileged: true in spec.{workload}.securityContext"
    )]
    BidirectionalNotPrivileged {
        field: String,
        workload: &'static str,
        mount: String,
    },

    /// Serializing a rendered spec for its hash failed (not expected to happen).
    #[error("cannot serialize the rendered {what} spec for hashing")]
    Hash {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}
