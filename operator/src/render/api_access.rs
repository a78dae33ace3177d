//! ServiceAccount tokens only where the API is called.
//!
//! Kubernetes mounts the pod's ServiceAccount token into every container by
//! default, the driver's and a vendor's extra containers included, and that
//! token carries the grants of the operator's sidecars (the provisioner's
//! `get` on Secrets, the registrar's Node writes). So the pods are rendered
//! with `automountServiceAccountToken: false` and one projected volume that
//! holds what the automount would (a bound token, the cluster CA, the
//! namespace), mounted at the standard path only into the containers that
//! call the API: the bundled sidecars (the liveness probe only with
//! `--metrics-auth`, its only API calls), the upstream helpers, and the
//! driver or an extra container whose spec asks
//! (`mountServiceAccountToken: true`).

use k8s_openapi::api::core::v1::{
    ConfigMapProjection, Container, DownwardAPIProjection, DownwardAPIVolumeFile, KeyToPath,
    ObjectFieldSelector, ProjectedVolumeSource, ServiceAccountTokenProjection, Volume, VolumeMount,
    VolumeProjection,
};

use super::monitoring;
use super::names::{
    CONTAINER_ATTACHER, CONTAINER_DRIVER, CONTAINER_HEALTH_MONITOR, CONTAINER_LIVENESS_PROBE,
    CONTAINER_PROVISIONER, CONTAINER_REGISTRAR, CONTAINER_RESIZER, CONTAINER_SNAPSHOTTER,
    VOLUME_API_ACCESS,
};
use super::Ctx;

/// Where in-cluster clients (client-go, kube-rs) look for the token, the
/// CA and the namespace.
pub const API_ACCESS_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Lifetime of the projected token. An hour, not the automount's 3607 s:
/// the API server extends tokens of exactly 3607 s to a year (legacy
/// clients); kubelet renews ours at 80% and both client-go and kube-rs
/// re-read the file.
pub const TOKEN_EXPIRATION_SECONDS: i64 = 3600;

/// Containers of ours that always call the API.
const API_CLIENTS: &[&str] = &[
    CONTAINER_PROVISIONER,
    CONTAINER_ATTACHER,
    CONTAINER_REGISTRAR,
    CONTAINER_RESIZER,
    CONTAINER_SNAPSHOTTER,
    CONTAINER_HEALTH_MONITOR,
];

/// Whether the container named `name` gets the token.
fn gets_token(ctx: &Ctx<'_>, name: &str) -> bool {
    if API_CLIENTS.contains(&name) {
        return true;
    }
    if name == CONTAINER_LIVENESS_PROBE {
        return monitoring::metrics_auth(ctx);
    }
    if name == CONTAINER_DRIVER {
        return ctx.spec().driver.mount_service_account_token;
    }
    ctx.spec()
        .sidecars
        .extra
        .iter()
        .any(|e| e.name == name && e.mount_service_account_token)
}

/// The projected volume: what the ServiceAccount admission plugin would
/// have mounted (`kube-api-access-*`), but for the containers we choose.
pub(crate) fn volume() -> Volume {
    Volume {
        name: VOLUME_API_ACCESS.to_string(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o644),
            sources: Some(vec![
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: "token".to_string(),
                        expiration_seconds: Some(TOKEN_EXPIRATION_SECONDS),
                        audience: None,
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: "kube-root-ca.crt".to_string(),
                        items: Some(vec![KeyToPath {
                            key: "ca.crt".to_string(),
                            path: "ca.crt".to_string(),
                            mode: None,
                        }]),
                        optional: None,
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![DownwardAPIVolumeFile {
                            path: "namespace".to_string(),
                            field_ref: Some(ObjectFieldSelector {
                                api_version: Some("v1".to_string()),
                                field_path: "metadata.namespace".to_string(),
                            }),
                            ..Default::default()
                        }]),
                    }),
                    ..Default::default()
                },
            ]),
        }),
        ..Default::default()
    }
}

fn mount() -> VolumeMount {
    VolumeMount {
        name: VOLUME_API_ACCESS.to_string(),
        mount_path: API_ACCESS_MOUNT.to_string(),
        read_only: Some(true),
        ..Default::default()
    }
}

/// Mounts the token into the containers that get one; the volume the pod
/// needs for that, if any container does.
pub(crate) fn mount_where_needed(ctx: &Ctx<'_>, containers: &mut [Container]) -> Option<Volume> {
    let mut any = false;
    for c in containers.iter_mut().filter(|c| gets_token(ctx, &c.name)) {
        c.volume_mounts.get_or_insert_with(Vec::new).push(mount());
        any = true;
    }
    any.then(volume)
}
