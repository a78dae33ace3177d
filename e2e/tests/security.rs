//! The security properties of csiops (README, Security model) on a real
//! control plane, enforced by the API server itself: the shipped
//! ValidatingAdmissionPolicies and RBAC of `manifests/install.yaml`.
//!
//! - A registrar's ServiceAccount token (bound to a pod on one node)
//!   writes that node's Node and CSINode, and is refused every other
//!   node's, with a message naming both; a token bound to no pod names no
//!   node and is refused outright (fail closed).

use std::time::Duration;

use csiops_e2e::{testkit, wait_for, Cluster, ClusterOptions};

const NS: &str = "csi-sec";

/// `kubectl` with `token` instead of the admin's credentials: (ok, stderr).
async fn as_token(cluster: &Cluster, token: &str, args: &[&str]) -> (bool, String) {
    let mut all = vec![format!("--token={token}")];
    all.extend(args.iter().map(|a| a.to_string()));
    let out = cluster.kubectl(&all).await.expect("kubectl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn label_patch(value: &str) -> String {
    format!(r#"{{"metadata":{{"labels":{{"example.com/touched":"{value}"}}}}}}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registrar_token_writes_only_its_own_node() {
    let cluster = Cluster::start(ClusterOptions::kwok(2))
        .await
        .expect("cluster starts");
    testkit::install_operator_rbac(&cluster)
        .await
        .expect("install.yaml's RBAC and policies apply");
    let nodes = cluster.node_names().to_vec();
    let (own, other) = (&nodes[0], &nodes[1]);

    // A driver's node ServiceAccount, bound to the shipped registrar role as
    // the operator binds it, and a pod of it on the first node.
    let setup = format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: {NS}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: drv-node, namespace: {NS}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: "csiops:sec.csi.example.com:registrar"}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "csiops:registrar"}}
subjects: [{{kind: ServiceAccount, name: drv-node, namespace: {NS}}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: drv-node-0, namespace: {NS}}}
spec:
  serviceAccountName: drv-node
  nodeName: {own}
  tolerations: [{{operator: Exists}}]
  containers: [{{name: c, image: registry.invalid/none:1}}]
"#
    );
    testkit::apply_ok(&cluster, "registrar-setup", &setup).await;

    // The token kubelet would project into that pod: bound to it, so it
    // carries the pod's node.
    let token = cluster
        .kubectl_ok([
            "-n",
            NS,
            "create",
            "token",
            "drv-node",
            "--bound-object-kind=Pod",
            "--bound-object-name=drv-node-0",
        ])
        .await
        .expect("bound token")
        .trim()
        .to_string();
    let whoami = cluster
        .kubectl_ok([
            &format!("--token={token}"),
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.extra}",
        ])
        .await
        .expect("whoami");
    assert!(
        whoami.contains("authentication.kubernetes.io/node-name") && whoami.contains(own.as_str()),
        "the token carries its node: {whoami}"
    );

    // The API server enforces a new policy once its informer has it
    // (moments): wait for a dry run to be refused, then check for real.
    let dry_other = [
        "patch",
        "node",
        other.as_str(),
        "--dry-run=server",
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"example.com/dry":"run"}}}"#,
    ];
    wait_for(
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async { (!as_token(&cluster, &token, &dry_other).await.0).then_some(()) },
    )
    .await
    .unwrap_or_else(|_| panic!("the registrar policy never refused another node's patch"));

    // Its own Node: patched. Another: refused, naming both nodes.
    let (ok, err) = as_token(
        &cluster,
        &token,
        &[
            "patch",
            "node",
            own,
            "--type=merge",
            "-p",
            &label_patch("own"),
        ],
    )
    .await;
    assert!(ok, "patching its own node: {err}");
    let (ok, err) = as_token(
        &cluster,
        &token,
        &[
            "patch",
            "node",
            other,
            "--type=merge",
            "-p",
            &label_patch("other"),
        ],
    )
    .await;
    assert!(!ok, "patching another node was allowed");
    assert!(
        err.contains("csiops-registrar-own-node")
            && err.contains(&format!("runs on node {own}"))
            && err.contains(&format!("nodes {other}")),
        "{err}"
    );
    let labels = testkit::jsonpath(&cluster, &["get", "node", other], "{.metadata.labels}")
        .await
        .expect("labels");
    assert!(!labels.contains("example.com/touched"), "{labels}");

    // CSINodes alike: its own created, another's refused.
    let csinode = |node: &str| {
        format!(
            r#"{{"apiVersion":"storage.k8s.io/v1","kind":"CSINode","metadata":{{"name":"{node}"}},"spec":{{"drivers":[]}}}}"#
        )
    };
    for (node, allowed) in [(own, true), (other, false)] {
        let path = cluster.work_dir().join(format!("csinode-{node}.json"));
        std::fs::write(&path, csinode(node)).expect("write CSINode");
        let (ok, err) =
            as_token(&cluster, &token, &["create", "-f", &path.to_string_lossy()]).await;
        assert_eq!(ok, allowed, "CSINode {node}: {err}");
        if !allowed {
            assert!(err.contains("csiops-registrar-own-node"), "{err}");
        }
    }

    // A token bound to no pod names no node: refused, saying why.
    let unbound = cluster
        .kubectl_ok(["-n", NS, "create", "token", "drv-node"])
        .await
        .expect("token")
        .trim()
        .to_string();
    let (ok, err) = as_token(
        &cluster,
        &unbound,
        &[
            "patch",
            "node",
            own,
            "--type=merge",
            "-p",
            &label_patch("unbound"),
        ],
    )
    .await;
    assert!(!ok, "an unbound token patched a node");
    assert!(err.contains("its token names none"), "{err}");

    // The policy is about registrars: an administrator (and an account
    // granted the exemption verb) still patches any node.
    cluster
        .kubectl_ok([
            "patch",
            "node",
            other,
            "--type=merge",
            "-p",
            &label_patch("admin"),
        ])
        .await
        .expect("admin patches any node");
    let exempt = format!(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: sec-any-node}}
rules: [{{apiGroups: [csiops.dev], resources: [nodescope], verbs: [any-node]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: sec-any-node}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: sec-any-node}}
subjects: [{{kind: ServiceAccount, name: drv-node, namespace: {NS}}}]
"#
    );
    testkit::apply_ok(&cluster, "exempt", &exempt).await;
    // RBAC changes reach the authorizer's cache within moments.
    wait_for(
        Duration::from_secs(30),
        Duration::from_millis(500),
        || async {
            as_token(
                &cluster,
                &token,
                &[
                    "patch",
                    "node",
                    other,
                    "--type=merge",
                    "-p",
                    &label_patch("exempt"),
                ],
            )
            .await
            .0
            .then_some(())
        },
    )
    .await
    .expect("an exempted account patches another node");

    cluster.stop().await.expect("cluster stops");
}
