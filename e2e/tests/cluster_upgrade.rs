//! A Kubernetes upgrade under csiops (issue 35 §5), as an admin does it:
//! the test bed starts on the older minor (`CSIOPS_UPGRADE_FROM_BIN_DIR`,
//! 1.36) with two real nodes, the operator from `manifests/install.yaml`,
//! csi-test-driver deployed centrally with two controller replicas and
//! attach required, and a writer (a Deployment, so its pod is re-created
//! elsewhere) appending to a volume every 100 ms. Then, to the pinned
//! release (`CSIOPS_BIN_DIR`, 1.37): the control plane (kube-apiserver,
//! kube-controller-manager, kube-scheduler), then each real node in turn:
//! `kubectl drain`, its kubelet restarted on the new binary, `kubectl
//! uncordon`.
//!
//! Throughout, a poller records whether a controller replica is Ready and
//! what the CSIDriverDeployment's status says. Checked: the server reports
//! the new version after the control-plane step; a controller replica is
//! Ready at every observation (a drain evicts the replicas of its node: it
//! takes a PodDisruptionBudget to keep one); claims created during the
//! upgrade get Bound; the status stays Available and never Degraded; after
//! each node returns, the writer's re-created pod reads what its
//! predecessor wrote; every kubelet reports the new version; the teardown
//! leaves nothing behind. The timeline is printed for the note.
//!
//! Not in `make test` (it needs a second minor's binaries): `make
//! test-upgrade`. Needs root and `make node-prereqs`, like `two_nodes.rs`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use csiops_crds::CSIDriverDeployment;
use csiops_e2e::bins::{kube_version, minor_of};
use csiops_e2e::cluster::kubelet_version;
use csiops_e2e::realnode::{images, node_name, NODE_NAME};
use csiops_e2e::testkit::DriverCr;
use csiops_e2e::{testkit, wait_for, Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

/// The older minor's bin dir the cluster starts from.
const FROM_ENV: &str = "CSIOPS_UPGRADE_FROM_BIN_DIR";
const NS: &str = "csiops-upgrade";
const NAME: &str = "central";
const DRIVER: &str = "upgrade.test.csi.csiops.dev";
/// Immediate binding: a claim made during the upgrade is provisioned and
/// bound without a consumer, by the provisioner and kube-controller-manager
/// alone, which is what an upgrade could break.
const STORAGE_CLASS: &str = "csiops-upgrade";
const NODES: usize = 2;
const DEADLINE: Duration = Duration::from_secs(300);
/// How often the poller looks at the controller replicas and the status.
const POLL: Duration = Duration::from_millis(500);
const WRITER: &str = "writer";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "make test-upgrade: needs the 1.36 binaries too"]
async fn csiops_keeps_serving_through_a_kubernetes_upgrade_on_two_real_nodes() {
    let (from, to) = bin_dirs();
    let from_version = kube_version(&from.join("kube-apiserver")).expect("old version");
    let to_version = kube_version(&to.join("kube-apiserver")).expect("new version");
    assert!(
        minor_of(&from_version).expect("minor") < minor_of(&to_version).expect("minor"),
        "{FROM_ENV} ({from_version}) must be an older minor than the bin dir ({to_version})"
    );
    let tl = Arc::new(Timeline::new());
    let mut cluster = Cluster::start(ClusterOptions {
        nodes: 0,
        real_node: true,
        real_node_count: NODES,
        bin_dir: Some(from.clone()),
        ..ClusterOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("cluster on {from_version} with two real nodes starts: {e}"));
    tl.mark(format!("cluster up on {from_version}, {NODES} real nodes"));
    let client = cluster.client().expect("client");
    deploy(&cluster, &tl).await;

    let mut findings = Vec::new();
    let monitor = Monitor::start(client.clone(), tl.clone());
    upgrade_control_plane(&mut cluster, &to, &to_version, &tl, &mut findings).await;
    for i in 0..NODES {
        upgrade_node(&mut cluster, i, &to, &tl, &mut findings).await;
    }
    check_kubelets(&client, &to_version, &mut findings).await;
    let watched = monitor.stop().await;
    tl.mark("upgrade done");
    writer_pauses(&cluster, &tl).await;

    give_back(&cluster, &mut findings).await;
    let left = cluster.stop_and_report().await.expect("cluster stops");
    tl.mark("cluster stopped");
    tl.print();
    eprintln!("{}", watched.report());

    // Every failed check at once: the run takes minutes, and one cause
    // (say, no PodDisruptionBudget) shows in several of them.
    if watched.controller.zero_ready_polls > 0 {
        findings.push(format!(
            "no controller replica was Ready for up to {:.1}s ({} observations; {}): a drain evicted every replica",
            watched.controller.longest.as_secs_f64(),
            watched.controller.zero_ready_polls,
            watched.pdb
        ));
    }
    for line in &watched.unhealthy {
        findings.push(format!(
            "the CSIDriverDeployment's status was not healthy: {line}"
        ));
    }
    if !left.is_empty() {
        findings.push(format!("left behind: {left:#?}"));
    }
    assert!(findings.is_empty(), "failed checks: {findings:#?}");
}

/// The writer's counter, through its last pod: how many lines, and the
/// longest pause between two (its pod moving with a drain), for the note.
async fn writer_pauses(cluster: &Cluster, tl: &Timeline) {
    let client = cluster.client().expect("client");
    let Some(pod) = wait_writer(&client, None).await else {
        tl.mark("writer: no pod to read the counter through");
        return;
    };
    let counter = read_in(cluster, &pod.name, "counter")
        .await
        .unwrap_or_default();
    let stamps: Vec<u64> = counter
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect();
    let longest = stamps.windows(2).map(|w| w[1].saturating_sub(w[0])).max();
    tl.mark(format!(
        "writer's counter: {} lines, longest pause {:.1}s (its pod moving)",
        stamps.len(),
        longest.unwrap_or(0) as f64 / 1000.0
    ));
}

/// (the old minor's bin dir, the pinned release's).
fn bin_dirs() -> (PathBuf, PathBuf) {
    let from = std::env::var_os(FROM_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "{FROM_ENV} is not set: run `make test-upgrade`, or set it to the 1.36 bin dir \
                 (`CSIOPS_K8S_MINOR=1.36 e2e/cluster-bins/build.sh --core`) and run \
                 `cargo test -p csiops-e2e --test cluster_upgrade -- --ignored`"
            )
        });
    let to = csiops_e2e::bin_dir().expect("the pinned release's bin dir");
    (from, to)
}

