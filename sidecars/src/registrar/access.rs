//! Whether this registrar maintains CSINode, decided once at start.
//!
//! Upstream's node-driver-registrar needs no Kubernetes access at all (kubelet
//! writes CSINode itself once it accepts the registration), so upstream
//! manifests give it no RBAC and often no node name it would read
//! (`KUBE_NODE_NAME` is set for the driver). Ours registers exactly the same
//! way without any access, and turns CSINode maintenance on only when it has
//! both a node name and permission; otherwise it says once why it is off.
//!
//! Permission is asked, not guessed from a failed write: one
//! SelfSubjectAccessReview per verb the maintenance uses. The review goes
//! through the API server's own authorizer chain (RBAC, webhooks), so it
//! answers exactly what our requests would meet, and any authenticated
//! identity may create one (`system:basic-user`). The alternative — try, and
//! treat the first 403 as "no permission" — would send writes that are known
//! to fail on every node at every start and log a failure first; it is kept
//! only as the backstop for permission revoked while running (see
//! `sync::NodeInfoSync::run`). A review that cannot be made (the API server
//! unreachable) is retried with backoff: that is an outage, not a refusal,
//! and the registration meanwhile goes on.

use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use kube::Client;

use csiops_runtime::chain;
use csiops_runtime::shutdown::CancellationToken;

/// Every (API group, resource, verb) CSINode maintenance uses: the Node for
/// labels and the node-ID annotation (read, watched, patched), the CSINode
/// (read, watched, created, replaced).
pub const NEEDED: &[(&str, &str, &str)] = &[
    ("", "nodes", "get"),
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
    ("", "nodes", "patch"),
    ("storage.k8s.io", "csinodes", "get"),
    ("storage.k8s.io", "csinodes", "list"),
    ("storage.k8s.io", "csinodes", "watch"),
    ("storage.k8s.io", "csinodes", "create"),
    ("storage.k8s.io", "csinodes", "update"),
];

/// The node name: `--node-name`, else `KUBE_NODE_NAME` (what upstream
/// manifests set for the driver), else `NODE_NAME` (what the operator sets).
/// Empty values count as unset.
pub fn node_name(flag: Option<&str>, env: impl Fn(&str) -> Option<String>) -> Option<String> {
    flag.map(str::to_string)
        .into_iter()
        .chain(env("KUBE_NODE_NAME"))
        .chain(env("NODE_NAME"))
        .find(|n| !n.trim().is_empty())
}

