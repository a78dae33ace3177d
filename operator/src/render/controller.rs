//! The controller workload: the driver's controller service plus the
//! provisioner, attacher and liveness-probe sidecars, the enabled upstream
//! helpers (resizer, snapshotter, health monitor) and the user's extra
//! containers, sharing an `emptyDir`
//! socket directory (the CSI design's "cluster-level deployment"), as a
//! StatefulSet (default) or a Deployment.

use std::collections::BTreeMap;

use csiops_crds::{ControllerKind, ExtraContainerPod};
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateStatefulSetStrategy, StatefulSet,
    StatefulSetSpec, StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, PodSpec, PodTemplateSpec, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::containers::{
    attacher_container, driver_container, extra_container, helper_container,
    liveness_probe_container, provisioner_container, DriverPlacement, Helper,
};
use super::error::RenderError;
use super::hash::spec_hash;
use super::labels::{common_labels, selector_labels, Component, TEMPLATE_HASH};
use super::names::{controller_name, CONTAINER_DRIVER, VOLUME_SOCKET_DIR};
use super::{
    apply_pod_settings, image_pull_secrets, none_if_empty, none_if_map_empty, pod_annotations,
    workload_meta, Ctx,
};

/// The rendered controller workload, of the kind `spec.controller.kind` asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum ControllerWorkload {
    StatefulSet(StatefulSet),
    Deployment(Deployment),
}

impl ControllerWorkload {
    pub fn kind(&self) -> ControllerKind {
        match self {
            ControllerWorkload::StatefulSet(_) => ControllerKind::StatefulSet,
            ControllerWorkload::Deployment(_) => ControllerKind::Deployment,
        }
    }

    /// The StatefulSet, if that is the kind.
    pub fn statefulset(&self) -> Option<&StatefulSet> {
        match self {
            ControllerWorkload::StatefulSet(s) => Some(s),
            ControllerWorkload::Deployment(_) => None,
        }
    }

    /// The Deployment, if that is the kind.
    pub fn deployment(&self) -> Option<&Deployment> {
        match self {
            ControllerWorkload::Deployment(d) => Some(d),
            ControllerWorkload::StatefulSet(_) => None,
        }
    }

    /// The pod template, whichever the kind.
    pub fn template(&self) -> Option<&PodTemplateSpec> {
        match self {
            ControllerWorkload::StatefulSet(s) => s.spec.as_ref().map(|s| &s.template),
            ControllerWorkload::Deployment(d) => d.spec.as_ref().map(|s| &s.template),
        }
    }
}