/// What happened when, from the test's start; printed at the end.
struct Timeline {
    t0: Instant,
    lines: Mutex<Vec<(Duration, String)>>,
}

impl Timeline {
    fn new() -> Timeline {
        Timeline {
            t0: Instant::now(),
            lines: Mutex::new(Vec::new()),
        }
    }

    /// Records `what` now (and shows it at once: the run takes minutes).
    fn mark(&self, what: impl Into<String>) {
        let (at, what) = (self.t0.elapsed(), what.into());
        eprintln!("[upgrade {:>7.1}s] {what}", at.as_secs_f64());
        if let Ok(mut l) = self.lines.lock() {
            l.push((at, what));
        }
    }

    fn print(&self) {
        let Ok(lines) = self.lines.lock() else { return };
        eprintln!("--- cluster upgrade timeline ---");
        for (at, what) in lines.iter() {
            eprintln!("{:>7.1}s  {what}", at.as_secs_f64());
        }
    }
}

/// The operator, the driver (two controller replicas) Running on both
/// nodes, and the writer Running with its claim Bound.
async fn deploy(cluster: &Cluster, tl: &Timeline) {
    csiops_e2e::walkthrough::install_operator(cluster)
        .await
        .unwrap_or_else(|e| panic!("operator installs: {e}"));
    tl.mark("operator installed");
    let node = cluster.real_node().expect("a real node");
    let image = node
        .images()
        .reference(images::TEST_DRIVER)
        .expect("test driver image")
        .to_string();
    let data = cluster.work_dir().join("data-upgrade");
    let driver = driver_yaml(&image, &node.layout().kubelet_dir(), &data);
    testkit::apply_ok(cluster, "driver", &driver).await;
    wait_whole(cluster)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", testkit::operator_log(cluster)));
    tl.mark("driver Running: 2/2 controller replicas, registered on both nodes");
    let client = cluster.client().expect("client");
    tl.mark(pdbs_text(&client).await);

    testkit::apply_ok(cluster, "writer", &writer_yaml(&image)).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    testkit::wait_bound(&claims, WRITER, DEADLINE).await;
    let pod = wait_writer(&client, None).await.unwrap_or_else(|| {
        panic!(
            "the writer never ran\n{}",
            testkit::kubectl_text(cluster, &["-n", NS, "describe", "pods"])
        )
    });
    tl.mark(format!("writer {} Running on {}", pod.name, pod.node));
}

