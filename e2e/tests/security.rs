//! The security properties of csiops (README, Security model) on a real
//! control plane, enforced by the API server itself: the shipped
//! ValidatingAdmissionPolicies and RBAC of `manifests/install.yaml`.
//!
//! - A registrar's ServiceAccount token (bound to a pod on one node)
//!   writes that node's Node and CSINode, and is refused every other
//!   node's, with a message naming both; a token bound to no pod names no
//!   node and is refused outright (fail closed).

use std::time::Duration;

use csiops_e2e::testkit::DriverCr;
use csiops_e2e::{testkit, wait_for, Cluster, ClusterOptions, OperatorProcess};

const NS: &str = "csi-sec";

/// `kubectl` with `token` instead of the admin's credentials: (ok, stderr).
async fn as_token(cluster: &Cluster, token: &str, args: &[&str]) -> (bool, String) {
    kubectl_as(cluster, &[format!("--token={token}")], args).await
}

/// `kubectl` with `identity` (flags naming who asks) before `args`:
/// (ok, stderr).
async fn kubectl_as<S: AsRef<str>>(
    cluster: &Cluster,
    identity: &[String],
    args: &[S],
) -> (bool, String) {
    let mut all = identity.to_vec();
    all.extend(args.iter().map(|a| a.as_ref().to_string()));
    let out = cluster.kubectl(&all).await.expect("kubectl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A cluster of `nodes` kwok nodes with install.yaml's RBAC and admission
/// policies, which every test here puts to the proof.
async fn policed_cluster(nodes: usize) -> Cluster {
    let cluster = Cluster::start(ClusterOptions::kwok(nodes))
        .await
        .expect("cluster starts");
    testkit::install_operator_rbac(&cluster)
        .await
        .expect("install.yaml's RBAC and policies apply");
    cluster
}

/// The operator, as install.yaml's account, with `args`.
fn operator_with(cluster: &Cluster, args: &[&str]) -> OperatorProcess {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    cluster
        .run_operator_as(
            &csiops_e2e::operator_bin().expect("operator built"),
            testkit::OPERATOR_NAMESPACE,
            testkit::OPERATOR_ACCOUNT,
            &args,
        )
        .expect("operator starts")
}

/// A driver object `name` in `ns` that kwok nodes can run.
fn plain_cr(ns: &str, name: &str) -> String {
    DriverCr::new(ns, name, &format!("{name}.csi.example.com"), "v1")
        .image("registry.example.com/driver:v1")
        .with("csiDriver.attachRequired", false)
        .yaml()
}

/// Waits until the object `ns/name` is deployed (its node DaemonSet
/// exists); panics with `what` and the operator's log otherwise.
async fn wait_deployed(
    cluster: &Cluster,
    operator: &OperatorProcess,
    ns: &str,
    name: &str,
    deadline: Duration,
    what: &str,
) {
    let daemonset = format!("{name}-node");
    wait_for(deadline, Duration::from_millis(500), || async {
        cluster
            .kubectl_ok(["-n", ns, "get", "daemonset", &daemonset])
            .await
            .ok()
    })
    .await
    .unwrap_or_else(|_| panic!("{what}\n{}", operator.log_tail(40)));
}

fn label_patch(value: &str) -> String {
    format!(r#"{{"metadata":{{"labels":{{"example.com/touched":"{value}"}}}}}}"#)
}

/// Issue 37 §3: on its own Node a registrar's token adds topology labels,
/// writes the node-ID annotation and removes a driver-readiness taint, and
/// nothing else: no `node-role` or `node-restriction.kubernetes.io` label,
/// no change to an existing label or another annotation, no other taint
/// added or removed, no `unschedulable`, no delete.
async fn what_a_registrar_may_change_on_its_node(cluster: &Cluster, token: &str, own: &str) {
    let readiness = "csiops.dev/driver-not-ready.sec.csi.example.com";
    let patch = |p: String| {
        vec![
            "patch".to_string(),
            "node".into(),
            own.to_string(),
            "--type=merge".into(),
            "-p".into(),
            p,
        ]
    };
    let labels = |k: &str, v: &str| format!(r#"{{"metadata":{{"labels":{{"{k}":"{v}"}}}}}}"#);
    let annotation =
        |k: &str, v: &str| format!(r#"{{"metadata":{{"annotations":{{"{k}":"{v}"}}}}}}"#);
    let taints = |keys: &[&str]| {
        let list: Vec<String> = keys
            .iter()
            .map(|k| format!(r#"{{"key":"{k}","effect":"NoSchedule"}}"#))
            .collect();
        format!(r#"{{"spec":{{"taints":[{}]}}}}"#, list.join(","))
    };
    // The node as kubelet registered it with the readiness taint, and an
    // admin's maintenance taint beside it.
    cluster
        .kubectl_ok(patch(taints(&[readiness, "example.com/maintenance"])))
        .await
        .expect("the admin taints the node");
    let run = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        as_token(cluster, token, &args).await
    };
    let refused = [
        (
            patch(labels("node-role.kubernetes.io/control-plane", "")),
            "add a label under kubernetes.io",
        ),
        (
            patch(labels("node-restriction.kubernetes.io/pool", "gold")),
            "add a label under kubernetes.io",
        ),
        (
            patch(labels("example.com/touched", "changed")),
            "change or remove a label",
        ),
        (
            patch(annotation("example.com/note", "x")),
            "change an annotation",
        ),
        (patch(taints(&[readiness])), "add, change or remove a taint"),
        (
            patch(taints(&[
                readiness,
                "example.com/maintenance",
                "example.com/new",
            ])),
            "add, change or remove a taint",
        ),
        (
            patch(r#"{"spec":{"unschedulable":true}}"#.into()),
            "change the spec but its taints",
        ),
    ];
    for (args, why) in refused {
        let (ok, err) = run(args.clone()).await;
        assert!(!ok, "the registrar token was allowed: {args:?}");
        assert!(
            err.contains("csiops-registrar-own-node") && err.contains(why),
            "{args:?}: {err}"
        );
    }
    // Deleting its Node: RBAC refuses it first; the policy would too.
    let (ok, err) = run(vec![
        "delete".into(),
        "node".into(),
        own.to_string(),
        "--dry-run=server".into(),
    ])
    .await;
    assert!(
        !ok && err.contains("delete"),
        "the registrar deleted its node: {err}"
    );
    let allowed = [
        patch(labels("topology.sec.csi.example.com/zone", "a")),
        patch(labels("topology.kubernetes.io/zone", "z1")),
        patch(annotation(
            "csi.volume.kubernetes.io/nodeid",
            r#"{\"sec.csi.example.com\":\"n1\"}"#,
        )),
        patch(taints(&["example.com/maintenance"])),
    ];
    for args in allowed {
        let (ok, err) = run(args.clone()).await;
        assert!(ok, "{args:?}: {err}");
    }
    let left = testkit::jsonpath(cluster, &["get", "node", own], "{.spec.taints[*].key}")
        .await
        .expect("taints");
    assert_eq!(
        left, "example.com/maintenance",
        "only the readiness taint went"
    );
    cluster
        .kubectl_ok(patch(r#"{"spec":{"taints":null}}"#.into()))
        .await
        .expect("the admin removes the maintenance taint");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registrar_token_writes_only_its_own_node() {
    let cluster = policed_cluster(2).await;
    let nodes = cluster.node_names().to_vec();
    let (own, other) = (&nodes[0], &nodes[1]);

    a_node_account_with_a_pod_on_the_first_node(&cluster, own).await;
    let token = a_pod_bound_token_carries_its_node(&cluster, own).await;
    the_token_patches_its_own_node_and_no_other(&cluster, &token, own, other).await;
    what_a_registrar_may_change_on_its_node(&cluster, &token, own).await;
    the_token_creates_its_own_csinode_and_no_other(&cluster, &token, own, other).await;
    a_token_bound_to_no_pod_is_refused(&cluster, own).await;
    admins_and_exempted_accounts_patch_any_node(&cluster, &token, other).await;

    cluster.stop().await.expect("cluster stops");
}

/// A driver's node ServiceAccount, bound to the shipped registrar role as
/// the operator binds it, and a pod of it on the first node.
async fn a_node_account_with_a_pod_on_the_first_node(cluster: &Cluster, own: &str) {
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
    testkit::apply_ok(cluster, "registrar-setup", &setup).await;
}

/// The token kubelet would project into that pod: bound to it, so it
/// carries the pod's node.
async fn a_pod_bound_token_carries_its_node(cluster: &Cluster, own: &str) -> String {
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
        whoami.contains("authentication.kubernetes.io/node-name") && whoami.contains(own),
        "the token carries its node: {whoami}"
    );
    token
}

/// Its own Node: patched. Another: refused, naming both nodes, and left
/// untouched.
async fn the_token_patches_its_own_node_and_no_other(
    cluster: &Cluster,
    token: &str,
    own: &str,
    other: &str,
) {
    // The API server enforces a new policy once its informer has it
    // (moments): wait for a dry run to be refused, then check for real.
    let dry_other = [
        "patch",
        "node",
        other,
        "--dry-run=server",
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"example.com/dry":"run"}}}"#,
    ];
    wait_for(
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async { (!as_token(cluster, token, &dry_other).await.0).then_some(()) },
    )
    .await
    .unwrap_or_else(|_| panic!("the registrar policy never refused another node's patch"));

    // Its own Node: patched. Another: refused, naming both nodes.
    let (ok, err) = as_token(
        cluster,
        token,
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
        cluster,
        token,
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
    let labels = testkit::jsonpath(cluster, &["get", "node", other], "{.metadata.labels}")
        .await
        .expect("labels");
    assert!(!labels.contains("example.com/touched"), "{labels}");
}

/// CSINodes alike: its own created, another's refused.
async fn the_token_creates_its_own_csinode_and_no_other(
    cluster: &Cluster,
    token: &str,
    own: &str,
    other: &str,
) {
    let csinode = |node: &str| {
        format!(
            r#"{{"apiVersion":"storage.k8s.io/v1","kind":"CSINode","metadata":{{"name":"{node}"}},"spec":{{"drivers":[]}}}}"#
        )
    };
    for (node, allowed) in [(own, true), (other, false)] {
        let path = cluster.work_dir().join(format!("csinode-{node}.json"));
        std::fs::write(&path, csinode(node)).expect("write CSINode");
        let (ok, err) = as_token(cluster, token, &["create", "-f", &path.to_string_lossy()]).await;
        assert_eq!(ok, allowed, "CSINode {node}: {err}");
        if !allowed {
            assert!(err.contains("csiops-registrar-own-node"), "{err}");
        }
    }
}

/// A token bound to no pod names no node: refused, saying why.
async fn a_token_bound_to_no_pod_is_refused(cluster: &Cluster, own: &str) {
    let unbound = cluster
        .kubectl_ok(["-n", NS, "create", "token", "drv-node"])
        .await
        .expect("token")
        .trim()
        .to_string();
    let (ok, err) = as_token(
        cluster,
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
}

/// The policy is about registrars: an administrator (and an account
/// granted the exemption verb) still patches any node.
async fn admins_and_exempted_accounts_patch_any_node(cluster: &Cluster, token: &str, other: &str) {
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
    testkit::apply_ok(cluster, "exempt", &exempt).await;
    // RBAC changes reach the authorizer's cache within moments.
    wait_for(
        Duration::from_secs(30),
        Duration::from_millis(500),
        || async {
            as_token(
                cluster,
                token,
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
}

const TEAM: &str = "team-a";
const ALICE: &str = "alice@example.com";

/// `kubectl --as=alice`: (ok, stderr).
async fn as_alice(cluster: &Cluster, args: &[&str]) -> (bool, String) {
    let identity = [format!("--as={ALICE}"), "-n".into(), TEAM.into()];
    kubectl_as(cluster, &identity, args).await
}

/// A CSIDriverDeployment `name` in alice's namespace (which exists).
fn driver_cr(name: &str) -> String {
    DriverCr::new(TEAM, name, &format!("{name}.csi.example.com"), "v1")
        .image("registry.example.com/driver:v1")
        .with("csiDriver.attachRequired", false)
        .object_yaml()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_user_gains_nothing_through_a_csidriverdeployment() {
    let cluster = policed_cluster(1).await;
    alice_may_manage_csidriverdeployments_and_nothing_else(&cluster).await;
    the_policies_type_check_against_the_crd(&cluster).await;
    let path = alice_may_not_create_one(&cluster).await;
    no_change_reaching_an_admins_driver_pods_passes(&cluster).await;
    the_crd_refuses_a_registrar_node_from_env_and_harmless_changes_pass(&cluster).await;
    the_namespace_label_lets_her_change_what_it_guards(&cluster).await;
    the_verb_granted_cluster_wide_lets_her_create_one(&cluster, &path).await;
    cluster.stop().await.expect("cluster stops");
}

/// Alice may manage CSIDriverDeployments in her namespace, nothing else: she
/// holds no right to Secrets, pods, tokens, Nodes or classes.
async fn alice_may_manage_csidriverdeployments_and_nothing_else(cluster: &Cluster) {
    let rbac = format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: {TEAM}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: csidd-editor, namespace: {TEAM}}}
rules:
- apiGroups: [csiops.dev]
  resources: [csidriverdeployments]
  verbs: [get, list, watch, create, update, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: alice-csidd, namespace: {TEAM}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: csidd-editor}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: "{ALICE}"}}]
"#
    );
    testkit::apply_ok(cluster, "alice", &rbac).await;

    // She holds no right to Secrets, pods, tokens, Nodes or classes.
    for args in [
        vec!["get", "secrets", "-n", TEAM],
        vec!["get", "secrets", "-n", "kube-system"],
        vec!["create", "pods", "-n", TEAM],
        vec![
            "create",
            "serviceaccounts",
            "-n",
            TEAM,
            "--subresource=token",
        ],
        vec!["patch", "nodes"],
        vec!["create", "storageclasses.storage.k8s.io"],
        vec!["create", "volumeattributesclasses.storage.k8s.io"],
        vec!["create", "configmaps", "-n", TEAM],
    ] {
        assert!(
            !testkit::can_i(cluster, ALICE, &args).await,
            "alice may {args:?}"
        );
    }
}

/// The policies type-check against the CRD's schema.
async fn the_policies_type_check_against_the_crd(cluster: &Cluster) {
    for policy in ["csiops-driver-host-access", "csiops-registrar-own-node"] {
        let checked = wait_for(
            Duration::from_secs(60),
            Duration::from_millis(500),
            || async {
                let v = testkit::jsonpath(
                    cluster,
                    &["get", "validatingadmissionpolicy", policy],
                    "{.status.typeChecking}",
                )
                .await
                .ok()?;
                (!v.is_empty()).then_some(v)
            },
        )
        .await
        .unwrap_or_else(|_| panic!("{policy} never type-checked"));
        assert!(
            !checked.contains("expressionWarnings"),
            "{policy}: {checked}"
        );
    }
}

/// Alice may not create one of her own; returns the manifest she tried.
async fn alice_may_not_create_one(cluster: &Cluster) -> std::path::PathBuf {
    // Creating one is host access: refused, naming the switch. Polled with
    // a dry run: a new policy is enforced once the API server's informer
    // has it.
    let path = cluster.work_dir().join("alice-drv.yaml");
    std::fs::write(&path, driver_cr("mine")).expect("write");
    let dry = ["create", "--dry-run=server", "-f", &*path.to_string_lossy()];
    wait_for(
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async { (!as_alice(cluster, &dry).await.0).then_some(()) },
    )
    .await
    .unwrap_or_else(|_| panic!("alice may create a CSIDriverDeployment"));
    let create = ["create", "-f", &*path.to_string_lossy()];
    let (ok, refused) = as_alice(cluster, &create).await;
    assert!(!ok, "alice created a CSIDriverDeployment");
    assert!(
        refused.contains("csiops-driver-host-access")
            && refused.contains("may not create CSIDriverDeployment team-a/mine")
            && refused.contains("host-access")
            && refused.contains("csiops.dev/host-access=allowed"),
        "{refused}"
    );
    path
}

/// An admin's driver in her namespace: every change that reaches what its
/// privileged pods run is refused, naming the field.
async fn no_change_reaching_an_admins_driver_pods_passes(cluster: &Cluster) {
    testkit::apply_ok(cluster, "admin-drv", &driver_cr("admins")).await;
    let attempts: [(&str, &str); 11] = [
        (
            "node",
            r#"{"spec":{"node":{"hostNetwork":true,"hostPID":true}}}"#,
        ),
        (
            "node",
            r#"{"spec":{"node":{"volumes":[{"name":"root","hostPath":{"path":"/"}}],"volumeMounts":[{"name":"root","mountPath":"/host"}]}}}"#,
        ),
        (
            "driver",
            r#"{"spec":{"driver":{"image":"evil.example.com/root:1"}}}"#,
        ),
        (
            "controller",
            r#"{"spec":{"controller":{"securityContext":{"privileged":true}}}}"#,
        ),
        (
            "sidecars",
            r#"{"spec":{"sidecars":{"extra":[{"name":"x","image":"evil.example.com/x:1","pod":"Node","mountServiceAccountToken":true}]}}}"#,
        ),
        (
            "driver",
            r#"{"spec":{"driver":{"mountServiceAccountToken":true}}}"#,
        ),
        (
            "storageClasses",
            r#"{"spec":{"storageClasses":[{"name":"grab-all","isDefault":true}]}}"#,
        ),
        (
            "storageClasses",
            r#"{"spec":{"storageClasses":[{"name":"steal","parameters":{"csi.storage.k8s.io/provisioner-secret-namespace":"kube-system","csi.storage.k8s.io/provisioner-secret-name":"admin"}}]}}"#,
        ),
        (
            "volumeAttributesClasses",
            r#"{"spec":{"volumeAttributesClasses":[{"name":"grab","parameters":{"iops":"1"}}]}}"#,
        ),
        (
            "sidecars",
            r#"{"spec":{"sidecars":{"registrar":{"extraArgs":["--node-name=other-node"]}}}}"#,
        ),
        ("node", r#"{"spec":{"node":{"kubeletDir":"/etc"}}}"#),
    ];
    for (field, patch) in attempts {
        let (ok, err) = as_alice(
            cluster,
            &["patch", "csidd", "admins", "--type=merge", "-p", patch],
        )
        .await;
        assert!(!ok, "alice changed spec.{field}: {patch}");
        assert!(
            err.contains(&format!("may not change spec.{field}")) && err.contains("host-access"),
            "{patch}: {err}"
        );
    }
}

/// The registrar's node from env is refused by the CRD itself; what is
/// harmless passes and leaves the guarded fields as they were.
async fn the_crd_refuses_a_registrar_node_from_env_and_harmless_changes_pass(cluster: &Cluster) {
    let (ok, err) = as_alice(
        cluster,
        &[
            "patch",
            "csidd",
            "admins",
            "--type=merge",
            "-p",
            r#"{"spec":{"sidecars":{"registrar":{"env":[{"name":"NODE_NAME","value":"other"}]}}}}"#,
        ],
    )
    .await;
    assert!(!ok && err.contains("NODE_NAME"), "{err}");
    // What is harmless passes: holding the rollout, its pace, the version.
    let (ok, err) = as_alice(
        cluster,
        &[
            "patch",
            "csidd",
            "admins",
            "--type=merge",
            "-p",
            r#"{"spec":{"paused":true,"logLevel":5,"version":"v2","rollout":{"stepTimeoutSeconds":900}}}"#,
        ],
    )
    .await;
    assert!(ok, "a harmless change was refused: {err}");
    let spec = testkit::jsonpath(
        cluster,
        &["-n", TEAM, "get", "csidd", "admins"],
        "{.spec.driver.image} {.spec.node}",
    )
    .await
    .expect("spec");
    assert!(spec.starts_with("registry.example.com/driver:v1"), "{spec}");
    assert!(
        !spec.contains("hostNetwork") && !spec.contains("\"/\""),
        "{spec}"
    );
}

/// The switches: the namespace label lets her change what it guards.
async fn the_namespace_label_lets_her_change_what_it_guards(cluster: &Cluster) {
    cluster
        .kubectl_ok(["label", "namespace", TEAM, "csiops.dev/host-access=allowed"])
        .await
        .expect("label");
    wait_for(
        Duration::from_secs(30),
        Duration::from_millis(500),
        || async {
            as_alice(
                cluster,
                &[
                    "patch",
                    "csidd",
                    "admins",
                    "--type=merge",
                    "-p",
                    r#"{"spec":{"node":{"hostNetwork":true}}}"#,
                ],
            )
            .await
            .0
            .then_some(())
        },
    )
    .await
    .expect("the namespace label allows host access");
    cluster
        .kubectl_ok(["label", "namespace", TEAM, "csiops.dev/host-access-"])
        .await
        .expect("unlabel");
}

/// …and so does the verb, granted cluster-wide; a RoleBinding of it in her
/// namespace does not. `path` is the manifest she was refused.
async fn the_verb_granted_cluster_wide_lets_her_create_one(
    cluster: &Cluster,
    path: &std::path::Path,
) {
    let create = ["create", "-f", &*path.to_string_lossy()];
    let grant = |kind: &str| {
        let (binding_kind, ns) = if kind == "Role" {
            ("RoleBinding", format!(", namespace: {TEAM}"))
        } else {
            ("ClusterRoleBinding", String::new())
        };
        format!(
            r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: csiops-host-access}}
rules: [{{apiGroups: [csiops.dev], resources: [csidriverdeployments], verbs: [host-access]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: {binding_kind}
metadata: {{name: alice-host-access{ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: csiops-host-access}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: "{ALICE}"}}]
"#
        )
    };
    testkit::apply_ok(cluster, "grant-ns", &grant("Role")).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (ok, _) = as_alice(cluster, &create).await;
    assert!(!ok, "a namespaced grant of the verb allowed host access");
    testkit::apply_ok(cluster, "grant-cluster", &grant("Cluster")).await;
    wait_for(
        Duration::from_secs(30),
        Duration::from_millis(500),
        || async { as_alice(cluster, &create).await.0.then_some(()) },
    )
    .await
    .expect("the cluster-wide verb allows creating one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_acts_only_in_its_watch_namespaces() {
    let cluster = policed_cluster(1).await;
    let operator = operator_with(&cluster, &["--watch-namespaces=csi-ok"]);
    // The one elsewhere first: by the time the allowed one is served, the
    // other has had every chance.
    testkit::apply_ok(&cluster, "elsewhere", &plain_cr("team-b", "elsewhere")).await;
    testkit::apply_ok(&cluster, "allowed", &plain_cr("csi-ok", "allowed")).await;
    wait_deployed(
        &cluster,
        &operator,
        "csi-ok",
        "allowed",
        Duration::from_secs(60),
        "the allowed object was not deployed",
    )
    .await;
    let left = cluster
        .kubectl_ok([
            "-n",
            "team-b",
            "get",
            "daemonsets,statefulsets,serviceaccounts,rolebindings",
            "-l",
            "app.kubernetes.io/instance=elsewhere",
            "-o",
            "name",
        ])
        .await
        .expect("list");
    assert!(left.trim().is_empty(), "deployed outside the list: {left}");
    let touched = testkit::jsonpath(
        &cluster,
        &["-n", "team-b", "get", "csidd", "elsewhere"],
        "{.metadata.finalizers}{.status}",
    )
    .await
    .expect("object");
    assert!(
        touched.trim().is_empty(),
        "the operator wrote it: {touched}"
    );
    assert!(cluster
        .kubectl_ok(["get", "csidriver", "elsewhere.csi.example.com"])
        .await
        .is_err());
    drop(operator);
    cluster.stop().await.expect("cluster stops");
}

/// Issue 37 §1: whoever may create namespaces writes their labels, so the
/// host-access label is guarded by its own policy. Bob may create
/// Namespaces and CSIDriverDeployments anywhere, nothing else: a namespace
/// already carrying `csiops.dev/host-access=allowed` is refused, as is
/// adding the label to his own namespace later; removing it, and every
/// other label, pass; an admin holding host access sets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_creator_cannot_label_his_way_to_host_access() {
    const BOB: &str = "bob@example.com";
    let cluster = policed_cluster(1).await;
    let rbac = format!(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: namespace-creator}}
rules:
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get, list, create, update, patch]
- apiGroups: [csiops.dev]
  resources: [csidriverdeployments]
  verbs: [get, list, create, update, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: bob-namespace-creator}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: namespace-creator}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: "{BOB}"}}]
"#
    );
    testkit::apply_ok(&cluster, "bob", &rbac).await;
    let bob = [format!("--as={BOB}")];
    let as_bob = |args: Vec<String>| {
        let (cluster, bob) = (&cluster, &bob);
        async move { kubectl_as(cluster, bob, &args).await }
    };
    let namespace = |name: &str, label: Option<&str>| {
        let labels = label
            .map(|v| format!("\n  labels: {{csiops.dev/host-access: {v}}}"))
            .unwrap_or_default();
        format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}{labels}\n")
    };
    let create = |name: &str, label: Option<&str>| {
        let path = cluster.work_dir().join(format!("{name}.yaml"));
        std::fs::write(&path, namespace(name, label)).expect("write manifest");
        vec![
            "create".to_string(),
            "-f".into(),
            path.display().to_string(),
        ]
    };

    // The policy is enforced once the API server's informer has it.
    let labelled = create("bob-labelled", Some("allowed"));
    let refused = wait_for(Duration::from_secs(60), Duration::from_millis(500), || {
        let args = labelled.clone();
        let as_bob = &as_bob;
        async move {
            let (ok, err) = as_bob(args).await;
            (!ok).then_some(err)
        }
    })
    .await
    .unwrap_or_else(|_| panic!("bob created a namespace carrying the host-access label"));
    assert!(
        refused.contains("may not set the label csiops.dev/host-access")
            && refused.contains("host-access on csidriverdeployments.csiops.dev"),
        "the refusal says why: {refused}"
    );

    // His own namespace, created plain: adding the label is refused, as is
    // any other value; other labels pass.
    let (ok, err) = as_bob(create("bob-plain", None)).await;
    assert!(ok, "a plain namespace: {err}");
    let label = |value: &str| {
        vec![
            "label".to_string(),
            "namespace".into(),
            "bob-plain".into(),
            "--overwrite".into(),
            format!("csiops.dev/host-access={value}"),
        ]
    };
    for value in ["allowed", "yes"] {
        let (ok, err) = as_bob(label(value)).await;
        assert!(!ok, "bob labelled his namespace host-access={value}");
        assert!(err.contains("may not set the label"), "{err}");
    }
    let (ok, err) = as_bob(vec![
        "label".into(),
        "namespace".into(),
        "bob-plain".into(),
        "team=storage".into(),
    ])
    .await;
    assert!(ok, "another label passes: {err}");

    // An admin holding host access labels it; bob may then change other
    // labels, and remove it (taking access away), but not set it again.
    cluster
        .kubectl_ok([
            "label",
            "namespace",
            "bob-plain",
            "csiops.dev/host-access=allowed",
        ])
        .await
        .expect("the admin labels the namespace");
    let (ok, err) = as_bob(vec![
        "label".into(),
        "namespace".into(),
        "bob-plain".into(),
        "--overwrite".into(),
        "team=db".into(),
    ])
    .await;
    assert!(ok, "an update keeping the label passes: {err}");
    let (ok, err) = as_bob(vec![
        "label".into(),
        "namespace".into(),
        "bob-plain".into(),
        "csiops.dev/host-access-".into(),
    ])
    .await;
    assert!(ok, "removing the label passes: {err}");
    let (ok, _) = as_bob(label("allowed")).await;
    assert!(!ok, "bob set the label again after removing it");
    cluster.stop().await.expect("cluster stops");
}

