//! The operator end to end on a real control plane: install of a central
//! driver (the fixture `e2e/fixtures/hostpath-central.yaml`), an ordered
//! upgrade, and an ordered teardown that leaves nothing.
//!
//! The operator runs as its ServiceAccount with install.yaml's RBAC (the
//! admin credentials impersonate it), so every object it writes proves that
//! RBAC is enough: it binds the shipped sidecar roles without holding their
//! verbs.
//!
//! One cluster for the whole file: the steps build on each other, as a storage
//! admin's day would. kwok pods run nothing, so the node side is played per
//! node once its node pod is Ready: a real CSI driver process and the csiops
//! registrar, registered by a kubelet plugin-watcher client; REGISTERED comes
//! from the CSINode entries the registrar writes.

use std::time::Duration;

use csiops_e2e::rollout_clock::RolloutClock;
use csiops_e2e::testkit;
use csiops_e2e::timeline::{Entry, Timeline};
use csiops_e2e::{operator_bin, wait_for, Cluster, ClusterOptions, OperatorProcess};
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::api::{Api, ListParams};

const NS: &str = "csi-hostpath";
const NAME: &str = "hostpath";
const DRIVER: &str = "hostpath.csi.k8s.io";
const NODES: usize = 3;
const DEADLINE: Duration = Duration::from_secs(120);

fn is_sts(e: &Entry) -> bool {
    e.kind == "StatefulSet" && e.name == "hostpath-controller"
}

fn is_ds(e: &Entry) -> bool {
    e.kind == "DaemonSet" && e.name == "hostpath-node"
}