/// Waits until `kubectl get csidd` shows the driver Running at v1 on both
/// nodes, registered, with both controller replicas Ready.
async fn wait_whole(cluster: &Cluster) -> Result<(), String> {
    testkit::wait_running(cluster, NS, NAME, "v1", NODES, DEADLINE)
        .await
        .map_err(|e| e.to_string())?;
    wait_for(DEADLINE, POLL, || async {
        let row = testkit::csidd_row(cluster, NS, NAME).await.ok()?;
        (row.get("CONTROLLER").map(String::as_str) == Some("2/2")).then_some(())
    })
    .await
    .map_err(|_| format!("two controller replicas not Ready within {DEADLINE:?}"))
}

/// The Namespace and the CSIDriverDeployment: csi-test-driver as in
/// e2e/conformance/central (one backend directory on the host, reached from
/// both nodes, one topology segment for both) with two controller replicas.
fn driver_yaml(image: &str, kubelet_dir: &Path, data: &Path) -> String {
    DriverCr::new(NS, NAME, DRIVER, "v1")
        .image(image)
        .driver_args([
            format!("--drivername={DRIVER}"),
            "--endpoint=$(CSI_ENDPOINT)".into(),
            "--nodeid=$(KUBE_NODE_NAME)".into(),
            "--enable-attach".into(),
            "--topology-key=topology.test.csi.csiops.dev/zone".into(),
            "--topology-value=e2e-host".into(),
            "--state-dir=/csi-data/state".into(),
            "--data-dir=/csi-data/volumes".into(),
        ])
        .with("controller.replicas", 2)
        .shared_host_dir("csi-data", &data.display().to_string(), "/csi-data")
        .with("node.kubeletDir", kubelet_dir.display().to_string())
        .with("csiDriver.attachRequired", true)
        .with("csiDriver.fsGroupPolicy", "File")
        .with(
            "storageClasses",
            json!([{"name": STORAGE_CLASS, "volumeBindingMode": "Immediate"}]),
        )
        .yaml()
}

fn claim_yaml(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {name}
  namespace: {NS}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: {STORAGE_CLASS}
  resources:
    requests:
      storage: 8Mi
"#
    )
}

/// The writer's claim and Deployment. Each pod writes `<its name>.txt`
/// (holding `written-by-<its name>`) and appends to `counter` every 100 ms;
/// it prefers node 0, so the drains move it there and back.
fn writer_yaml(image: &str) -> String {
    format!(
        r#"{claim}---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {WRITER}
  namespace: {NS}
spec:
  replicas: 1
  strategy: {{type: Recreate}}
  selector:
    matchLabels: {{app: {WRITER}}}
  template:
    metadata:
      labels: {{app: {WRITER}}}
    spec:
      terminationGracePeriodSeconds: 5
      affinity:
        nodeAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            preference:
              matchExpressions:
              - {{key: kubernetes.io/hostname, operator: In, values: [{NODE_NAME}]}}
      containers:
      - name: app
        image: {image}
        args: ["app", "--dir=/data", "--file=$(POD_NAME).txt", "--text=written-by-$(POD_NAME)"]
        env:
        - name: POD_NAME
          valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}
        volumeMounts:
        - {{name: data, mountPath: /data}}
      volumes:
      - name: data
        persistentVolumeClaim: {{claimName: {WRITER}}}
"#,
        claim = claim_yaml(WRITER)
    )
}

/// The writer's pod as last seen Running.
#[derive(Debug, Clone)]
struct WriterPod {
    name: String,
    node: String,
}

/// Waits until a writer pod other than `not` runs (not being deleted).
async fn wait_writer(client: &Client, not: Option<&str>) -> Option<WriterPod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let lp = ListParams::default().labels(&format!("app={WRITER}"));
    wait_for(DEADLINE, POLL, || async {
        let list = pods.list(&lp).await.ok()?;
        list.items.into_iter().find_map(|p| {
            let running = p.status.as_ref()?.phase.as_deref() == Some("Running");
            let name = p.name_any();
            let fresh = p.metadata.deletion_timestamp.is_none() && Some(name.as_str()) != not;
            let node = p.spec.as_ref()?.node_name.clone()?;
            (running && fresh).then_some(WriterPod { name, node })
        })
    })
    .await
    .ok()
}