/// Issue 37 §6: the operator's token binds the shipped roles and writes
/// workloads only for what a CSIDriverDeployment owns, naming only that
/// object's ServiceAccounts. RBAC alone lets it bind `csiops:provisioner`
/// to anyone (its `bind` is limited by role, not subject) and run pods as
/// any account; the fence refuses both, and lets its real writes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_token_cannot_bind_roles_or_run_pods_beyond_its_objects() {
    let cluster = policed_cluster(1).await;
    the_operator_may_not_bind_the_provisioner_role_to_itself(&cluster).await;
    the_fence_refuses_what_no_object_of_its_owns(&cluster).await;
    a_secret_reader_and_its_real_bindings_pass(&cluster).await;
    cluster.stop().await.expect("cluster stops");
}

/// The owner labels of a CSIDriverDeployment `storage/drv`.
const OWNED: &str = "app.kubernetes.io/managed-by: csiops-operator, csiops.dev/owner-name: drv, \
                     csiops.dev/owner-namespace: storage, csiops.dev/owner-uid: 0000-1111";

/// A server-side dry run of creating `yaml` (written to `name`.yaml) as the
/// operator's ServiceAccount: (ok, stderr).
async fn as_operator(cluster: &Cluster, yaml: String, name: &'static str) -> (bool, String) {
    const OPERATOR: &str = "system:serviceaccount:csiops-system:csiops-operator";
    let path = cluster.work_dir().join(format!("{name}.yaml"));
    std::fs::write(&path, yaml).expect("write manifest");
    let path = path.display().to_string();
    let args = ["create", "--dry-run=server", "-f", path.as_str()];
    kubectl_as(cluster, &[format!("--as={OPERATOR}")], &args).await
}

