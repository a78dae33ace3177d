//! The controller's PodDisruptionBudget (`spec.controller.disruptionBudget`)
//! and the priority classes of the driver's pods: the defaults a cluster
//! needs for maintenance. A node drain (`kubectl drain`, a cluster upgrade)
//! evicts through the budget, so the controller replicas leave one at a
//! time and one always serves; the priority classes keep the driver's pods
//! scheduled and running ahead of the workloads that need their volumes.

use csiops_crds::{
    effective_priority_class, DisruptionBudgetSpec, DEFAULT_CONTROLLER_PRIORITY_CLASS,
    DEFAULT_NODE_PRIORITY_CLASS,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::error::RenderError;
use super::labels::{selector_labels, Component};
use super::names::controller_name;
use super::{namespaced_meta, Ctx};

/// `maxUnavailable` of a budget that sets neither bound: one replica at a
/// time, whatever the count, so a drain always makes progress.
pub const DEFAULT_MAX_UNAVAILABLE: i32 = 1;

/// The budget's `unhealthyPodEvictionPolicy`. With Kubernetes' default
/// (`IfHealthyBudget`), a controller pod that is not Ready (crash-looping,
/// stuck on an image pull) cannot be evicted while the budget is spent,
/// and a drain of its node waits on a pod that serves nothing anyway.
/// `AlwaysAllow` lets the drain take it; healthy replicas stay protected.
const UNHEALTHY_POD_EVICTION_POLICY: &str = "AlwaysAllow";

/// The controller's PodDisruptionBudget, or `None` when there is none to
/// have: no controller workload (NodeLocal), at most one replica, or
/// `disruptionBudget.enabled: false`. One replica gets none on purpose: a
/// `maxUnavailable: 1` budget would allow its eviction anyway, and a
/// `minAvailable: 1` budget would block every drain of its node forever.
pub(crate) fn controller_budget(ctx: &Ctx<'_>) -> Result<Option<PodDisruptionBudget>, RenderError> {
    let spec = ctx.spec();
    let replicas = spec.controller_replicas();
    let budget = spec
        .controller
        .disruption_budget
        .clone()
        .unwrap_or_default();
    check(&budget, replicas)?;
    if ctx.node_local() || replicas <= 1 || !budget.enabled {
        return Ok(None);
    }
    let (max_unavailable, min_available) = match (budget.max_unavailable, budget.min_available) {
        (None, None) => (Some(IntOrString::Int(DEFAULT_MAX_UNAVAILABLE)), None),
        bounds => bounds,
    };
    let obj = ctx.obj;
    Ok(Some(PodDisruptionBudget {
        metadata: namespaced_meta(ctx, controller_name(obj), Component::Controller),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable,
            min_available,
            // The workload's own selector: every controller pod, of either
            // kind, and no node pod.
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(obj, Component::Controller)),
                ..Default::default()
            }),
            unhealthy_pod_eviction_policy: Some(UNHEALTHY_POD_EVICTION_POLICY.to_string()),
        }),
        status: None,
    }))
}

/// What the CRD's rules refuse, checked again in case the schema was
/// bypassed, plus the one rule CEL cannot say simply: a percentage
/// `minAvailable` that rounds up to every replica.
fn check(budget: &DisruptionBudgetSpec, replicas: i32) -> Result<(), RenderError> {
    let invalid = |field: &'static str, why: String| RenderError::DisruptionBudget { field, why };
    if budget.max_unavailable.is_some() && budget.min_available.is_some() {
        return Err(invalid(
            "spec.controller.disruptionBudget",
            "set maxUnavailable or minAvailable, not both".to_string(),
        ));
    }
    if let Some(max) = &budget.max_unavailable {
        let allows_one = match max {
            IntOrString::Int(n) => *n >= 1,
            IntOrString::String(s) => percent(s).is_some_and(|p| (1..=100).contains(&p)),
        };
        if !allows_one {
            return Err(invalid(
                "spec.controller.disruptionBudget.maxUnavailable",
                format!(
                    "{} must be a count of at least 1 or a percentage from 1% to 100%: \
                     0 would block every drain",
                    show(max)
                ),
            ));
        }
    }
    if let Some(min) = &budget.min_available {
        let required = match min {
            IntOrString::Int(n) if *n >= 0 => Some(i64::from(*n)),
            IntOrString::Int(_) => None,
            // Kubernetes rounds a percentage minAvailable up.
            IntOrString::String(s) => percent(s)
                .filter(|p| *p <= 100)
                .map(|p| (i64::from(p) * i64::from(replicas) + 99) / 100),
        };
        let Some(required) = required else {
            return Err(invalid(
                "spec.controller.disruptionBudget.minAvailable",
                format!(
                    "{} must be a count of at least 0 or a percentage from 0% to 99%",
                    show(min)
                ),
            ));
        };
        if replicas > 1 && required >= i64::from(replicas) {
            return Err(invalid(
                "spec.controller.disruptionBudget.minAvailable",
                format!(
                    "{} requires all {replicas} controller replicas: no controller pod could \
                     ever be evicted and every drain of its node would wait forever; use a \
                     smaller value or maxUnavailable",
                    show(min)
                ),
            ));
        }
    }
    Ok(())
}