/// `/data/<file>` as the writer pod `pod` reads it.
async fn read_in(cluster: &Cluster, pod: &str, file: &str) -> Result<String, String> {
    let path = format!("/data/{file}");
    cluster
        .kubectl_ok([
            "-n",
            NS,
            "exec",
            pod,
            "--",
            "/csi-test-driver",
            "cat",
            &path,
        ])
        .await
        .map_err(|e| e.to_string())
}

/// Creates claim `name`, retrying while the API server does not answer
/// (it is being replaced); when it was created.
async fn create_claim(client: Client, name: &str) -> Result<Instant, String> {
    let claim: PersistentVolumeClaim =
        serde_yaml::from_str(&claim_yaml(name)).map_err(|e| e.to_string())?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client, NS);
    let mut last = String::new();
    let end = Instant::now() + DEADLINE;
    while Instant::now() < end {
        match claims.create(&PostParams::default(), &claim).await {
            Ok(_) => return Ok(Instant::now()),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(POLL).await;
    }
    Err(format!(
        "claim {name} not created within {DEADLINE:?}: {last}"
    ))
}

/// Waits until claim `name` is Bound; how long it took from `created`.
async fn bound_after(client: &Client, name: &str, created: Instant) -> Result<Duration, String> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    wait_for(DEADLINE, POLL, || async {
        let c = claims.get_opt(name).await.ok()??;
        (c.status?.phase.as_deref() == Some("Bound")).then(|| created.elapsed())
    })
    .await
    .map_err(|_| format!("claim {name}, created during the upgrade, not Bound within {DEADLINE:?}"))
}

/// The control plane to `to`, while a claim is created: the server must
/// then report `to_version` and the claim be Bound.
async fn upgrade_control_plane(
    cluster: &mut Cluster,
    to: &Path,
    to_version: &str,
    tl: &Timeline,
    findings: &mut Vec<String>,
) {
    let client = cluster.client().expect("client");
    tl.mark(format!("control plane: upgrading to {to_version}"));
    // Created once the API server answers again, while the controller
    // manager (the PV binder) and the scheduler are still to be replaced.
    let claim = "during-control-plane";
    let (replaced, created) = tokio::join!(cluster.upgrade_control_plane(to), async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        create_claim(client.clone(), claim).await
    });
    let replaced = replaced.unwrap_or_else(|e| panic!("the control plane upgrades: {e}"));
    for r in &replaced {
        tl.mark(format!(
            "  {} replaced in {:.1}s",
            r.component,
            r.took.as_secs_f64()
        ));
    }
    match client.apiserver_version().await {
        Ok(v) if v.git_version == to_version => {
            tl.mark(format!("server reports {}", v.git_version))
        }
        Ok(v) => findings.push(format!(
            "the server reports {} after the upgrade, not {to_version}",
            v.git_version
        )),
        Err(e) => findings.push(format!("server version after the upgrade: {e}")),
    }
    match created {
        Ok(at) => match bound_after(&client, claim, at).await {
            Ok(took) => tl.mark(format!(
                "claim {claim} Bound {:.1}s after its creation",
                took.as_secs_f64()
            )),
            Err(e) => findings.push(e),
        },
        Err(e) => findings.push(e),
    }
}

