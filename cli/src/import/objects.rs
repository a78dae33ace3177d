//! The objects beside the workloads: the CSIDriver and the classes map to
//! the spec; ServiceAccounts and RBAC are replaced by the operator's own
//! (least privilege per sidecar, shipped roles), except rules the driver
//! itself needs; the rest is applied by the user.

use std::collections::BTreeSet;

use csiops_crds::{CsiDriverObjectSpec, StorageClassSpec, VolumeAttributesClassSpec};
use csiops_operator::render::rbac::{self, SHIPPED_ROLES};
use serde_json::{json, Value};

use super::classify::Inventory;
use super::pod::{is_helm_annotation, object_metadata};
use super::Ctx;
use crate::input::Object;
use crate::report::{At, Gap, Outcome, What};

const DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";

pub fn map_objects(ctx: &mut Ctx, objects: &[&Object], inv: &Inventory<'_>) {
    let sa_names: BTreeSet<String> = inv
        .controller
        .iter()
        .chain(inv.node.iter())
        .filter_map(|p| p.spec.service_account_name.clone())
        .collect();
    for object in objects {
        let id = object.id();
        let at = At {
            object: &id,
            container: None,
        };
        match object.kind.as_str() {
            "CSIDriver" => csi_driver(ctx, object, &at),
            "StorageClass" => storage_class(ctx, object, &at),
            "VolumeAttributesClass" => attributes_class(ctx, object, &at),
            "ServiceAccount" => service_account(ctx, object, &at, &sa_names),
            "ClusterRole" | "Role" => role(ctx, object, &at),
            "ClusterRoleBinding" | "RoleBinding" => binding(ctx, object, &at, objects),
            kind => {
                let outcome = match kind {
                    "ConfigMap" => Outcome::gap(Gap::ConfigMap, ""),
                    "Service" => Outcome::gap(Gap::Service, ""),
                    "Namespace" => Outcome::mapped_note(
                        "metadata.namespace",
                        "the operator creates no namespace: create it before applying the CR",
                    ),
                    "PodDisruptionBudget" => Outcome::replaced(
                        "the operator's PodDisruptionBudget",
                        "the operator makes one for more than one controller replica (spec.controller.disruptionBudget)",
                    ),
                    _ => Outcome::gap(Gap::OtherObject, kind),
                };
                ctx.push(&at, What::Object, id.clone(), None, outcome);
                object_metadata(&mut ctx.report, &at, &object.value["metadata"]);
            }
        }
    }
}

fn csi_driver(ctx: &mut Ctx, object: &Object, at: &At<'_>) {
    ctx.push(
        at,
        What::Object,
        object.id(),
        None,
        Outcome::mapped("spec.driverName, spec.csiDriver"),
    );
    object_metadata(&mut ctx.report, at, &object.value["metadata"]);
    let spec = object.value["spec"].clone();
    match serde_json::from_value::<CsiDriverObjectSpec>(spec.clone()) {
        Ok(parsed) => ctx.spec.csi_driver = parsed,
        Err(e) => {
            ctx.push(
                at,
                What::Field,
                "spec",
                None,
                Outcome::not_representable(
                    format!("the CSIDriver spec does not read as the CRD's csiDriver: {e}"),
                    "fix the field named and import again",
                ),
            );
            return;
        }
    }
    let known = [
        "attachRequired",
        "podInfoOnMount",
        "fsGroupPolicy",
        "volumeLifecycleModes",
        "storageCapacity",
        "requiresRepublish",
        "seLinuxMount",
        "tokenRequests",
        "nodeAllocatableUpdatePeriodSeconds",
        "serviceAccountTokenInSecrets",
        "preventPodSchedulingIfMissing",
    ];
    for (key, value) in spec.as_object().into_iter().flatten() {
        let outcome = if known.contains(&key.as_str()) {
            Outcome::mapped(format!("spec.csiDriver.{key}"))
        } else {
            Outcome::gap(Gap::OtherObject, format!("CSIDriver spec.{key}"))
        };
        ctx.push(
            at,
            What::Field,
            format!("spec.{key}"),
            Some(value.to_string()),
            outcome,
        );
    }
}

/// Fields of a class object that are read by the mapping, not accounted.
const OBJECT_KEYS: &[&str] = &["apiVersion", "kind", "metadata"];