/// A ClusterRoleBinding of `csiops:provisioner` to `subject_ns/subject`.
fn provisioner_binding(name: &str, labels: &str, subject_ns: &str, subject: &str) -> String {
    format!(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {name}
  labels: {{{labels}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "csiops:provisioner"}}
subjects: [{{kind: ServiceAccount, name: {subject}, namespace: {subject_ns}}}]
"#
    )
}

/// A Secret reader's binding lives where the Secrets are, owned by the
/// owner labels; it too names only the owner's accounts, and no other role
/// may be bound that way.
fn secret_reader_binding(ns: &str, role: &str, subject_ns: &str, subject: &str) -> String {
    format!(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: "csiops:drv:secret-reader"
  namespace: {ns}
  labels: {{{OWNED}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "{role}"}}
subjects: [{{kind: ServiceAccount, name: {subject}, namespace: {subject_ns}}}]
"#
    )
}

/// The operator's token may not bind `csiops:provisioner` to itself.
async fn the_operator_may_not_bind_the_provisioner_role_to_itself(cluster: &Cluster) {
    // The policy is enforced once the API server's informer has it.
    let to_itself = provisioner_binding("grab", OWNED, "csiops-system", "csiops-operator");
    let refused = wait_for(Duration::from_secs(60), Duration::from_millis(500), || {
        let yaml = to_itself.clone();
        async move {
            let (ok, err) = as_operator(cluster, yaml, "grab").await;
            (!ok).then_some(err)
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the operator's token bound csiops:provisioner to itself"));
    assert!(
        refused.contains("csiops-operator-fence")
            && refused.contains("binds roles only to the ServiceAccounts"),
        "{refused}"
    );
}

/// Bindings naming no owner or not the owner's accounts, an unowned
/// workload and a PodDisruptionBudget of someone else's pods are refused.
async fn the_fence_refuses_what_no_object_of_its_owns(cluster: &Cluster) {
    for (yaml, why) in [
        (
            provisioner_binding("unowned", "a: b", "storage", "drv-controller"),
            "names no owner",
        ),
        (
            provisioner_binding("user", OWNED, "storage", "drv-controller").replace(
                "{kind: ServiceAccount, name: drv-controller, namespace: storage}",
                "{apiGroup: rbac.authorization.k8s.io, kind: User, name: mallory}",
            ),
            "binds roles only to the ServiceAccounts",
        ),
        (
            r#"apiVersion: apps/v1
kind: StatefulSet
metadata: {name: loose, namespace: default}
spec:
  serviceName: loose
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      serviceAccountName: default
      containers: [{name: c, image: registry.invalid/none:1}]
"#
            .to_string(),
            "names no owner",
        ),
        (
            r#"apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: hold
  namespace: default
  ownerReferences:
  - {apiVersion: csiops.dev/v1alpha1, kind: CSIDriverDeployment, name: drv, uid: 0000-1111, controller: true}
spec:
  maxUnavailable: 0
  selector: {matchLabels: {app: someone-elses}}
"#
            .to_string(),
            "guards only the pods of the CSIDriverDeployment",
        ),
        (
            secret_reader_binding(
                "kube-system",
                "csiops:secret-reader",
                "kube-system",
                "default",
            ),
            "binds roles only to the ServiceAccounts",
        ),
        (
            secret_reader_binding(
                "kube-system",
                "csiops:leader-election",
                "storage",
                "drv-controller",
            ),
            "names no owner",
        ),
    ] {
        let (ok, err) = as_operator(cluster, yaml.clone(), "attempt").await;
        assert!(!ok, "the operator's token wrote:\n{yaml}");
        assert!(
            err.contains("csiops-operator-fence") && err.contains(why),
            "{err}"
        );
    }
}

/// A Secret reader's binding of the owner's account passes, and so does
/// what it really writes.
async fn a_secret_reader_and_its_real_bindings_pass(cluster: &Cluster) {
    let (ok, err) = as_operator(
        cluster,
        secret_reader_binding(
            "kube-system",
            "csiops:secret-reader",
            "storage",
            "drv-controller",
        ),
        "reader",
    )
    .await;
    assert!(ok, "a Secret reader's binding was refused: {err}");
    // What it really writes passes: the binding of a driver's controller
    // account, owned by its CSIDriverDeployment.
    cluster
        .kubectl_ok(["create", "namespace", "storage"])
        .await
        .expect("namespace");
    let (ok, err) = as_operator(
        cluster,
        provisioner_binding("csiops:drv:provisioner", OWNED, "storage", "drv-controller"),
        "real",
    )
    .await;
    assert!(ok, "the operator's own kind of binding was refused: {err}");
}

/// A takeover (`spec.adoption`) gives the operator's token two more
/// writes, each fenced to what the takeover needs: Node patches that change
/// only the `adopt.csiops.dev/` labels (policy `csiops-operator-node-labels`),
/// and an update of a DaemonSet no CSIDriverDeployment owns that changes
/// only its pods' scheduling and its update strategy (the operator fence
/// lets that through and nothing more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_token_changes_only_takeover_labels_and_foreign_scheduling() {
    const OPERATOR: &str = "system:serviceaccount:csiops-system:csiops-operator";
    let cluster = policed_cluster(1).await;
    let client = cluster.client().expect("client");
    let node = kube::Api::<k8s_openapi::api::core::v1::Node>::all(client)
        .list(&Default::default())
        .await
        .expect("nodes")
        .items
        .into_iter()
        .find_map(|n| n.metadata.name)
        .expect("a node");
    let as_operator = |args: Vec<String>| {
        let cluster = &cluster;
        async move {
            let mut all = args;
            all.push("--dry-run=server".into());
            kubectl_as(cluster, &[format!("--as={OPERATOR}")], &all).await
        }
    };
    let patch = |kind: &str, name: &str, ns: Option<&str>, body: &str| {
        let mut args = vec!["patch".to_string(), kind.to_string(), name.to_string()];
        if let Some(ns) = ns {
            args.extend(["-n".to_string(), ns.to_string()]);
        }
        args.extend([
            "--type=merge".to_string(),
            "-p".to_string(),
            body.to_string(),
        ]);
        args
    };

    // Any other label: refused, once the API server has the policy.
    let other = patch("node", &node, None, &label_patch("x"));
    let refused = wait_for(Duration::from_secs(60), Duration::from_millis(500), || {
        let other = other.clone();
        let as_operator = &as_operator;
        async move {
            let (ok, err) = as_operator(other).await;
            (!ok && err.contains("csiops-operator-node-labels")).then_some(err)
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the operator's token set an arbitrary label on node {node}"));
    assert!(refused.contains("adopt.csiops.dev/"), "{refused}");
    let takeover = r#"{"metadata":{"labels":{"adopt.csiops.dev/x.csi.example.com":"waiting"}}}"#;
    let (ok, err) = as_operator(patch("node", &node, None, takeover)).await;
    assert!(ok, "the takeover label was refused: {err}");
    let taint = r#"{"spec":{"taints":[{"key":"k","effect":"NoSchedule"}]}}"#;
    let (ok, err) = as_operator(patch("node", &node, None, taint)).await;
    assert!(!ok && err.contains("csiops-operator-node-labels"), "{err}");

    // Someone else's DaemonSet: its scheduling, yes; its pods, no.
    testkit::apply_ok(
        &cluster,
        "vendor-node",
        r#"apiVersion: apps/v1
kind: DaemonSet
metadata: {name: vendor-node, namespace: default}
spec:
  selector: {matchLabels: {app: vendor-node}}
  template:
    metadata: {labels: {app: vendor-node}}
    spec:
      serviceAccountName: default
      containers: [{name: plugin, image: registry.invalid/plugin:1}]
"#,
    )
    .await;
    let confine = r#"{"spec":{"updateStrategy":{"type":"OnDelete","rollingUpdate":null},"template":{"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"adopt.csiops.dev/x.csi.example.com","operator":"In","values":["waiting"]}]}]}}}}}}}"#;
    let (ok, err) = as_operator(patch("daemonset", "vendor-node", Some("default"), confine)).await;
    assert!(ok, "confining a foreign DaemonSet was refused: {err}");
    let swap = r#"{"spec":{"template":{"spec":{"containers":[{"name":"plugin","image":"registry.invalid/evil:1"}]}}}}"#;
    let (ok, err) = as_operator(patch("daemonset", "vendor-node", Some("default"), swap)).await;
    assert!(
        !ok && err.contains("csiops-operator-fence") && err.contains("names no owner"),
        "the operator's token changed a foreign DaemonSet's containers: {err}"
    );
    let host = r#"{"spec":{"template":{"spec":{"hostNetwork":true}}}}"#;
    let (ok, err) = as_operator(patch("daemonset", "vendor-node", Some("default"), host)).await;
    assert!(!ok && err.contains("csiops-operator-fence"), "{err}");
    cluster.stop().await.expect("cluster stops");
}

/// Issue 37 §7: the operator notices when a shipped admission policy is no
/// longer in force. A binding deleted, or switched to `Warn` only, turns
/// every object Degraded (`AdmissionPoliciesMissing`, naming the binding,
/// with a Warning Event); restoring install.yaml's clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_reports_admission_policies_that_are_not_in_force() {
    let cluster = policed_cluster(1).await;
    let operator = operator_with(
        &cluster,
        &["--admission-check=true", "--admission-check-seconds=2"],
    );
    let cr = plain_cr(NS, "guarded");
    testkit::apply_ok(&cluster, "guarded", &cr).await;
    let degraded = || async {
        testkit::jsonpath(
            &cluster,
            &["-n", NS, "get", "csidd", "guarded"],
            "{.status.conditions[?(@.type==\"Degraded\")].reason}|{.status.conditions[?(@.type==\"Degraded\")].message}",
        )
        .await
        .unwrap_or_default()
    };
    // Settled first: the status is written and says nothing of policies.
    let settled = wait_for(
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let d = degraded().await;
            (!d.starts_with('|') && !d.is_empty()).then_some(d)
        },
    )
    .await
    .unwrap_or_else(|_| panic!("no status\n{}", operator.log_tail(40)));
    assert!(
        !settled.starts_with("AdmissionPoliciesMissing"),
        "with install.yaml's policies in place: {settled}"
    );

    let binding = "csiops-driver-host-access";
    cluster
        .kubectl_ok(["delete", "validatingadmissionpolicybinding", binding])
        .await
        .expect("the admin deletes a binding");
    let missing = wait_for(
        Duration::from_secs(30),
        Duration::from_millis(500),
        || async {
            let d = degraded().await;
            d.starts_with("AdmissionPoliciesMissing").then_some(d)
        },
    )
    .await
    .unwrap_or_else(|_| panic!("not reported: {}\n{}", settled, operator.log_tail(40)));
    assert!(
        missing.contains(&format!(
            "ValidatingAdmissionPolicyBinding {binding} is missing"
        )),
        "{missing}"
    );
    let events = testkit::event_lines(&cluster, NS, "guarded").await;
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("AdmissionPoliciesMissing|") && e.contains(binding)),
        "no Warning Event naming the binding: {events:?}"
    );

    // Restored, but only warning: still not in force.
    testkit::install_operator_rbac(&cluster)
        .await
        .expect("install.yaml re-applied");
    cluster
        .kubectl_ok([
            "patch",
            "validatingadmissionpolicybinding",
            binding,
            "--type=merge",
            "-p",
            r#"{"spec":{"validationActions":["Warn"]}}"#,
        ])
        .await
        .expect("the admin weakens the binding");
    wait_for(
        Duration::from_secs(30),
        Duration::from_millis(500),
        || async {
            let d = degraded().await;
            d.contains("does not deny").then_some(d)
        },
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "a Warn-only binding not reported: {}",
            operator.log_tail(40)
        )
    });

    testkit::install_operator_rbac(&cluster)
        .await
        .expect("install.yaml re-applied");
    let cleared = wait_for(
        Duration::from_secs(30),
        Duration::from_millis(500),
        || async {
            let d = degraded().await;
            (!d.starts_with("AdmissionPoliciesMissing")).then_some(d)
        },
    )
    .await
    .unwrap_or_else(|_| panic!("not cleared: {}", operator.log_tail(40)));
    assert!(!cleared.contains("ValidatingAdmissionPolicy"), "{cleared}");
    drop(operator);
    cluster.stop().await.expect("cluster stops");
}