/// Real node `i`: drained, its kubelet restarted from `to`, uncordoned; a
/// claim created while it is drained must be Bound, and if the writer ran
/// there, its re-created pod must read what the old one wrote.
async fn upgrade_node(
    cluster: &mut Cluster,
    i: usize,
    to: &Path,
    tl: &Timeline,
    findings: &mut Vec<String>,
) {
    let client = cluster.client().expect("client");
    let node = node_name(i);
    let before = wait_writer(&client, None).await.expect("the writer runs");
    let last_line = read_in(cluster, &before.name, "counter")
        .await
        .ok()
        .and_then(|c| c.lines().last().map(str::to_string));
    tl.mark(format!(
        "{node}: drain (writer {} on {})",
        before.name, before.node
    ));
    let drain = cluster
        .kubectl([
            "drain",
            &node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=300s",
        ])
        .await
        .expect("kubectl runs");
    if drain.status.success() {
        let stdout = String::from_utf8_lossy(&drain.stdout);
        let evicted: Vec<&str> = stdout
            .lines()
            .filter_map(|l| l.strip_prefix("pod/")?.strip_suffix(" evicted"))
            .collect();
        tl.mark(format!("{node}: drained, evicted {evicted:?}"));
    } else {
        findings.push(format!(
            "kubectl drain {node}: {}",
            String::from_utf8_lossy(&drain.stderr)
        ));
    }
    // The drained node is told in status (cordonedNodes) before it
    // comes back, and not counted as broken (the poller checks that).
    let csidds: Api<CSIDriverDeployment> = Api::namespaced(client.clone(), NS);
    let told = wait_for(Duration::from_secs(30), POLL, || async {
        let d = csidds.get(NAME).await.ok()?;
        d.status?.cordoned_nodes.contains(&node).then_some(())
    })
    .await;
    match told {
        Ok(()) => tl.mark(format!("{node}: status names it cordoned")),
        Err(_) => findings.push(format!(
            "status.cordonedNodes never named the drained node {node} within 30s"
        )),
    }
    let claim = format!("during-drain-{i}");
    let created = create_claim(client.clone(), &claim).await;
    let replaced = cluster
        .upgrade_kubelet(i, to)
        .await
        .unwrap_or_else(|e| panic!("the kubelet of {node} upgrades: {e}"));
    tl.mark(format!(
        "{node}: {} in {:.1}s",
        replaced.component,
        replaced.took.as_secs_f64()
    ));
    cluster
        .kubectl_ok(["uncordon", &node])
        .await
        .unwrap_or_else(|e| panic!("uncordon {node}: {e}"));
    tl.mark(format!("{node}: uncordoned"));
    match created {
        Ok(at) => match bound_after(&client, &claim, at).await {
            Ok(took) => tl.mark(format!(
                "claim {claim} Bound {:.1}s after its creation",
                took.as_secs_f64()
            )),
            Err(e) => findings.push(e),
        },
        Err(e) => findings.push(e),
    }
    if before.node == node {
        check_writer_moved(cluster, &before, last_line.as_deref(), tl, findings).await;
    }
    // As an admin would before the next node: the driver whole again.
    match wait_whole(cluster).await {
        Ok(()) => tl.mark(format!(
            "{node}: driver whole again (controller 2/2, nodes 2/2)"
        )),
        Err(e) => findings.push(format!("after {node}: {e}")),
    }
}

/// The writer's pod `before` was evicted: a new one must run and read its
/// predecessor's file and counter through its own mount.
async fn check_writer_moved(
    cluster: &Cluster,
    before: &WriterPod,
    last_line: Option<&str>,
    tl: &Timeline,
    findings: &mut Vec<String>,
) {
    let client = cluster.client().expect("client");
    let Some(now) = wait_writer(&client, Some(&before.name)).await else {
        findings.push(format!(
            "no writer pod re-created after {} was evicted\n{}",
            before.name,
            testkit::kubectl_text(cluster, &["-n", NS, "describe", "pods", "-l", "app=writer"])
        ));
        return;
    };
    tl.mark(format!(
        "writer re-created: {} Running on {}",
        now.name, now.node
    ));
    let file = format!("{}.txt", before.name);
    let want = format!("written-by-{}", before.name);
    match read_in(cluster, &now.name, &file).await {
        Ok(text) if text == want => {}
        Ok(text) => findings.push(format!(
            "{} reads {file} as {text:?}, not {want:?}",
            now.name
        )),
        Err(e) => findings.push(format!("{} cannot read {file}: {e}", now.name)),
    }
    let counter = read_in(cluster, &now.name, "counter")
        .await
        .unwrap_or_default();
    match last_line {
        Some(l) if counter.lines().any(|c| c == l) => tl.mark(format!(
            "{} reads {file} and {}'s counter line {l:?} ({} lines in all)",
            now.name,
            before.name,
            counter.lines().count()
        )),
        Some(l) => findings.push(format!(
            "{}'s counter has no line {l:?} of {}",
            now.name, before.name
        )),
        None => findings.push(format!(
            "{}'s counter was not read before the drain",
            before.name
        )),
    }
}

