//! Our sidecar image swapped into an upstream-style node DaemonSet, on the
//! real node: the manifest is written like csi-driver-host-path's (not by
//! the operator) — the default ServiceAccount with no RBAC, Go-style
//! arguments with no role (`-v=5`, `-csi-address=…`), `KUBE_NODE_NAME`
//! only, the registrar's `--health-port` and the liveness probe's.
//!
//! kubelet registers the driver (kubelet itself writes the CSINode entry),
//! the image's entrypoint hands both roles to its node binary, the
//! registrar and liveness probe keep running without restarts while
//! kubelet probes them, the registrar's /healthz answers 200, and its log
//! says once why its CSINode maintenance is off.
//!
//! Needs root and `make node-prereqs`; without them it fails saying what is
//! missing. Takes the machine-wide real-node lock.

use std::time::Duration;

use csiops_e2e::realnode::{host, images, NODE_NAME};
use csiops_e2e::{testkit, wait_for, walkthrough, Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::{Api, ListParams};

const NS: &str = "dropin";
const DRIVER: &str = "dropin.csi.csiops.dev";
const DEADLINE: Duration = Duration::from_secs(180);
const POLL: Duration = Duration::from_secs(1);
/// How long the pod must run with kubelet's probes passing, after it is
/// registered: several periods of every probe (10s by default).
const STEADY: Duration = Duration::from_secs(40);

/// The upstream-style manifest: csi-driver-host-path's node containers with
/// our sidecar image in place of node-driver-registrar and livenessprobe,
/// their arguments as upstream writes them.
fn daemonset(driver_image: &str, sidecar_image: &str, kubelet_dir: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {NS}
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: csi-dropin-node
  namespace: {NS}
spec:
  selector:
    matchLabels: {{app: csi-dropin-node}}
  template:
    metadata:
      labels: {{app: csi-dropin-node}}
    spec:
      containers:
      - name: csi-driver
        image: {driver_image}
        args:
        - "--drivername={DRIVER}"
        - "--endpoint=$(CSI_ENDPOINT)"
        - "--nodeid=$(KUBE_NODE_NAME)"
        - "--state-dir=/csi/state"
        env:
        - {{name: CSI_ENDPOINT, value: "unix:///csi/csi.sock"}}
        - name: KUBE_NODE_NAME
          valueFrom: {{fieldRef: {{apiVersion: v1, fieldPath: spec.nodeName}}}}
        securityContext: {{privileged: true}}
        ports:
        - {{containerPort: 9898, name: healthz, protocol: TCP}}
        livenessProbe:
          failureThreshold: 5
          httpGet: {{path: /healthz, port: healthz}}
          initialDelaySeconds: 10
          timeoutSeconds: 3
          periodSeconds: 2
        volumeMounts:
        - {{mountPath: /csi, name: socket-dir}}
      - name: node-driver-registrar
        image: {sidecar_image}
        args:
        - -v=5
        - -csi-address=/csi/csi.sock
        - --kubelet-registration-path={kubelet_dir}/plugins/{DRIVER}/csi.sock
        - --health-port=9809
        env:
        - name: KUBE_NODE_NAME
          valueFrom: {{fieldRef: {{apiVersion: v1, fieldPath: spec.nodeName}}}}
        ports:
        - {{containerPort: 9809, name: reg-healthz, protocol: TCP}}
        livenessProbe:
          httpGet: {{path: /healthz, port: reg-healthz}}
          initialDelaySeconds: 5
          timeoutSeconds: 5
          periodSeconds: 5
        volumeMounts:
        - {{mountPath: /csi, name: socket-dir}}
        - {{mountPath: /registration, name: registration-dir}}
      - name: liveness-probe
        image: {sidecar_image}
        args:
        - --csi-address=/csi/csi.sock
        - --health-port=9898
        volumeMounts:
        - {{mountPath: /csi, name: socket-dir}}
      volumes:
      - name: socket-dir
        hostPath: {{path: "{kubelet_dir}/plugins/{DRIVER}", type: DirectoryOrCreate}}
      - name: registration-dir
        hostPath: {{path: "{kubelet_dir}/plugins_registry", type: Directory}}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_style_registrar_without_rbac_registers_and_stays_up() {
    let cluster = Cluster::start(ClusterOptions {
        nodes: 0,
        real_node: true,
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("cluster with a real node starts: {e}"));
    let node = cluster.real_node().expect("a real node");
    let reference = |image| {
        node.images()
            .reference(image)
            .unwrap_or_else(|e| panic!("image {image:?}: {e}"))
            .to_string()
    };
    let (driver_image, sidecar_image) =
        (reference(images::TEST_DRIVER), reference(images::SIDECAR));
    let kubelet_dir = node.layout().kubelet_dir();
    let client = cluster.client().expect("client");

    testkit::apply_ok(
        &cluster,
        "dropin",
        &daemonset(
            &driver_image,
            &sidecar_image,
            &kubelet_dir.to_string_lossy(),
        ),
    )
    .await;
    kubelet_registers_the_driver_and_writes_its_csinode_entry(&cluster).await;
    let (pod_name, ip) = the_one_node_pod(&client).await;
    the_registrar_and_the_liveness_probe_answer_healthz(ip).await;
    let statuses =
        a_while_under_kubelets_probes_nothing_restarts(&cluster, &client, &pod_name).await;
    the_entrypoint_handed_both_roles_to_the_node_binary(&statuses);
    the_registrar_says_once_why_csinode_maintenance_is_off(&cluster, &pod_name).await;

    let left = cluster.stop_and_report().await.expect("cluster stops");
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// `kubectl -n NS <args>`, its stdout and stderr as one text (for the
/// diagnostics of a failing step).
fn kubectl(cluster: &Cluster, args: &[&str]) -> String {
    let mut all = vec!["-n", NS];
    all.extend_from_slice(args);
    testkit::kubectl_text(cluster, &all)
}

/// kubelet registers the driver and writes its CSINode entry itself.
async fn kubelet_registers_the_driver_and_writes_its_csinode_entry(cluster: &Cluster) {
    let entry = walkthrough::wait_registered(cluster, DRIVER, DEADLINE)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{e}\n{}\n{}\n{}",
                kubectl(cluster, &["get", "pods", "-o", "wide"]),
                kubectl(
                    cluster,
                    &["logs", "ds/csi-dropin-node", "-c", "node-driver-registrar"]
                ),
                cluster.log_tails(30)
            )
        });
    assert_eq!(entry.node_id, NODE_NAME, "the driver's NodeGetInfo node ID");
    let kubelet_log =
        std::fs::read_to_string(cluster.log_dir().join("kubelet.log")).expect("kubelet log");
    assert!(
        kubelet_log.contains(&format!("Register new plugin with name: {DRIVER}")),
        "kubelet's plugin watcher did not register {DRIVER}"
    );
}

/// The DaemonSet's one pod: its name and IP.
async fn the_one_node_pod(client: &kube::Client) -> (String, std::net::IpAddr) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod_list = pods
        .list(&ListParams::default().labels("app=csi-dropin-node"))
        .await
        .expect("list pods");
    assert_eq!(pod_list.items.len(), 1, "one node pod");
    let pod_name = pod_list.items[0].metadata.name.clone().expect("pod name");
    let ip: std::net::IpAddr = pod_list.items[0]
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse().ok())
        .expect("pod IP");
    (pod_name, ip)
}