/// Issue 37 §2: a driver's tokens read Secrets only in the namespaces its
/// classes name for the controller side (and `secretAccess.namespaces`
/// adds), through a RoleBinding there. A node-local driver's node token
/// (every node holds one) reads its provisioner's Secret and is refused a
/// foreign one; the bindings follow the spec, a templated namespace
/// without `secretAccess.clusterWide` is refused with nothing changed, and
/// deleting the object removes them from the other namespaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drivers_tokens_read_only_the_secrets_its_classes_name() {
    const NAME: &str = "local";
    let driver = format!("{NAME}.csi.example.com");
    let binding = format!("csiops:{driver}:secret-reader");
    let node = format!("--as=system:serviceaccount:{NS}:{NAME}-node");
    let cluster = policed_cluster(1).await;
    for ns in ["creds", "elsewhere"] {
        cluster
            .kubectl_ok(["create", "namespace", ns])
            .await
            .expect("namespace");
        cluster
            .kubectl_ok([
                "-n",
                ns,
                "create",
                "secret",
                "generic",
                "s",
                "--from-literal=k=v",
            ])
            .await
            .expect("secret");
    }
    let operator = operator_with(&cluster, &[]);
    let class = |namespace: &str| {
        serde_json::json!([{"name": "local", "parameters": {
            "csi.storage.k8s.io/provisioner-secret-name": "s",
            "csi.storage.k8s.io/provisioner-secret-namespace": namespace,
        }}])
    };
    let cr = DriverCr::new(NS, NAME, &driver, "v1")
        .topology("NodeLocal")
        .image("registry.example.com/driver:v1")
        .with("csiDriver.attachRequired", false)
        .with("storageClasses", class("creds"));
    testkit::apply_ok(&cluster, NAME, &cr.yaml()).await;
    wait_deployed(
        &cluster,
        &operator,
        NS,
        NAME,
        Duration::from_secs(60),
        "the node-local driver never deployed",
    )
    .await;
    let bound_in = |ns: &'static str| has_role_binding(&cluster, ns, &binding);
    assert!(bound_in("creds").await, "no {binding} in creds");
    assert!(!bound_in("elsewhere").await);

    // The node token reads its provisioner's Secret, and nothing else.
    let as_node =
        |args: &'static [&'static str]| kubectl_as(&cluster, std::slice::from_ref(&node), args);
    let (ok, err) = as_node(&["-n", "creds", "get", "secret", "s"]).await;
    assert!(ok, "the node provisioner cannot read its Secret: {err}");
    const REFUSED: [&[&str]; 4] = [
        &["-n", "elsewhere", "get", "secret", "s"],
        &["-n", "kube-system", "get", "secrets"],
        &["-n", "creds", "get", "secrets"],
        &["get", "secrets", "-A"],
    ];
    for args in REFUSED {
        let (ok, err) = as_node(args).await;
        assert!(!ok, "the node token may {args:?}");
        assert!(err.contains("forbidden"), "{args:?}: {err}");
    }

    // One namespace more, by the spec: bound there too.
    testkit::merge_patch_cr(
        &cluster,
        NS,
        NAME,
        r#"{"spec":{"secretAccess":{"namespaces":["elsewhere"]}}}"#,
    )
    .await
    .expect("patch");
    wait_for(
        Duration::from_secs(30),
        Duration::from_millis(500),
        || async { bound_in("elsewhere").await.then_some(()) },
    )
    .await
    .unwrap_or_else(|_| panic!("not bound in elsewhere\n{}", operator.log_tail(40)));
    let (ok, err) = as_node(&["-n", "elsewhere", "get", "secret", "s"]).await;
    assert!(ok, "{err}");

    // A namespace by template cannot be bound: refused, naming the switch,
    // and what is bound stays.
    let templated = serde_json::json!({"spec": {"storageClasses": class("${pvc.namespace}")}});
    testkit::merge_patch_cr(&cluster, NS, NAME, &templated.to_string())
        .await
        .expect("patch");
    let degraded = wait_for(
        Duration::from_secs(30),
        Duration::from_millis(500),
        || async {
            let m = testkit::jsonpath(
                &cluster,
                &["-n", NS, "get", "csidd", NAME],
                "{.status.conditions[?(@.type==\"Degraded\")].message}",
            )
            .await
            .unwrap_or_default();
            m.contains("by template").then_some(m)
        },
    )
    .await
    .unwrap_or_else(|_| panic!("not Degraded\n{}", operator.log_tail(40)));
    assert!(
        degraded.contains("spec.secretAccess.clusterWide: true")
            && degraded.contains("provisioner-secret-namespace"),
        "{degraded}"
    );
    assert!(bound_in("creds").await && bound_in("elsewhere").await);

    // Deleted: the bindings in the other namespaces go with it.
    testkit::delete_cr(&cluster, NS, NAME, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("delete: {e}\n{}", operator.log_tail(40)));
    assert!(!bound_in("creds").await && !bound_in("elsewhere").await);
    drop(operator);
    cluster.stop().await.expect("cluster stops");
}