/// Every Node's kubelet reports `want`.
async fn check_kubelets(client: &Client, want: &str, findings: &mut Vec<String>) {
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes.list(&ListParams::default()).await {
        Ok(list) => {
            for n in &list.items {
                let has = kubelet_version(n).unwrap_or_default();
                if has != want {
                    findings.push(format!(
                        "{}'s kubelet reports {has}, not {want}",
                        n.name_any()
                    ));
                }
            }
        }
        Err(e) => findings.push(format!("listing the Nodes: {e}")),
    }
}

/// Deletes the writer, the claims (the driver deletes their volumes) and
/// the CSIDriverDeployment (the operator removes the driver).
async fn give_back(cluster: &Cluster, findings: &mut Vec<String>) {
    let steps: [&[&str]; 3] = [
        &[
            "-n",
            NS,
            "delete",
            "deployment",
            WRITER,
            "--wait=true",
            "--timeout=120s",
        ],
        &[
            "-n",
            NS,
            "delete",
            "pvc",
            "--all",
            "--wait=true",
            "--timeout=120s",
        ],
        &[
            "-n",
            NS,
            "delete",
            "csidriverdeployment",
            NAME,
            "--timeout=120s",
        ],
    ];
    for (k, args) in steps.iter().enumerate() {
        if let Err(e) = cluster.kubectl_ok(args.iter()).await {
            findings.push(format!("teardown: {e}"));
        }
        if k == 1 {
            if let Err(e) = testkit::wait_no_volumes(cluster, DEADLINE).await {
                findings.push(e.to_string());
            }
        }
    }
}

/// Selector of the driver's controller pods.
fn controller_pods() -> String {
    format!("app.kubernetes.io/managed-by=csiops-operator,app.kubernetes.io/component=controller,app.kubernetes.io/instance={NAME}")
}
/// Selector of the operator's own pods (install.yaml's Deployment).
const OPERATOR_PODS: &str = "app.kubernetes.io/name=csiops-operator";
const OPERATOR_NS: &str = "csiops-system";

/// Times without a Ready pod of one workload, as the poller saw them.
#[derive(Debug, Default)]
struct Gaps {
    /// Observations with no pod Ready.
    zero_ready_polls: usize,
    /// The longest time between two observations of a Ready pod with
    /// none seen in between (an open gap counts up to the poller's end).
    longest: Duration,
    /// When a Ready pod was last seen.
    ready_seen: Option<Instant>,
    in_gap: bool,
}

impl Gaps {
    /// Records one observation of the `ready` pods (of `total`); what
    /// changed, for the timeline.
    fn observe(&mut self, what: &str, ready: &[String], total: usize) -> Option<String> {
        let now = Instant::now();
        if ready.is_empty() {
            self.zero_ready_polls += 1;
            let opened = !self.in_gap;
            self.in_gap = true;
            return opened.then(|| format!("  ! no {what} pod Ready ({total} pods)"));
        }
        let gap = self.ready_seen.map(|g| now - g).unwrap_or_default();
        self.ready_seen = Some(now);
        if !std::mem::replace(&mut self.in_gap, false) {
            return None;
        }
        self.longest = self.longest.max(gap);
        Some(format!(
            "  {what} Ready again after {:.1}s: {ready:?}",
            gap.as_secs_f64()
        ))
    }

    fn close(&mut self) {
        if let Some(since) = self.ready_seen.filter(|_| self.in_gap) {
            self.longest = self.longest.max(since.elapsed());
        }
    }

    fn report(&self, what: &str) -> String {
        format!(
            "{what}: {} observations with no pod Ready, longest gap {:.1}s",
            self.zero_ready_polls,
            self.longest.as_secs_f64()
        )
    }
}

/// What the poller saw.
#[derive(Debug, Default)]
struct Watched {
    polls: usize,
    /// The driver's controller replicas.
    controller: Gaps,
    /// The operator's replicas (reported: the operator being away stops
    /// status updates, not the driver).
    operator: Gaps,
    /// Observations of the status that were not healthy, distinct ones.
    unhealthy: Vec<String>,
    /// The namespace's PodDisruptionBudgets when the poller started.
    pdb: String,
}

impl Watched {
    fn report(&self) -> String {
        format!(
            "poller: {} observations; {}; {}; {}; unhealthy status observations: {}",
            self.polls,
            self.controller.report("controller"),
            self.operator.report("operator"),
            self.pdb,
            self.unhealthy.len()
        )
    }
}

/// Polls the controller replicas, the operator's and the
/// CSIDriverDeployment's status every [`POLL`] until stopped, noting each
/// change in the timeline.
struct Monitor {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Watched>,
}