/// The number of a percentage such as `25%`.
fn percent(s: &str) -> Option<u32> {
    s.strip_suffix('%')?.parse().ok()
}

fn show(v: &IntOrString) -> String {
    match v {
        IntOrString::Int(n) => n.to_string(),
        IntOrString::String(s) => format!("{s:?}"),
    }
}

/// The PriorityClass of the controller pods.
pub(crate) fn controller_priority_class(ctx: &Ctx<'_>) -> Option<String> {
    effective_priority_class(
        ctx.spec().controller.priority_class_name.as_deref(),
        DEFAULT_CONTROLLER_PRIORITY_CLASS,
    )
    .map(str::to_string)
}

/// The PriorityClass of the node pods.
pub(crate) fn node_priority_class(ctx: &Ctx<'_>) -> Option<String> {
    effective_priority_class(
        ctx.spec().node.priority_class_name.as_deref(),
        DEFAULT_NODE_PRIORITY_CLASS,
    )
    .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(max: Option<IntOrString>, min: Option<IntOrString>) -> DisruptionBudgetSpec {
        DisruptionBudgetSpec {
            enabled: true,
            max_unavailable: max,
            min_available: min,
        }
    }

    fn s(v: &str) -> Option<IntOrString> {
        Some(IntOrString::String(v.to_string()))
    }

    fn i(v: i32) -> Option<IntOrString> {
        Some(IntOrString::Int(v))
    }

    #[test]
    fn a_budget_that_allows_an_eviction_passes() {
        for (b, replicas) in [
            (budget(None, None), 2),
            (budget(i(1), None), 2),
            (budget(s("50%"), None), 3),
            (budget(None, i(1)), 2),
            (budget(None, s("50%")), 2),
            (budget(None, s("66%")), 3),
            // One replica renders no budget: nothing to block.
            (budget(None, i(1)), 1),
        ] {
            assert!(check(&b, replicas).is_ok(), "{b:?} at {replicas}");
        }
    }

    #[test]
    fn a_budget_that_blocks_drains_or_is_malformed_is_refused() {
        for (b, replicas) in [
            (budget(i(1), i(1)), 3),
            (budget(i(0), None), 2),
            (budget(s("0%"), None), 2),
            (budget(s("ten"), None), 2),
            (budget(None, i(2)), 2),
            (budget(None, i(-1)), 2),
            // 51% of 2 rounds up to 2.
            (budget(None, s("51%")), 2),
            (budget(None, s("100%")), 3),
            (budget(None, s("x%")), 3),
        ] {
            let err = check(&b, replicas).expect_err("refused");
            assert!(
                matches!(err, RenderError::DisruptionBudget { .. }),
                "{b:?}: {err}"
            );
        }
    }

    #[test]
    fn unset_priority_class_is_the_default_and_empty_is_none() {
        assert_eq!(
            effective_priority_class(None, DEFAULT_NODE_PRIORITY_CLASS),
            Some("system-node-critical")
        );
        assert_eq!(
            effective_priority_class(Some(""), DEFAULT_NODE_PRIORITY_CLASS),
            None
        );
        assert_eq!(
            effective_priority_class(Some("storage"), DEFAULT_NODE_PRIORITY_CLASS),
            Some("storage")
        );
    }
}