/// Whether the RoleBinding `ns/name` exists.
async fn has_role_binding(cluster: &Cluster, ns: &str, name: &str) -> bool {
    cluster
        .kubectl_ok(["-n", ns, "get", "rolebinding", name])
        .await
        .is_ok()
}

/// The memory limit install.yaml gives the operator (MiB).
const OPERATOR_MEMORY_LIMIT_MIB: u64 = 256;

/// The operator's peak resident memory so far (VmHWM), in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the operator runs");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib / 1024)
        .expect("VmHWM in /proc/<pid>/status")
}

/// Issue 37 §5: the operator's watches select on the managed-by label,
/// which anyone who may create a Deployment may set. 300 Deployments of
/// about 900 KB each (270 MB, more than the operator's 256 MiB limit),
/// labelled managed-by and owned by nothing, in a namespace outside
/// `--watch-namespaces`, are neither kept nor allowed to swell a list:
/// while they exist the operator starts, deploys a driver in its own
/// namespace, and its peak memory stays under the limit install.yaml sets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn padded_objects_labelled_managed_by_do_not_swell_the_operator() {
    use futures::StreamExt;
    use k8s_openapi::api::apps::v1::Deployment;
    use kube::api::PostParams;

    let cluster = policed_cluster(2).await;
    cluster
        .kubectl_ok(["create", "namespace", "team-b"])
        .await
        .expect("namespace");
    let client = cluster.client().expect("client");
    let api: kube::Api<Deployment> = kube::Api::namespaced(client, "team-b");
    let padding = "x".repeat(900 * 1024);
    let padded = |i: usize| -> Deployment {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": format!("padded-{i}"),
                "labels": {"app.kubernetes.io/managed-by": "csiops-operator"},
            },
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": "padded"}},
                "template": {
                    "metadata": {"labels": {"app": "padded"}},
                    "spec": {"containers": [{
                        "name": "c",
                        "image": "registry.example.com/x:v1",
                        "env": [{"name": "PAD", "value": padding}],
                    }]},
                },
            },
        }))
        .expect("a Deployment")
    };
    const PADDED: usize = 300;
    let created = futures::stream::iter(0..PADDED)
        .map(|i| {
            let api = api.clone();
            let d = padded(i);
            async move { api.create(&PostParams::default(), &d).await }
        })
        .buffer_unordered(8)
        .filter(|r| futures::future::ready(r.is_ok()))
        .count()
        .await;
    assert_eq!(created, PADDED, "every padded Deployment is created");

    let operator = operator_with(&cluster, &["--watch-namespaces=csi-ok"]);
    testkit::apply_ok(&cluster, "bounded", &plain_cr("csi-ok", "bounded")).await;
    wait_deployed(
        &cluster,
        &operator,
        "csi-ok",
        "bounded",
        Duration::from_secs(120),
        "not deployed beside the padded objects",
    )
    .await;
    let peak = peak_rss_mib(operator.pid());
    assert!(
        peak < OPERATOR_MEMORY_LIMIT_MIB,
        "the operator's peak memory {peak} MiB reached its {OPERATOR_MEMORY_LIMIT_MIB} MiB limit: it would be OOM-killed"
    );
    eprintln!("operator peak memory with {PADDED} padded Deployments around: {peak} MiB");
    drop(operator);
    cluster.stop().await.expect("cluster stops");
}