impl Monitor {
    fn start(client: Client, tl: Arc<Timeline>) -> Monitor {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut w = Watched {
                pdb: pdbs_text(&client).await,
                ..Watched::default()
            };
            let mut last_status = String::new();
            while !flag.load(Ordering::Relaxed) {
                poll_once(&client, &tl, &mut w, &mut last_status).await;
                tokio::time::sleep(POLL).await;
            }
            w.controller.close();
            w.operator.close();
            w
        });
        Monitor { stop, task }
    }

    async fn stop(self) -> Watched {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the poller ran")
    }
}

/// The PodDisruptionBudgets of [`NS`], for the report.
async fn pdbs_text(client: &Client) -> String {
    let api: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(client.clone(), NS);
    match api.list(&ListParams::default()).await {
        Ok(l) if l.items.is_empty() => format!("no PodDisruptionBudget in {NS}"),
        Ok(l) => format!(
            "PodDisruptionBudgets: {:?}",
            l.items.iter().map(|p| p.name_any()).collect::<Vec<_>>()
        ),
        Err(e) => format!("PodDisruptionBudgets: {e}"),
    }
}

/// The Ready pods (`name@node`) of `selector` in `ns` and how many pods
/// there are; `None` when the API server does not answer (it is being
/// replaced): no observation.
async fn ready_pods(client: &Client, ns: &str, selector: &str) -> Option<(Vec<String>, usize)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(selector);
    let list = tokio::time::timeout(Duration::from_secs(5), pods.list(&lp))
        .await
        .ok()?
        .ok()?;
    let ready = list
        .items
        .iter()
        .filter(|p| pod_ready(p))
        .map(|p| {
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            format!("{}@{}", p.name_any(), node.unwrap_or_default())
        })
        .collect();
    Some((ready, list.items.len()))
}

/// One observation of each; what does not answer counts as none.
async fn poll_once(client: &Client, tl: &Timeline, w: &mut Watched, last_status: &mut String) {
    if let Some((ready, total)) = ready_pods(client, NS, &controller_pods()).await {
        w.polls += 1;
        if let Some(change) = w.controller.observe("controller", &ready, total) {
            tl.mark(change);
        }
    }
    if let Some((ready, total)) = ready_pods(client, OPERATOR_NS, OPERATOR_PODS).await {
        if let Some(change) = w.operator.observe("operator", &ready, total) {
            tl.mark(change);
        }
    }
    let csidds: Api<CSIDriverDeployment> = Api::namespaced(client.clone(), NS);
    if let Ok(Ok(d)) = tokio::time::timeout(Duration::from_secs(5), csidds.get(NAME)).await {
        let (line, healthy) = status_line(&d);
        if line != *last_status {
            tl.mark(format!("  status: {line}"));
            if !healthy && !w.unhealthy.contains(&line) {
                w.unhealthy.push(line.clone());
            }
            *last_status = line;
        }
    }
}

fn pod_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The status in one line, and whether it is healthy: Running, Available
/// and not Degraded (a drained node may be named, not counted as broken).
fn status_line(d: &CSIDriverDeployment) -> (String, bool) {
    let Some(st) = d.status.as_ref() else {
        return ("no status".into(), false);
    };
    let cond = |t: &str| {
        st.condition(t)
            .map(|c| format!("{}/{}", c.status, c.reason))
            .unwrap_or_else(|| "-".into())
    };
    let lost: Vec<String> = st
        .lost_nodes
        .iter()
        .map(|l| format!("{}:{}", l.name, l.reason))
        .collect();
    let cordoned = &st.cordoned_nodes;
    let unhealthy: Vec<String> = st
        .unhealthy_pods
        .iter()
        .map(|p| format!("{}:{}", p.name, p.reason))
        .collect();
    let line = format!(
        "{} Available={} Degraded={} controller={} nodes={} registered={} lost={lost:?} cordoned={cordoned:?} unhealthy={unhealthy:?}",
        st.phase.as_str(),
        cond("Available"),
        cond("Degraded"),
        st.summary.controller,
        st.summary.nodes,
        st.summary.registered,
    );
    let healthy = st.phase.as_str() == "Running"
        && st
            .condition("Available")
            .is_some_and(|c| c.status == "True")
        && st.condition("Degraded").is_none_or(|c| c.status != "True");
    (line, healthy)
}