/// The registrar's /healthz as upstream's: socket present, GetInfo answers;
/// the liveness probe, also started without a role, answers for the driver.
async fn the_registrar_and_the_liveness_probe_answer_healthz(ip: std::net::IpAddr) {
    let healthz = wait_for(Duration::from_secs(60), POLL, || async {
        testkit::http_get_async((ip, 9809).into(), "/healthz")
            .await
            .filter(|r| r.0 == 200)
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "registrar /healthz on {ip}:9809 never 200: {:?}",
            testkit::http_get(std::net::SocketAddr::from((ip, 9809)), "/healthz")
        )
    });
    assert_eq!(healthz.1, "ok");
    // The liveness probe, also started without a role, answers for the driver.
    let live = testkit::http_get_async((ip, 9898).into(), "/healthz").await;
    assert_eq!(live.map(|r| r.0), Some(200), "liveness probe /healthz");
}

/// A while under kubelet's probes: every container still running, never
/// restarted. Their statuses.
async fn a_while_under_kubelets_probes_nothing_restarts(
    cluster: &Cluster,
    client: &kube::Client,
    pod_name: &str,
) -> Vec<ContainerStatus> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    tokio::time::sleep(STEADY).await;
    let pod = pods.get(pod_name).await.expect("pod");
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .unwrap_or_default();
    assert_eq!(statuses.len(), 3, "{statuses:?}");
    for s in &statuses {
        assert_eq!(
            s.restart_count,
            0,
            "container {} restarted:\n{}",
            s.name,
            kubectl(cluster, &["logs", pod_name, "-c", &s.name, "--previous"])
        );
        assert!(
            s.state.as_ref().is_some_and(|st| st.running.is_some()),
            "container {} not running: {:?}",
            s.name,
            s.state
        );
    }
    statuses
}

/// The image's entrypoint (csiops-sidecar) handed both node roles to the
/// small node binary: that is what runs in those containers.
fn the_entrypoint_handed_both_roles_to_the_node_binary(statuses: &[ContainerStatus]) {
    for s in statuses {
        let id = s.container_id.as_deref().expect("container ID");
        let exe = host::container_exe(id)
            .unwrap_or_else(|| panic!("no process of container {} ({id})", s.name));
        let expected = match s.name.as_str() {
            "csi-driver" => "/csi-test-driver",
            _ => "/csiops-node-sidecar",
        };
        assert_eq!(exe, expected, "container {} runs {exe}", s.name);
    }
}

/// Its log says once, and why, that CSINode maintenance is off: the
/// default ServiceAccount may do nothing with Nodes and CSINodes.
async fn the_registrar_says_once_why_csinode_maintenance_is_off(cluster: &Cluster, pod_name: &str) {
    let log = cluster
        .kubectl_ok(["-n", NS, "logs", pod_name, "-c", "node-driver-registrar"])
        .await
        .expect("registrar log");
    let off: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("CSINode maintenance is off"))
        .collect();
    assert_eq!(off.len(), 1, "said once:\n{log}");
    println!("registrar: {}", off[0]);
    assert!(
        off[0].contains("may not") && off[0].contains("csinodes"),
        "names the missing permission: {}",
        off[0]
    );
    assert!(
        log.contains("--kubelet-registration-path makes this the registrar"),
        "the role came from the upstream arguments:\n{log}"
    );
    assert!(
        !log.contains("CSINode update failed") && !log.contains("driver registered in CSINode"),
        "the registrar tried to write CSINode:\n{log}"
    );
}