/// Renders the controller workload and returns it with its hash (also set as
/// the [`TEMPLATE_HASH`] annotation). The kind is part of the hash, so
/// switching kinds is a controller change.
pub(crate) fn controller(ctx: &Ctx<'_>) -> Result<(ControllerWorkload, String), RenderError> {
    let obj = ctx.obj;
    let spec = ctx.spec();
    let name = controller_name(obj);

    let mut containers = vec![driver_container(
        ctx,
        DriverPlacement {
            overrides: &spec.controller.driver,
            extra_mounts: Vec::new(),
            privileged: false,
        },
    )];
    if ctx.provisioner_enabled() {
        containers.push(provisioner_container(ctx)?);
    }
    if ctx.attacher_enabled() {
        containers.push(attacher_container(ctx)?);
    }
    for helper in Helper::ALL {
        if ctx.helper_enabled(helper) {
            containers.push(helper_container(ctx, helper));
        }
    }
    if ctx.liveness_probe_enabled() {
        containers.push(liveness_probe_container(ctx)?);
    }
    containers.extend(
        ctx.extra_containers(ExtraContainerPod::Controller)
            .map(extra_container),
    );

    let api_access = super::api_access::mount_where_needed(ctx, &mut containers);
    let mut pod = PodSpec {
        service_account_name: Some(name.clone()),
        // Only the containers that call the API get a token (api_access).
        automount_service_account_token: Some(false),
        containers,
        node_selector: none_if_map_empty(&spec.controller.node_selector),
        tolerations: none_if_empty(spec.controller.tolerations.clone()),
        affinity: spec.controller.affinity.clone(),
        priority_class_name: super::disruption::controller_priority_class(ctx),
        image_pull_secrets: image_pull_secrets(spec),
        ..Default::default()
    };
    let mut template_meta = ObjectMeta {
        labels: Some(common_labels(obj, Component::Controller)),
        annotations: Some(pod_annotations(ctx, CONTAINER_DRIVER)),
        ..Default::default()
    };
    let socket_dir = Volume {
        name: VOLUME_SOCKET_DIR.to_string(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    };
    let mut volumes = vec![socket_dir];
    volumes.extend(super::monitoring::pod_volumes(ctx));
    volumes.extend(api_access);
    apply_pod_settings(&mut pod, &mut template_meta, volumes, &spec.controller.pod);

    let selector = LabelSelector {
        match_labels: Some(selector_labels(obj, Component::Controller)),
        ..Default::default()
    };
    let template = PodTemplateSpec {
        metadata: Some(template_meta),
        spec: Some(pod),
    };
    let mut metadata = workload_meta(ctx, name.clone(), Component::Controller);
    match spec.controller.kind {
        ControllerKind::StatefulSet => {
            let sts_spec = StatefulSetSpec {
                replicas: Some(spec.controller.replicas),
                selector,
                service_name: Some(name),
                // Sidecars elect a leader; there is no reason to start replicas one
                // by one, and Parallel lets a scale-down to 0 finish at once.
                pod_management_policy: Some("Parallel".to_string()),
                template,
                ..Default::default()
            };
            let hash = spec_hash("controller StatefulSet", &sts_spec)?;
            set_hash(&mut metadata, &hash);
            let sts = StatefulSet {
                metadata,
                spec: Some(sts_spec),
                status: None,
            };
            Ok((ControllerWorkload::StatefulSet(sts), hash))
        }
        ControllerKind::Deployment => {
            let deploy_spec = DeploymentSpec {
                replicas: Some(spec.controller.replicas),
                selector,
                // A rolling update may run an old and a new pod side by side
                // for a moment; the sidecars' leader election (always on)
                // keeps one of them active.
                strategy: Some(DeploymentStrategy {
                    type_: Some("RollingUpdate".to_string()),
                    ..Default::default()
                }),
                template,
                ..Default::default()
            };
            let hash = spec_hash("controller Deployment", &deploy_spec)?;
            set_hash(&mut metadata, &hash);
            let deploy = Deployment {
                metadata,
                spec: Some(deploy_spec),
                status: None,
            };
            Ok((ControllerWorkload::Deployment(deploy), hash))
        }
    }
}

fn set_hash(metadata: &mut ObjectMeta, hash: &str) {
    metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(TEMPLATE_HASH.to_string(), hash.to_string());
}

/// `sts` with `replicas` and a rolling-update `partition`, the hash
/// annotation untouched: one phase of a surge roll (see `rollout`). With
/// partition 0 the field is left out, as the rendered object has it.
pub fn with_surge(mut sts: StatefulSet, replicas: i32, partition: i32) -> StatefulSet {
    if let Some(spec) = sts.spec.as_mut() {
        spec.replicas = Some(replicas);
        spec.update_strategy = (partition > 0).then(|| StatefulSetUpdateStrategy {
            type_: Some("RollingUpdate".to_string()),
            rolling_update: Some(RollingUpdateStatefulSetStrategy {
                partition: Some(partition),
                ..Default::default()
            }),
        });
    }
    sts
}

#[cfg(test)]
mod surge_tests {
    use super::*;

    #[test]
    fn a_surge_phase_sets_replicas_and_partition_only() {
        let sts = StatefulSet {
            metadata: ObjectMeta {
                annotations: Some(BTreeMap::from([(
                    TEMPLATE_HASH.to_string(),
                    "h".to_string(),
                )])),
                ..Default::default()
            },
            spec: Some(StatefulSetSpec {
                replicas: Some(1),
                ..Default::default()
            }),
            status: None,
        };
        let phase1 = with_surge(sts.clone(), 2, 1);
        let spec = phase1.spec.as_ref().expect("spec");
        assert_eq!(spec.replicas, Some(2));
        let partition = spec
            .update_strategy
            .as_ref()
            .and_then(|u| u.rolling_update.as_ref())
            .and_then(|r| r.partition);
        assert_eq!(partition, Some(1));
        assert_eq!(phase1.metadata, sts.metadata);
        let phase2 = with_surge(sts.clone(), 2, 0);
        assert_eq!(
            phase2.spec.as_ref().and_then(|s| s.update_strategy.clone()),
            None
        );
        assert_eq!(with_surge(sts.clone(), 1, 0), sts);
    }
}
