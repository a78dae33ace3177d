//! The node DaemonSet: the driver's node service plus the registrar and the
//! liveness probe, wired to kubelet through exactly the three hostPath
//! volumes of the CSI design's "Recommended Mechanism for Deploying CSI
//! Drivers", all under `spec.node.kubeletDir`.
//!
//! With topology NodeLocal the same pods also run the provisioner in
//! node-deployment mode beside the driver (whose one process then serves
//! the controller and the node service for its node), and the rolling
//! update never surges: two instances of a node-local driver on one node
//! would fight over its state.

use std::collections::BTreeMap;

use csiops_crds::{adoption_label_key, AdoptionStage, ExtraContainerPod};
use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, RollingUpdateDaemonSet,
};
use k8s_openapi::api::core::v1::{
    Affinity, HostPathVolumeSource, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, PodSpec, PodTemplateSpec, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::containers::{
    driver_container, extra_container, liveness_probe_container, node_provisioner_container,
    registrar_container, DriverPlacement,
};
use super::error::RenderError;
use super::hash::spec_hash;
use super::labels::{common_labels, selector_labels, Component, TEMPLATE_HASH};
use super::names::{
    node_name, CONTAINER_DRIVER, VOLUME_KUBELET_DIR, VOLUME_REGISTRATION_DIR, VOLUME_SOCKET_DIR,
};
use super::{
    apply_pod_settings, image_pull_secrets, none_if_empty, none_if_map_empty, pod_annotations,
    workload_meta, Ctx,
};

fn host_path(name: &str, path: String, type_: &str) -> Volume {
    Volume {
        name: name.to_string(),
        host_path: Some(HostPathVolumeSource {
            path,
            type_: Some(type_.to_string()),
        }),
        ..Default::default()
    }
}

/// The user's tolerations, plus the driver-readiness taint when it is on:
/// the node pod is what removes that taint, so it must land on a node that
/// still carries it.
fn node_tolerations(ctx: &Ctx<'_>) -> Vec<Toleration> {
    let spec = ctx.spec();
    let mut tolerations = spec.node.tolerations.clone();
    if spec.node.readiness_taint {
        tolerations.push(Toleration {
            key: Some(csiops_crds::readiness_taint_key(&spec.driver_name)),
            operator: Some("Exists".to_string()),
            effect: Some("NoSchedule".to_string()),
            ..Default::default()
        });
    }
    tolerations
}

/// Renders the DaemonSet and returns it with its hash (also set as the
/// [`TEMPLATE_HASH`] annotation).
pub(crate) fn daemonset(ctx: &Ctx<'_>) -> Result<(DaemonSet, String), RenderError> {
    let obj = ctx.obj;
    let spec = ctx.spec();
    let name = node_name(obj);
    let kubelet_dir = ctx.kubelet_dir.clone();

    // The driver mounts kubelet's root at the same path as on the host, so
    // the staging/publish paths kubelet passes in NodeStage/NodePublish are
    // valid inside the container; Bidirectional propagates its mounts back.
    let kubelet_mount = VolumeMount {
        name: VOLUME_KUBELET_DIR.to_string(),
        mount_path: kubelet_dir.clone(),
        mount_propagation: Some("Bidirectional".to_string()),
        ..Default::default()
    };
    let mut containers = vec![driver_container(
        ctx,
        DriverPlacement {
            overrides: &spec.node.driver,
            extra_mounts: vec![kubelet_mount],
            // Bidirectional mount propagation requires a privileged container.
            privileged: true,
        },
    )];
    if ctx.node_local() && ctx.provisioner_enabled() {
        containers.push(node_provisioner_container(ctx)?);
    }
    if ctx.registrar_enabled() {
        containers.push(registrar_container(ctx)?);
    }
    if ctx.liveness_probe_enabled() {
        containers.push(liveness_probe_container(ctx)?);
    }
    containers.extend(
        ctx.extra_containers(ExtraContainerPod::Node)
            .map(extra_container),
    );

    let api_access = super::api_access::mount_where_needed(ctx, &mut containers);
    let mut volumes = vec![
        // Where the driver creates its socket; kubelet dials it here.
        host_path(
            VOLUME_SOCKET_DIR,
            ctx.host_plugin_dir(),
            "DirectoryOrCreate",
        ),
        // kubelet's plugin watcher directory: must exist, kubelet creates it.
        host_path(
            VOLUME_REGISTRATION_DIR,
            format!("{kubelet_dir}/plugins_registry/"),
            "Directory",
        ),
        host_path(VOLUME_KUBELET_DIR, kubelet_dir, "Directory"),
    ];
    volumes.extend(super::monitoring::pod_volumes(ctx));
    volumes.extend(api_access);

    let mut pod = PodSpec {
        service_account_name: Some(name.clone()),
        // Only the containers that call the API get a token (api_access).
        automount_service_account_token: Some(false),
        containers,
        node_selector: none_if_map_empty(&spec.node.node_selector),
        tolerations: none_if_empty(node_tolerations(ctx)),
        priority_class_name: super::disruption::node_priority_class(ctx),
        image_pull_secrets: image_pull_secrets(spec),
        affinity: node_affinity(ctx),
        ..Default::default()
    };
    let mut template_meta = ObjectMeta {
        labels: Some(common_labels(obj, Component::Node)),
        annotations: Some(pod_annotations(ctx, CONTAINER_DRIVER)),
        ..Default::default()
    };
    apply_pod_settings(&mut pod, &mut template_meta, volumes, &spec.node.pod);

    let ds_spec = DaemonSetSpec {
        selector: LabelSelector {
            match_labels: Some(selector_labels(obj, Component::Node)),
            ..Default::default()
        },
        template: PodTemplateSpec {
            metadata: Some(template_meta),
            spec: Some(pod),
        },
        update_strategy: Some(DaemonSetUpdateStrategy {
            type_: Some("RollingUpdate".to_string()),
            rolling_update: Some(RollingUpdateDaemonSet {
                max_unavailable: Some(
                    spec.node
                        .max_unavailable
                        .clone()
                        .unwrap_or(IntOrString::Int(1)),
                ),
                // Node-locally, stated rather than left to the API's
                // default: a surge pod would start a second driver on the
                // node's state while the first still runs. (Left out for a
                // central driver, whose rendered content must not change.)
                max_surge: ctx.node_local().then_some(IntOrString::Int(0)),
            }),
        }),
        ..Default::default()
    };

    let hash = spec_hash("node DaemonSet", &ds_spec)?;
    let mut metadata = workload_meta(ctx, name, Component::Node);
    metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(TEMPLATE_HASH.to_string(), hash.clone());
    Ok((
        DaemonSet {
            metadata,
            spec: Some(ds_spec),
            status: None,
        },
        hash,
    ))
}

/// `spec.node.affinity`, and while a DaemonSet is taken over
/// (`spec.adoption.nodeDaemonSet`) a requirement added to each of its
/// required node-selector terms (terms are ORed, so each must carry it):
/// keep off the nodes whose adoption label says the old plugin still runs
/// there or is leaving (see `csiops_crds::AdoptionStage`), since two
/// plugins of one driver on a node would share its sockets. A node without
/// the label qualifies, so the label can go once the takeover is done
/// without changing this template.
fn node_affinity(ctx: &Ctx<'_>) -> Option<Affinity> {
    let spec = ctx.spec();
    let user = spec.node.affinity.clone();
    let adopting = spec
        .adoption
        .as_ref()
        .is_some_and(|a| a.node_daemon_set.is_some());
    if !adopting {
        return user;
    }
    let keep_off = NodeSelectorRequirement {
        key: adoption_label_key(&spec.driver_name),
        operator: "NotIn".to_string(),
        values: Some(
            [AdoptionStage::Waiting, AdoptionStage::Leaving]
                .iter()
                .map(|s| s.as_str().to_string())
                .collect(),
        ),
    };
    let mut affinity = user.unwrap_or_default();
    let node = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    let required = node
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(|| NodeSelector {
            node_selector_terms: Vec::new(),
        });
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        term.match_expressions
            .get_or_insert_with(Vec::new)
            .push(keep_off.clone());
    }
    Some(affinity)
}