fn storage_class(ctx: &mut Ctx, object: &Object, at: &At<'_>) {
    let v = &object.value;
    let provisioner = v["provisioner"].as_str().unwrap_or_default();
    let mut meta = v["metadata"].clone();
    let is_default = meta["annotations"][DEFAULT_CLASS] == "true";
    if let Some(a) = meta["annotations"].as_object_mut() {
        a.remove(DEFAULT_CLASS);
    }
    if provisioner != ctx.driver_name {
        ctx.push(
            at,
            What::Object,
            object.id(),
            Some(provisioner.to_string()),
            Outcome::gap(Gap::ForeignClass, provisioner),
        );
        object_metadata(&mut ctx.report, at, &meta);
        return;
    }
    if v.get("allowedTopologies").is_some_and(|t| !t.is_null()) {
        ctx.push(
            at,
            What::Object,
            object.id(),
            None,
            Outcome::gap(Gap::StorageClassTopology, ""),
        );
        object_metadata(&mut ctx.report, at, &meta);
        return;
    }
    let class = json!({
        "name": object.name,
        "parameters": v["parameters"].as_object().cloned().unwrap_or_default(),
        "reclaimPolicy": v["reclaimPolicy"].as_str().unwrap_or("Delete"),
        "volumeBindingMode": v["volumeBindingMode"].as_str().unwrap_or("Immediate"),
        "allowVolumeExpansion": v["allowVolumeExpansion"].as_bool().unwrap_or(false),
        "mountOptions": v["mountOptions"].as_array().cloned().unwrap_or_default(),
        "isDefault": is_default,
    });
    let parsed: StorageClassSpec = match serde_json::from_value(class) {
        Ok(c) => c,
        Err(e) => {
            ctx.push(
                at,
                What::Object,
                object.id(),
                None,
                Outcome::not_representable(
                    format!("the class does not read as spec.storageClasses: {e}"),
                    "fix the field named, or apply the class yourself",
                ),
            );
            return;
        }
    };
    let i = ctx.spec.storage_classes.len();
    ctx.spec.storage_classes.push(parsed);
    ctx.push(
        at,
        What::Object,
        object.id(),
        None,
        Outcome::mapped(format!("spec.storageClasses[{i}]")),
    );
    // csiops grants Secret reads only where the classes name them: a
    // namespace by template (per-tenant credentials) needs every namespace.
    let templated: Vec<(String, String)> =
        rbac::class_secret_namespaces(&ctx.spec.storage_classes[i])
            .filter(|(_, v)| rbac::is_template(v))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    for (key, value) in templated {
        ctx.spec.secret_access.cluster_wide = true;
        ctx.push(
            at,
            What::Field,
            format!("parameters.{key}"),
            Some(value),
            Outcome::mapped("spec.secretAccess.clusterWide"),
        );
    }
    if is_default {
        ctx.push(
            at,
            What::Annotation,
            DEFAULT_CLASS,
            Some("true".into()),
            Outcome::mapped(format!("spec.storageClasses[{i}].isDefault")),
        );
    }
    object_metadata(&mut ctx.report, at, &meta);
    for (key, value) in v.as_object().into_iter().flatten() {
        if OBJECT_KEYS.contains(&key.as_str()) {
            continue;
        }
        let outcome = match key.as_str() {
            "provisioner" => Outcome::mapped("spec.driverName"),
            "parameters"
            | "reclaimPolicy"
            | "volumeBindingMode"
            | "allowVolumeExpansion"
            | "mountOptions" => Outcome::mapped(format!("spec.storageClasses[{i}].{key}")),
            _ => Outcome::gap(Gap::OtherObject, format!("StorageClass {key}")),
        };
        ctx.push(
            at,
            What::Field,
            key.clone(),
            Some(value.to_string()),
            outcome,
        );
    }
}

fn attributes_class(ctx: &mut Ctx, object: &Object, at: &At<'_>) {
    let v = &object.value;
    let driver = v["driverName"].as_str().unwrap_or_default();
    object_metadata(&mut ctx.report, at, &v["metadata"]);
    if driver != ctx.driver_name {
        ctx.push(
            at,
            What::Object,
            object.id(),
            Some(driver.to_string()),
            Outcome::gap(Gap::ForeignClass, driver),
        );
        return;
    }
    let parsed = serde_json::from_value::<VolumeAttributesClassSpec>(json!({
        "name": object.name,
        "parameters": v["parameters"].as_object().cloned().unwrap_or_default(),
    }));
    let outcome = match parsed {
        Ok(c) => {
            ctx.spec.volume_attributes_classes.push(c);
            Outcome::mapped(format!(
                "spec.volumeAttributesClasses[{}]",
                ctx.spec.volume_attributes_classes.len() - 1
            ))
        }
        Err(e) => Outcome::not_representable(
            format!("cannot read its parameters: {e}"),
            "apply it yourself",
        ),
    };
    ctx.push(at, What::Object, object.id(), None, outcome);
}

