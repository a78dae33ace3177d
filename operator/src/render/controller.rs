//! The controller StatefulSet: the driver's controller service plus the
//! provisioner, attacher and liveness-probe sidecars, sharing an `emptyDir`
//! socket directory (the CSI design's "cluster-level deployment").

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, PodSpec, PodTemplateSpec, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::containers::{
    attacher_container, driver_container, liveness_probe_container, provisioner_container,
    DriverPlacement,
};
use super::error::RenderError;
use super::hash::spec_hash;
use super::labels::{common_labels, selector_labels, Component, TEMPLATE_HASH};
use super::names::{controller_name, CONTAINER_DRIVER, VOLUME_SOCKET_DIR};
use super::{
    apply_pod_settings, image_pull_secrets, none_if_empty, none_if_map_empty, pod_annotations,
    workload_meta, Ctx,
};

/// Renders the StatefulSet and returns it with its hash (also set as the
/// [`TEMPLATE_HASH`] annotation).
pub(crate) fn statefulset(ctx: &Ctx<'_>) -> Result<(StatefulSet, String), RenderError> {
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
    if ctx.liveness_probe_enabled() {
        containers.push(liveness_probe_container(ctx)?);
    }

    let mut pod = PodSpec {
        service_account_name: Some(name.clone()),
        containers,
        node_selector: none_if_map_empty(&spec.controller.node_selector),
        tolerations: none_if_empty(spec.controller.tolerations.clone()),
        affinity: spec.controller.affinity.clone(),
        priority_class_name: spec.controller.priority_class_name.clone(),
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
    apply_pod_settings(
        &mut pod,
        &mut template_meta,
        vec![socket_dir],
        &spec.controller.pod,
    );

    let sts_spec = StatefulSetSpec {
        replicas: Some(spec.controller.replicas),
        selector: LabelSelector {
            match_labels: Some(selector_labels(obj, Component::Controller)),
            ..Default::default()
        },
        service_name: Some(name.clone()),
        // Sidecars elect a leader; there is no reason to start replicas one
        // by one, and Parallel lets a scale-down to 0 finish at once.
        pod_management_policy: Some("Parallel".to_string()),
        template: PodTemplateSpec {
            metadata: Some(template_meta),
            spec: Some(pod),
        },
        ..Default::default()
    };

    let hash = spec_hash("controller StatefulSet", &sts_spec)?;
    let mut metadata = workload_meta(ctx, name, Component::Controller);
    metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(TEMPLATE_HASH.to_string(), hash.clone());
    Ok((
        StatefulSet {
            metadata,
            spec: Some(sts_spec),
            status: None,
        },
        hash,
    ))
}