/// `ds` with its rolling update's `maxUnavailable` set to `budget`, the
/// hash annotation untouched: the budget follows the lost nodes (see
/// `fleet::Fleet::max_unavailable`) and is no change of content.
pub fn with_max_unavailable(mut ds: DaemonSet, budget: &IntOrString) -> DaemonSet {
    if let Some(rolling) = ds
        .spec
        .as_mut()
        .and_then(|s| s.update_strategy.as_mut())
        .and_then(|u| u.rolling_update.as_mut())
    {
        rolling.max_unavailable = Some(budget.clone());
    }
    ds
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    #[test]
    fn the_budget_changes_max_unavailable_only() {
        let ds = DaemonSet {
            spec: Some(DaemonSetSpec {
                update_strategy: Some(DaemonSetUpdateStrategy {
                    type_: Some("RollingUpdate".into()),
                    rolling_update: Some(RollingUpdateDaemonSet {
                        max_unavailable: Some(IntOrString::String("10%".into())),
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let out = with_max_unavailable(ds.clone(), &IntOrString::Int(7));
        let rolling = out
            .spec
            .as_ref()
            .and_then(|s| s.update_strategy.as_ref())
            .and_then(|u| u.rolling_update.as_ref())
            .expect("rolling update kept");
        assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(7)));
        let mut back = out;
        back.spec.as_mut().unwrap().update_strategy =
            ds.spec.as_ref().unwrap().update_strategy.clone();
        assert_eq!(back, ds);
    }
}