/// Why CSINode maintenance is off.
#[derive(Debug, thiserror::Error)]
pub enum Off {
    #[error("no node name (--node-name, KUBE_NODE_NAME and NODE_NAME are unset)")]
    NoNodeName,
    #[error("no Kubernetes client configuration")]
    NoConfig(#[source] csiops_runtime::kube::ConfigError),
    #[error("this identity may not {}", .0.join(", "))]
    Denied(Vec<String>),
}

/// Decides: `Ok(client, node)` when maintenance can run, `Err(why)` when it
/// cannot, `None` if shutdown came first. Waits out API outages.
pub async fn decide(
    node: Option<String>,
    kubeconfig: Option<&std::path::Path>,
    shutdown: &CancellationToken,
) -> Option<Result<(Client, String), Off>> {
    let Some(node) = node else {
        return Some(Err(Off::NoNodeName));
    };
    let client = match csiops_runtime::kube::client(kubeconfig).await {
        Ok(c) => c,
        Err(e) => return Some(Err(Off::NoConfig(e))),
    };
    let mut backoff = Duration::from_secs(1);
    loop {
        match denied(&client).await {
            Ok(missing) if missing.is_empty() => return Some(Ok((client, node))),
            Ok(missing) => return Some(Err(Off::Denied(missing))),
            Err(e) => {
                tracing::warn!(error = %chain(&e), retry_in = ?backoff,
                    "cannot ask the API server whether CSINode maintenance is permitted");
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

/// The needed verbs the API server denies, as `verb resource`.
async fn denied(client: &Client) -> Result<Vec<String>, kube::Error> {
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut missing = Vec::new();
    for (group, resource, verb) in NEEDED {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some(group.to_string()),
                    resource: Some(resource.to_string()),
                    verb: Some(verb.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let allowed = match reviews.create(&PostParams::default(), &review).await {
            Ok(answer) => answer.status.is_some_and(|s| s.allowed),
            // Not even a review is permitted: then neither is the rest.
            Err(e) if is_forbidden(&e) => false,
            Err(e) => return Err(e),
        };
        if !allowed {
            missing.push(format!("{verb} {resource}"));
        }
    }
    Ok(missing)
}

/// A 403 from the API server.
pub fn is_forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 403)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn node_name_from_the_flag_then_either_variable() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            node_name(Some("a"), env(&[("KUBE_NODE_NAME", "b")])).as_deref(),
            Some("a")
        );
        assert_eq!(
            node_name(None, env(&[("KUBE_NODE_NAME", "b"), ("NODE_NAME", "c")])).as_deref(),
            Some("b")
        );
        assert_eq!(
            node_name(
                Some(""),
                env(&[("KUBE_NODE_NAME", " "), ("NODE_NAME", "c")])
            )
            .as_deref(),
            Some("c")
        );
        assert_eq!(node_name(None, env(&[])), None);
    }

    /// An API server answering reviews: `allow` decides per (resource, verb);
    /// `None` answers 403 to the review itself, `Some(500)`-like outages
    /// are modelled by `fail_first` failures first.
    fn api(
        allow: fn(&str, &str) -> Option<bool>,
        fail_first: usize,
    ) -> (Client, Arc<Mutex<usize>>) {
        let calls = Arc::new(Mutex::new(0usize));
        let seen = calls.clone();
        let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let seen = seen.clone();
            async move {
                let n = {
                    let mut c = seen.lock().expect("lock");
                    *c += 1;
                    *c
                };
                let body = req.into_body().collect_bytes().await.unwrap_or_default();
                let review: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let attrs = &review["spec"]["resourceAttributes"];
                let (resource, verb) = (
                    attrs["resource"].as_str().unwrap_or_default(),
                    attrs["verb"].as_str().unwrap_or_default(),
                );
                let (code, json) = if n <= fail_first {
                    (
                        503,
                        serde_json::json!({"kind": "Status", "code": 503, "message": "down"}),
                    )
                } else {
                    match allow(resource, verb) {
                        Some(a) => (
                            201,
                            serde_json::json!({"apiVersion": "authorization.k8s.io/v1",
                                "kind": "SelfSubjectAccessReview", "spec": {},
                                "status": {"allowed": a}}),
                        ),
                        None => (
                            403,
                            serde_json::json!({"kind": "Status", "code": 403, "reason": "Forbidden", "message": "no"}),
                        ),
                    }
                };
                http::Response::builder()
                    .status(code)
                    .body(kube::client::Body::from(
                        serde_json::to_vec(&json).unwrap_or_default(),
                    ))
            }
        });
        (Client::new(svc, "default"), calls)
    }

    #[tokio::test]
    async fn every_needed_verb_is_asked_and_the_denied_ones_named() {
        let (client, calls) = api(|_, _| Some(true), 0);
        assert_eq!(
            denied(&client).await.expect("answers"),
            Vec::<String>::new()
        );
        assert_eq!(*calls.lock().expect("lock"), NEEDED.len());

        let (client, _) = api(|r, v| Some(!(r == "csinodes" && v == "create")), 0);
        assert_eq!(denied(&client).await.expect("answers"), ["create csinodes"]);

        // Reviews themselves forbidden: everything counts as denied.
        let (client, _) = api(|_, _| None, 0);
        assert_eq!(denied(&client).await.expect("answers").len(), NEEDED.len());

        // An outage is an error (retried by `decide`), not a denial.
        let (client, _) = api(|_, _| Some(true), 1);
        assert!(denied(&client).await.is_err());
    }
}