fn service_account(ctx: &mut Ctx, object: &Object, at: &At<'_>, used: &BTreeSet<String>) {
    let note = if used.contains(&object.name) {
        "the pods' ServiceAccount"
    } else {
        "not used by the driver's pods"
    };
    ctx.push(
        at,
        What::Object,
        object.id(),
        None,
        Outcome::replaced(
            // NodeLocal has no controller workload, so no controller account.
            if ctx.node_local {
                format!("ServiceAccount {}-node", ctx.cr_name)
            } else {
                format!("ServiceAccounts {0}-controller and {0}-node", ctx.cr_name)
            },
            format!("the operator creates its pods' ServiceAccounts ({note})"),
        ),
    );
    let mut meta = object.value["metadata"].clone();
    let annotations = meta["annotations"].as_object().cloned().unwrap_or_default();
    for (key, value) in &annotations {
        if !is_helm_annotation(key) {
            ctx.push(
                at,
                What::Annotation,
                key.clone(),
                value.as_str().map(str::to_string),
                Outcome::gap(Gap::ServiceAccountMetadata, ""),
            );
        }
    }
    if let Some(a) = meta["annotations"].as_object_mut() {
        a.retain(|k, _| is_helm_annotation(k));
    }
    object_metadata(&mut ctx.report, at, &meta);
    for r in object.value["imagePullSecrets"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(name) = r["name"].as_str() {
            if !ctx.spec.image_pull_secrets.iter().any(|n| n == name) {
                ctx.spec.image_pull_secrets.push(name.to_string());
            }
            ctx.push(
                at,
                What::Field,
                "imagePullSecrets",
                Some(name.into()),
                Outcome::mapped("spec.imagePullSecrets"),
            );
        }
    }
}

/// Whether csiops' shipped roles grant `verb` on `group/resource`, and
/// whether they know the resource at all (the sidecars' domain).
fn shipped(group: &str, resource: &str, verb: &str) -> (bool, bool) {
    let grants = SHIPPED_ROLES.iter().flat_map(|r| r.grants.iter());
    let mut known = false;
    for g in grants {
        let group_ok = g.api_group == group || group == "*";
        let resource_ok = g.resource == resource || resource == "*";
        if group_ok && resource_ok {
            known = true;
            if g.verbs.contains(&verb) || verb == "*" {
                return (true, true);
            }
        }
    }
    (false, known)
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}

fn role(ctx: &mut Ctx, object: &Object, at: &At<'_>) {
    ctx.push(at, What::Object, object.id(), None, Outcome::replaced(
        "csiops' shipped ClusterRoles (csiops:<sidecar>)",
        "the operator binds least-privilege roles per enabled sidecar; each rule is accounted below",
    ));
    object_metadata(&mut ctx.report, at, &object.value["metadata"]);
    if object
        .value
        .get("aggregationRule")
        .is_some_and(|a| !a.is_null())
    {
        ctx.push(
            at,
            What::RbacRule,
            "aggregationRule",
            None,
            Outcome::gap(Gap::DriverRbac, "an aggregated role"),
        );
    }
    for (i, rule) in object.value["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let verbs = strings(&rule["verbs"]);
        let urls = strings(&rule["nonResourceURLs"]);
        if !urls.is_empty() {
            ctx.push(
                at,
                What::RbacRule,
                format!("rules[{i}] {}", urls.join(",")),
                Some(verbs.join(",")),
                Outcome::gap(Gap::DriverRbac, "non-resource URLs"),
            );
        }
        let groups = strings(&rule["apiGroups"]);
        for group in if groups.is_empty() {
            vec![String::new()]
        } else {
            groups
        } {
            for resource in strings(&rule["resources"]) {
                let results: Vec<(bool, bool)> = verbs
                    .iter()
                    .map(|v| shipped(&group, &resource, v))
                    .collect();
                let key = format!(
                    "rules[{i}] {}{resource}",
                    if group.is_empty() {
                        String::new()
                    } else {
                        format!("{group}/")
                    }
                );
                let outcome = if results.iter().all(|(granted, _)| *granted) {
                    Outcome::replaced(
                        "csiops' shipped roles",
                        "granted to the sidecars that need it",
                    )
                } else if results.iter().all(|(_, known)| *known) {
                    let missing: Vec<&str> = verbs
                        .iter()
                        .zip(&results)
                        .filter(|(_, (g, _))| !g)
                        .map(|(v, _)| v.as_str())
                        .collect();
                    Outcome::replaced(
                        "csiops' shipped roles",
                        format!(
                            "csiops' sidecars do not need {} on it (least privilege)",
                            missing.join(",")
                        ),
                    )
                } else {
                    Outcome::gap(
                        Gap::DriverRbac,
                        format!("{resource} is no resource csiops' sidecars use"),
                    )
                };
                ctx.push(at, What::RbacRule, key, Some(verbs.join(",")), outcome);
            }
        }
    }
}

fn binding(ctx: &mut Ctx, object: &Object, at: &At<'_>, objects: &[&Object]) {
    let role_kind = object.value["roleRef"]["kind"].as_str().unwrap_or_default();
    let role_name = object.value["roleRef"]["name"].as_str().unwrap_or_default();
    let in_input = objects
        .iter()
        .any(|o| o.kind == role_kind && o.name == role_name);
    let outcome = if in_input {
        Outcome::replaced(
            "the operator's bindings",
            "the operator binds its shipped roles to its own ServiceAccounts",
        )
    } else {
        Outcome::gap(
            Gap::DriverRbac,
            format!("binds {role_kind} {role_name}, which is not in the input"),
        )
    };
    ctx.push(
        at,
        What::Object,
        object.id(),
        Some(format!("{role_kind}/{role_name}")),
        outcome,
    );
    object_metadata(&mut ctx.report, at, &object.value["metadata"]);
}