/// What every phase works on: the cluster, an admin client and the operator
/// (for its log when a wait fails).
struct Bed {
    cluster: Cluster,
    client: kube::Client,
    operator: OperatorProcess,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_upgrade_and_delete_in_order() {
    let cluster = Cluster::start(ClusterOptions::kwok(NODES))
        .await
        .expect("cluster starts");
    let client = cluster.client().expect("client");
    the_crd_and_its_short_name_are_served(&cluster).await;

    let operator = cluster
        .run_operator_as(
            &operator_bin().expect("operator built"),
            testkit::OPERATOR_NAMESPACE,
            testkit::OPERATOR_ACCOUNT,
            &[],
        )
        .expect("operator starts");
    let _nodes = testkit::node_side(&cluster, NS, NAME, DRIVER).expect("node side starts");
    let mut bed = Bed {
        cluster,
        client,
        operator,
    };

    install_brings_the_node_pods_up_before_the_controller(&bed).await;
    the_accounts_are_bound_to_the_shipped_roles_only(&bed).await;
    each_account_may_do_what_it_needs_and_no_more(&bed).await;
    the_csidriver_and_storage_class_exist(&bed).await;
    an_upgrade_rolls_nodes_then_the_controller_with_a_surge(&bed).await;
    let hashes = an_extra_container_named_like_ours_is_degraded(&bed).await;
    helpers_join_the_controller_without_a_node_roll(&bed, hashes).await;
    teardown_goes_controller_then_nodes_then_cluster_objects(&bed).await;
    nothing_is_left(&bed).await;

    bed.operator
        .check_running()
        .expect("operator still running after the whole lifecycle");
    let Bed {
        cluster, operator, ..
    } = bed;
    drop(operator);
    cluster.stop().await.expect("cluster stops");
}

/// The CRD installs (with install.yaml's RBAC) and kubectl knows the
/// resource and its short name.
async fn the_crd_and_its_short_name_are_served(cluster: &Cluster) {
    testkit::install_operator_rbac(cluster)
        .await
        .expect("install.yaml's CRD and RBAC apply");
    let out = cluster
        .kubectl(["get", "csidriverdeployments", "-A"])
        .await
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cluster
        .kubectl(["get", "csidd", "-A"])
        .await
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "short name csidd: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The central fixture reaches Running, and the node pods were up before
/// the controller was created.
async fn install_brings_the_node_pods_up_before_the_controller(bed: &Bed) {
    let Bed {
        cluster,
        client,
        operator,
    } = bed;
    let install = Timeline::start(client, NS);
    let example = testkit::central_fixture_path();
    cluster
        .kubectl_ok(["apply", "-f", &example.to_string_lossy()])
        .await
        .expect("central fixture applies");
    let row = testkit::wait_running(cluster, NS, NAME, "v1.17.0", NODES, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\noperator log:\n{}", operator.log_tail(40)));
    assert_eq!(row["DRIVER"], DRIVER);
    assert_eq!(row["CONTROLLER"], "1/1");
    assert_eq!(row["NODES"], "3/3");
    assert_eq!(row["REGISTERED"], "3/3");
    let wide = cluster
        .kubectl_ok(["get", "csidriverdeployments", "-A", "-o", "wide"])
        .await
        .expect("wide output");
    println!("{wide}");

    let entries = install.entries();
    let dump = Timeline::render(&entries);
    Timeline::first(&entries, |e| is_ds(e) && e.desired == 3 && e.available == 3)
        .unwrap_or_else(|| panic!("DaemonSet never available:\n{dump}"));
    let sts_created =
        Timeline::first(&entries, is_sts).unwrap_or_else(|| panic!("no StatefulSet:\n{dump}"));
    // The operator judges the node side pod by pod, so its next step can be
    // stored before the DaemonSet controller's counters catch up: the pods
    // are what must be up.
    assert_eq!(
        Timeline::current_ready_pods(&entries, sts_created, "hostpath-node", 1),
        NODES,
        "install must bring the node pods up before the controller:\n{dump}"
    );
    drop(install);
}

/// Everything of the design exists. RBAC: bindings of the shipped roles
/// only; the operator made no role.
async fn the_accounts_are_bound_to_the_shipped_roles_only(bed: &Bed) {
    let client = &bed.client;
    let ns_sa: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    for sa in ["hostpath-controller", "hostpath-node"] {
        assert!(
            ns_sa.get_opt(sa).await.expect("get sa").is_some(),
            "ServiceAccount {sa}"
        );
    }
    // RBAC: bindings of the shipped roles only; the operator made no role.
    let role_bindings: Api<RoleBinding> = Api::namespaced(client.clone(), NS);
    for (name, role) in [
        ("hostpath-leases", "csiops:leader-election"),
        ("hostpath-journal", "csiops:provisioner-journal"),
    ] {
        let binding = role_bindings.get(name).await.expect("RoleBinding");
        assert_eq!(binding.role_ref.name, role);
    }
    let cluster_roles: Api<ClusterRole> = Api::all(client.clone());
    let cluster_bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    for (name, role) in [
        (
            "csiops:hostpath.csi.k8s.io:provisioner",
            "csiops:provisioner",
        ),
        ("csiops:hostpath.csi.k8s.io:registrar", "csiops:registrar"),
    ] {
        let binding = cluster_bindings
            .get(name)
            .await
            .expect("ClusterRoleBinding");
        assert_eq!(binding.role_ref.name, role);
    }
    let owned = ListParams::default().labels("app.kubernetes.io/managed-by=csiops-operator");
    assert!(cluster_roles
        .list(&owned)
        .await
        .expect("list")
        .items
        .is_empty());
    assert!(Api::<Role>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .is_empty());
}

/// The controller's and node's account from the driver's namespace.
fn driver_accounts() -> (String, String) {
    (
        format!("system:serviceaccount:{NS}:hostpath-controller"),
        format!("system:serviceaccount:{NS}:hostpath-node"),
    )
}

/// What each account may do, as the API server's authorizer answers.
async fn each_account_may_do_what_it_needs_and_no_more(bed: &Bed) {
    let cluster = &bed.cluster;
    let (controller, node) = driver_accounts();
    let operator_sa = format!(
        "system:serviceaccount:{}:{}",
        testkit::OPERATOR_NAMESPACE,
        testkit::OPERATOR_ACCOUNT
    );
    for (who, args, allowed) in [
        // Its classes name no Secret: none beyond its own namespace's
        // (the journal's key), issue 37 §2.
        (&controller, vec!["get", "secrets", "-A"], false),
        (&controller, vec!["get", "secrets", "-n", "default"], false),
        (&controller, vec!["create", "persistentvolumes"], true),
        (
            &controller,
            vec!["create", "leases.coordination.k8s.io", "-n", NS],
            true,
        ),
        (
            &controller,
            vec!["create", "leases.coordination.k8s.io", "-n", "default"],
            false,
        ),
        (&controller, vec!["patch", "nodes"], false),
        (&node, vec!["patch", "nodes"], true),
        (&node, vec!["get", "secrets", "-A"], false),
        (&operator_sa, vec!["get", "secrets", "-A"], false),
        (&operator_sa, vec!["list", "secrets", "-n", NS], false),
        // patch nodes: a takeover's labels only, which the admission
        // policy csiops-operator-node-labels enforces (security.rs).
        (&operator_sa, vec!["patch", "nodes"], true),
        (&operator_sa, vec!["delete", "clusterroles"], false),
        (&operator_sa, vec!["create", "persistentvolumes"], false),
        (&operator_sa, vec!["delete", "persistentvolumes"], false),
        (&operator_sa, vec!["create", "configmaps", "-n", NS], false),
        (
            &operator_sa,
            vec!["create", "leases.coordination.k8s.io", "-n", NS],
            false,
        ),
        (
            &operator_sa,
            vec!["create", "clusterroles.rbac.authorization.k8s.io"],
            false,
        ),
        (
            &operator_sa,
            vec!["escalate", "clusterroles.rbac.authorization.k8s.io"],
            false,
        ),
        (
            &operator_sa,
            vec![
                "bind",
                "clusterroles.rbac.authorization.k8s.io/cluster-admin",
            ],
            false,
        ),
        (
            &operator_sa,
            vec![
                "bind",
                "clusterroles.rbac.authorization.k8s.io/csiops:provisioner",
            ],
            true,
        ),
        (
            &operator_sa,
            vec!["create", "clusterrolebindings.rbac.authorization.k8s.io"],
            true,
        ),
    ] {
        assert_eq!(
            testkit::can_i(cluster, who, &args).await,
            allowed,
            "{who} {args:?}"
        );
    }
}

/// The CSIDriver and StorageClass of the fixture, and the object Available.
async fn the_csidriver_and_storage_class_exist(bed: &Bed) {
    let Bed {
        cluster, client, ..
    } = bed;
    let csidriver = Api::<CSIDriver>::all(client.clone())
        .get(DRIVER)
        .await
        .expect("CSIDriver exists");
    let spec = csidriver.spec;
    assert_eq!(spec.attach_required, Some(false));
    assert_eq!(spec.pod_info_on_mount, Some(true));
    assert_eq!(spec.fs_group_policy.as_deref(), Some("File"));
    let sc = Api::<StorageClass>::all(client.clone())
        .get("csi-hostpath-sc")
        .await
        .expect("StorageClass");
    assert_eq!(sc.provisioner, DRIVER);
    assert_eq!(
        sc.volume_binding_mode.as_deref(),
        Some("WaitForFirstConsumer")
    );
    let phase = testkit::jsonpath(
        cluster,
        &["-n", NS, "get", "csidd", NAME],
        "{.status.conditions[?(@.type==\"Available\")].status}",
    )
    .await
    .expect("jsonpath");
    assert_eq!(phase, "True");
}

/// An edit of `spec.version` is seen as Upgrading and rolls the node pods
/// first, then the controller with a surge replica, never without a Ready
/// one; the Events tell each step.
async fn an_upgrade_rolls_nodes_then_the_controller_with_a_surge(bed: &Bed) {
    let Bed {
        cluster,
        client,
        operator,
    } = bed;
    let sts_api: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    let ds_api: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    let old_sts_hash = sts_api
        .get("hostpath-controller")
        .await
        .expect("sts")
        .metadata
        .annotations
        .and_then(|a| a.get("csiops.dev/template-hash").cloned());
    let old_ds_hash = ds_api
        .get("hostpath-node")
        .await
        .expect("ds")
        .metadata
        .annotations
        .and_then(|a| a.get("csiops.dev/template-hash").cloned());

    let upgrade = Timeline::start(client, NS);
    // The object's status as a watch sees it: on a quiet machine the whole
    // upgrade of three played nodes takes well under a second, quicker
    // than polls of `kubectl get` reliably catch.
    let phases = RolloutClock::watch(client, NS, "hostpath-node", None, Some(NAME));
    phases
        .synced(DEADLINE)
        .await
        .expect("the object's watch lists it");
    phases.zero(std::time::Instant::now(), None);
    cluster
        .kubectl_ok([
            "-n", NS, "patch", "csidd", NAME, "--type=merge", "-p",
            r#"{"spec":{"version":"v1.18.0","driver":{"image":"registry.k8s.io/sig-storage/hostpathplugin:v1.18.0"}}}"#,
        ])
        .await
        .expect("edit applies");
    // The rollout shows up as Upgrading before it completes.
    phases
        .seen(
            "CSIDriverDeployment",
            |state| state.starts_with("Upgrading "),
            DEADLINE,
        )
        .await
        .unwrap_or_else(|| panic!("rollout never visible as Upgrading: {:?}", phases.marks()));
    drop(phases);
    testkit::wait_running(cluster, NS, NAME, "v1.18.0", NODES, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\noperator log:\n{}", operator.log_tail(40)));

    let entries = upgrade.entries();
    let dump = Timeline::render(&entries);
    let changed = |e: &Entry, old: &Option<String>| e.hash.is_some() && e.hash != *old;
    let ds_changed = Timeline::first(&entries, |e| is_ds(e) && changed(e, &old_ds_hash))
        .unwrap_or_else(|| panic!("DaemonSet never rolled:\n{dump}"));
    let new_template = entries[ds_changed].template_generation;
    Timeline::first(&entries, |e| {
        is_ds(e)
            && changed(e, &old_ds_hash)
            && e.observed_generation >= e.generation
            && e.updated == 3
            && e.available == 3
            && e.desired == 3
    })
    .unwrap_or_else(|| panic!("DaemonSet never rolled out:\n{dump}"));
    let sts_changed = Timeline::first(&entries, |e| is_sts(e) && changed(e, &old_sts_hash))
        .unwrap_or_else(|| panic!("controller never updated:\n{dump}"));
    let surge_ready = Timeline::first(&entries, |e| {
        is_sts(e) && changed(e, &old_sts_hash) && e.desired == 2 && e.ready == 2
    })
    .unwrap_or_else(|| panic!("the controller's surge replica never came up:\n{dump}"));
    let sts_up = Timeline::first(&entries, |e| {
        is_sts(e) && changed(e, &old_sts_hash) && e.desired == 1 && e.ready == 1 && e.updated == 1
    })
    .unwrap_or_else(|| panic!("controller never came back to one replica:\n{dump}"));
    // As at install: the node pods, not the DaemonSet's counters, must be
    // current and Ready before the controller changes.
    assert!(
        ds_changed < sts_changed
            && Timeline::current_ready_pods(&entries, sts_changed, "hostpath-node", new_template)
                == NODES,
        "node pods rolled and Ready before the controller changes:\n{dump}"
    );
    assert!(sts_changed < surge_ready && surge_ready < sts_up, "{dump}");
    // The old controller served throughout: never without a Ready replica.
    assert!(
        entries
            .iter()
            .filter(|e| is_sts(e))
            .all(|e| e.desired >= 1 && e.ready >= 1),
        "the controller stopped serving during the upgrade:\n{dump}"
    );
    drop(upgrade);

    let events = cluster
        .kubectl_ok([
            "-n",
            NS,
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=hostpath",
            "-o",
            "custom-columns=REASON:.reason,NOTE:.note,MSG:.message",
        ])
        .await
        .expect("events");
    for reason in ["RolloutStarted", "StepCompleted", "RolloutCompleted"] {
        assert!(events.contains(reason), "no {reason} Event in:\n{events}");
    }
    assert!(events.contains("NodeRoll"), "{events}");
    assert!(!events.contains("ControllerScaleDown"), "{events}");
}

/// The controller's and the DaemonSet's template hashes.
struct Hashes {
    sts: Option<String>,
    ds: Option<String>,
}

/// The template hash among an object's annotations.
fn template_hash(
    annotations: Option<std::collections::BTreeMap<String, String>>,
) -> Option<String> {
    annotations.and_then(|a| a.get("csiops.dev/template-hash").cloned())
}

/// An extra container named like one of the operator's: Degraded, naming
/// the collision, and nothing applied. The hashes from before the edit.
async fn an_extra_container_named_like_ours_is_degraded(bed: &Bed) -> Hashes {
    let Bed {
        cluster,
        client,
        operator,
    } = bed;
    let sts_api: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    let ds_api: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    let sts_hash = template_hash(
        sts_api
            .get("hostpath-controller")
            .await
            .expect("sts")
            .metadata
            .annotations,
    );
    let ds_hash = template_hash(
        ds_api
            .get("hostpath-node")
            .await
            .expect("ds")
            .metadata
            .annotations,
    );
    // An extra container named like one of the operator's: Degraded, naming
    // the collision, and nothing applied.
    cluster
        .kubectl_ok([
            "-n", NS, "patch", "csidd", NAME, "--type=merge", "-p",
            r#"{"spec":{"sidecars":{"extra":[{"name":"csi-provisioner","image":"registry.example.com/vendor-sidecar:v1"}]}}}"#,
        ])
        .await
        .expect("edit applies");
    let message = wait_for(DEADLINE, Duration::from_millis(300), || async {
        let args = ["-n", NS, "get", "csidd", NAME];
        let reason = testkit::jsonpath(
            cluster,
            &args,
            "{.status.conditions[?(@.type==\"Degraded\")].reason}",
        )
        .await
        .ok()?;
        let message = testkit::jsonpath(
            cluster,
            &args,
            "{.status.conditions[?(@.type==\"Degraded\")].message}",
        )
        .await
        .ok()?;
        (reason == "RenderFailed").then_some(message)
    })
    .await
    .unwrap_or_else(|_| panic!("collision not reported\n{}", operator.log_tail(40)));
    assert!(
        message.contains("spec.sidecars.extra[0].name \"csi-provisioner\"")
            && message.contains("provisioner sidecar"),
        "{message}"
    );
    let unchanged = template_hash(
        sts_api
            .get("hostpath-controller")
            .await
            .expect("sts")
            .metadata
            .annotations,
    );
    assert_eq!(unchanged, sts_hash, "nothing is applied while Degraded");
    Hashes {
        sts: sts_hash,
        ds: ds_hash,
    }
}

/// The three upstream helpers and a vendor container (renamed): they join
/// the controller pod; the DaemonSet is not touched and the controller is
/// not scaled down first, as for any controller-only change. Their
/// upstream RBAC is granted to the controller's ServiceAccount.
async fn helpers_join_the_controller_without_a_node_roll(bed: &Bed, hashes: Hashes) {
    let Bed {
        cluster,
        client,
        operator,
    } = bed;
    let Hashes {
        sts: sts_hash,
        ds: ds_hash,
    } = hashes;
    let sts_api: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    let (controller, _) = driver_accounts();
    let helpers = Timeline::start(client, NS);
    cluster
        .kubectl_ok([
            "-n", NS, "patch", "csidd", NAME, "--type=merge", "-p",
            r#"{"spec":{"sidecars":{"resizer":{"enabled":true},"snapshotter":{"enabled":true},"healthMonitor":{"enabled":true},"extra":[{"name":"vendor-sidecar","image":"registry.example.com/vendor-sidecar:v1"}]}}}"#,
        ])
        .await
        .expect("edit applies");
    let sts = wait_for(DEADLINE, Duration::from_millis(300), || async {
        let sts = sts_api.get("hostpath-controller").await.ok()?;
        (template_hash(sts.metadata.annotations.clone()) != sts_hash).then_some(sts)
    })
    .await
    .unwrap_or_else(|_| panic!("controller never updated\n{}", operator.log_tail(40)));
    let containers: Vec<String> = sts
        .spec
        .and_then(|s| s.template.spec)
        .map(|p| p.containers.into_iter().map(|c| c.name).collect())
        .unwrap_or_default();
    for name in [
        "csi-resizer",
        "csi-snapshotter",
        "csi-external-health-monitor-controller",
        "vendor-sidecar",
    ] {
        assert!(
            containers.iter().any(|c| c == name),
            "{name} not in {containers:?}"
        );
    }
    wait_for(DEADLINE, Duration::from_millis(300), || async {
        let row = testkit::csidd_row(cluster, NS, NAME).await.ok()?;
        let sts = sts_api.get("hostpath-controller").await.ok()?;
        let status = sts.status?;
        let done = row["PHASE"] == "Running"
            && status.ready_replicas == Some(1)
            && status.updated_replicas == Some(1);
        done.then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("helpers never rolled out\n{}", operator.log_tail(40)));
    let entries = helpers.entries();
    let dump = Timeline::render(&entries);
    assert!(
        entries
            .iter()
            .filter(|e| is_ds(e))
            .all(|e| e.hash == ds_hash),
        "a controller-only change rolled the DaemonSet:\n{dump}"
    );
    assert!(
        entries
            .iter()
            .filter(|e| is_sts(e))
            .all(|e| e.desired >= 1 && e.ready >= 1),
        "a controller-only change stopped the controller:\n{dump}"
    );
    assert!(
        entries.iter().any(|e| is_sts(e) && e.desired == 2),
        "a controller-only change rolls with a surge replica:\n{dump}"
    );
    drop(helpers);
    // Their upstream RBAC is granted to the controller's ServiceAccount
    // (through the shipped helper roles), as the API server authorizes it.
    for args in [
        ["patch", "persistentvolumeclaims", "--subresource=status"],
        ["watch", "volumeattributesclasses.storage.k8s.io", "-A"],
        [
            "update",
            "volumesnapshotcontents.snapshot.storage.k8s.io",
            "--subresource=status",
        ],
        [
            "patch",
            "volumegroupsnapshotcontents.groupsnapshot.storage.k8s.io",
            "-A",
        ],
        ["list", "pods", "-A"],
    ] {
        assert!(
            testkit::can_i(cluster, &controller, &args).await,
            "{controller} may not {args:?}"
        );
    }
}

/// Delete tears down controller → DaemonSet → cluster-scoped objects.
async fn teardown_goes_controller_then_nodes_then_cluster_objects(bed: &Bed) {
    let Bed {
        cluster,
        client,
        operator,
    } = bed;
    let teardown = Timeline::start(client, NS);
    cluster
        .kubectl_ok(["-n", NS, "delete", "csidd", NAME, "--wait=false"])
        .await
        .expect("delete accepted");
    wait_for(DEADLINE, Duration::from_millis(300), || async {
        let out = cluster
            .kubectl(["-n", NS, "get", "csidd", NAME])
            .await
            .ok()?;
        (!out.status.success()).then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("object not gone; operator log:\n{}", operator.log_tail(40)));
    let entries = teardown.entries();
    let dump = Timeline::render(&entries);
    let sts_gone = Timeline::first(&entries, |e| is_sts(e) && e.deleted)
        .unwrap_or_else(|| panic!("StatefulSet not deleted:\n{dump}"));
    let ds_gone = Timeline::first(&entries, |e| is_ds(e) && e.deleted)
        .unwrap_or_else(|| panic!("DaemonSet not deleted:\n{dump}"));
    let driver_gone = Timeline::first(&entries, |e| {
        e.kind == "CSIDriver" && e.name == DRIVER && e.deleted
    })
    .unwrap_or_else(|| panic!("CSIDriver not deleted:\n{dump}"));
    assert!(
        sts_gone < ds_gone && ds_gone < driver_gone,
        "teardown order controller → node → cluster objects:\n{dump}"
    );
}

/// Nothing is left, cluster-scoped objects included (namespaced ones via GC).
async fn nothing_is_left(bed: &Bed) {
    let client = &bed.client;
    let ns_sa: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    let cluster_roles: Api<ClusterRole> = Api::all(client.clone());
    let cluster_bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let sts_api: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    let ds_api: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    wait_for(DEADLINE, Duration::from_millis(300), || async {
        let left = pods
            .list(&ListParams::default().labels("app.kubernetes.io/instance=hostpath"))
            .await
            .ok()?;
        let sas = ns_sa
            .list(&ListParams::default().labels("app.kubernetes.io/instance=hostpath"))
            .await
            .ok()?;
        (left.items.is_empty() && sas.items.is_empty()).then_some(())
    })
    .await
    .expect("pods and ServiceAccounts garbage-collected");
    let owner_selector = "app.kubernetes.io/managed-by=csiops-operator";
    let lp = ListParams::default().labels(owner_selector);
    assert!(cluster_roles
        .list(&lp)
        .await
        .expect("list")
        .items
        .is_empty());
    assert!(cluster_bindings
        .list(&lp)
        .await
        .expect("list")
        .items
        .is_empty());
    assert!(Api::<CSIDriver>::all(client.clone())
        .list(&lp)
        .await
        .expect("list")
        .items
        .is_empty());
    assert!(Api::<StorageClass>::all(client.clone())
        .list(&lp)
        .await
        .expect("list")
        .items
        .is_empty());
    assert!(sts_api
        .get_opt("hostpath-controller")
        .await
        .expect("get")
        .is_none());
    assert!(ds_api
        .get_opt("hostpath-node")
        .await
        .expect("get")
        .is_none());
}
