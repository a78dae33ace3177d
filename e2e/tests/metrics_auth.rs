//! Authenticated metrics (`--metrics-auth`, `spec.monitoring`) against the
//! real API server: real ServiceAccount tokens (TokenRequest, through
//! `kubectl create token`), real TokenReviews and SubjectAccessReviews
//! decided by the API server's RBAC.
//!
//! - The operator and a sidecar as processes of the test: a ServiceAccount
//!   bound to `get` on `/metrics` scrapes (200 and the metrics), one without
//!   the binding gets 403, no token or a made-up one 401; the probes need
//!   no token. A CSIDriverDeployment with `spec.monitoring` gets its metrics
//!   Service; a PodMonitor only once the PodMonitor CRD is installed (its
//!   absence fails nothing); both go when monitoring is turned off.
//! - On the real node: the driver's pods, as the operator renders them from
//!   `manifests/install.yaml`, become Ready with HTTPS probes and answer the
//!   same three callers the same way on every bundled sidecar's port.
//!
//! The scrapes use curl (`-k`: the certificates are self-signed).

use std::net::SocketAddr;
use std::time::Duration;

use csiops_e2e::process::ManagedProcess;
use csiops_e2e::realnode::images;
use csiops_e2e::{
    free_port, operator_bin, sidecar_bin, testkit, wait_for, walkthrough, Cluster, ClusterOptions,
    OperatorProcess,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

const DEADLINE: Duration = Duration::from_secs(180);
const POLL: Duration = Duration::from_millis(500);
/// Namespace of the scrapers' ServiceAccounts.
const SCRAPERS_NS: &str = "monitoring";
/// Allowed by RBAC to `get` the nonResourceURL `/metrics`.
const ALLOWED: &str = "prometheus";
/// A valid identity without that permission.
const STRANGER: &str = "stranger";

/// The scrapers and the RBAC a storage admin writes for the allowed one
/// (docs/metrics.md's example).
fn scrapers_yaml() -> String {
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {SCRAPERS_NS}
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {ALLOWED}
  namespace: {SCRAPERS_NS}
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {STRANGER}
  namespace: {SCRAPERS_NS}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: csiops-metrics-reader
rules:
- nonResourceURLs: ["/metrics"]
  verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: csiops-metrics-reader
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: csiops-metrics-reader
subjects:
- kind: ServiceAccount
  name: {ALLOWED}
  namespace: {SCRAPERS_NS}
"#
    )
}

/// Real tokens of the two scrapers (TokenRequest API).
struct Tokens {
    allowed: String,
    stranger: String,
}

async fn scrapers(cluster: &Cluster) -> Tokens {
    testkit::apply_ok(cluster, "scrapers", &scrapers_yaml()).await;
    let token = |sa: &'static str| async move {
        cluster
            .kubectl_ok(["-n", SCRAPERS_NS, "create", "token", sa])
            .await
            .unwrap_or_else(|e| panic!("kubectl create token {sa}: {e}"))
            .trim()
            .to_string()
    };
    Tokens {
        allowed: token(ALLOWED).await,
        stranger: token(STRANGER).await,
    }
}

/// `GET url` over HTTPS (certificate not verified) with `token` as bearer:
/// the status and the body; `None` when nothing answered.
async fn scrape(url: &str, token: Option<&str>) -> Option<(u16, String)> {
    let mut args = vec![
        "-sk".to_string(),
        "--max-time".into(),
        "5".into(),
        "-w".into(),
        "\n%{http_code}".into(),
    ];
    if let Some(t) = token {
        args.push("-H".into());
        args.push(format!("Authorization: Bearer {t}"));
    }
    args.push(url.to_string());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl").args(&args).output()
    })
    .await
    .ok()?
    .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n')?;
    let code: u16 = code.trim().parse().ok()?;
    (code != 0).then(|| (code, body.to_string()))
}

/// Waits until `url` answers at all (any status).
async fn answering(url: &str) {
    wait_for(DEADLINE, POLL, || async { scrape(url, None).await })
        .await
        .unwrap_or_else(|_| panic!("{url} never answered"));
}

/// The three callers of the issue, and a made-up token, on `url`.
async fn check_callers(url: &str, tokens: &Tokens) {
    let (code, body) = scrape(url, Some(&tokens.allowed))
        .await
        .unwrap_or_else(|| panic!("{url}: no answer"));
    assert_eq!(code, 200, "{url} with an allowed token: {body}");
    assert!(body.ends_with("# EOF\n"), "{url}: not OpenMetrics: {body}");
    let forbidden = scrape(url, Some(&tokens.stranger)).await.map(|r| r.0);
    assert_eq!(
        forbidden,
        Some(403),
        "{url} with a token without the permission"
    );
    assert_eq!(
        scrape(url, None).await.map(|r| r.0),
        Some(401),
        "{url} without a token"
    );
    let made_up = scrape(url, Some("not-a-token")).await.map(|r| r.0);
    assert_eq!(made_up, Some(401), "{url} with a made-up token");
}

/// The smallest PodMonitor CRD the API server accepts: the kind, and any
/// content (the real one's schema is not what is tested here).
const POD_MONITOR_CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: podmonitors.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  names:
    kind: PodMonitor
    listKind: PodMonitorList
    plural: podmonitors
    singular: podmonitor
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
"#;

const NS: &str = "csi-metrics";
const NAME: &str = "testdriver";
const DRIVER: &str = "metrics.csiops.dev";

/// csi-test-driver's CSIDriverDeployment with `monitoring` (YAML lines
/// under `spec.monitoring:`, indented by four).
fn driver_yaml(image: &str, kubelet_dir: &std::path::Path, monitoring: &str) -> String {
    let base = testkit::TestDriverDeployment {
        namespace: NS,
        name: NAME,
        driver: DRIVER,
        image,
        version: "v0.1.0",
        kubelet_dir,
        on_simulated_nodes: false,
    }
    .yaml();
    format!("{base}  monitoring:\n{monitoring}")
}

async fn exists(cluster: &Cluster, args: &[&str]) -> bool {
    cluster
        .kubectl(args)
        .await
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// `spec.monitoring` of the driver object: authenticated metrics and a
/// PodMonitor (YAML lines, indented by four).
const MONITORING: &str =
    "    metricsAuth: true\n    podMonitor:\n      enabled: true\n      interval: 30s\n";
/// `kubectl get` of the driver's metrics Service.
const SERVICE: [&str; 5] = ["-n", NS, "get", "service", "testdriver-metrics"];
/// `kubectl get` of the driver's PodMonitor.
const POD_MONITOR: [&str; 5] = [
    "-n",
    NS,
    "get",
    "podmonitors.monitoring.coreos.com",
    "testdriver-metrics",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_and_a_sidecar_let_in_only_callers_rbac_allows() {
    let cluster = Cluster::start(ClusterOptions::kwok(0))
        .await
        .unwrap_or_else(|e| panic!("cluster starts: {e}"));
    // The CRD and install.yaml's shipped roles: the operator only binds
    // csiops:metrics-auth, so without the role its bindings grant nothing.
    testkit::install_operator_rbac(&cluster)
        .await
        .expect("CRD and shipped roles install");
    let tokens = scrapers(&cluster).await;

    // --- the operator, --metrics-auth ------------------------------------------
    let operator = cluster
        .run_operator_with(
            &operator_bin().expect("operator binary"),
            &["--metrics-auth".to_string()],
        )
        .expect("operator starts");
    the_operator_lets_in_only_callers_rbac_allows(&operator, &tokens).await;
    let mut sidecar = a_sidecar_lets_in_only_callers_rbac_allows(&cluster, &tokens).await;
    monitoring_gets_a_service_and_no_pod_monitor_without_its_crd(&cluster, &operator).await;
    the_pod_monitor_comes_once_its_crd_appears(&cluster, &operator).await;
    monitoring_turned_off_removes_both(&cluster, &operator).await;
    a_certificate_secret_without_metrics_auth_is_refused(&cluster).await;
    teardown_leaves_neither(&cluster, &operator).await;

    sidecar.terminate(Duration::from_secs(5));
    operator.stop().await;
    cluster.stop().await.expect("cluster stops");
}

/// The operator with `--metrics-auth`: only the allowed caller scrapes; the
/// probes stay open on the HTTPS port; plain HTTP gets no metrics.
async fn the_operator_lets_in_only_callers_rbac_allows(
    operator: &OperatorProcess,
    tokens: &Tokens,
) {
    let base = format!("https://{}", operator.http_endpoint());
    answering(&format!("{base}/healthz")).await;
    check_callers(&format!("{base}/metrics"), tokens).await;
    // The probes stay open on the HTTPS port; plain HTTP gets no answer.
    assert_eq!(
        scrape(&format!("{base}/healthz"), None).await.map(|r| r.0),
        Some(200)
    );
    let plain = testkit::http_get_async(operator.http_endpoint(), "/metrics").await;
    assert!(
        plain
            .as_ref()
            .is_none_or(|(_, body)| !body.contains("# EOF")),
        "metrics over plain HTTP: {plain:?}"
    );
}

/// A sidecar (the liveness probe) with `--metrics-auth` lets in the same
/// callers, and no token reaches its log. The running sidecar.
async fn a_sidecar_lets_in_only_callers_rbac_allows(
    cluster: &Cluster,
    tokens: &Tokens,
) -> ManagedProcess {
    // The liveness probe has no --kubeconfig (as upstream): KUBECONFIG.
    let port = free_port().expect("port");
    let kubeconfig = cluster.kubeconfig_path().display().to_string();
    let mut sidecar = ManagedProcess::spawn_with_env(
        "liveness-probe",
        &sidecar_bin().expect("sidecar binary"),
        &[
            "liveness-probe".to_string(),
            "--csi-address=/nonexistent/csi.sock".to_string(),
            format!("--http-endpoint=127.0.0.1:{port}"),
            "--metrics-auth".to_string(),
            "--v=5".to_string(),
        ],
        &[("KUBECONFIG", kubeconfig.as_str()), ("NO_COLOR", "1")],
        &cluster.log_dir().join("liveness-probe.log"),
    )
    .expect("sidecar starts");
    let url = format!("https://127.0.0.1:{port}/metrics");
    answering(&url).await;
    check_callers(&url, tokens).await;
    // No token ever reaches a log line.
    let log = sidecar.log_tail(10_000);
    assert!(!log.contains(&tokens.allowed) && !log.contains(&tokens.stranger));
    sidecar.check_running().expect("sidecar still running");
    sidecar
}

/// `spec.monitoring` gets the metrics Service, and its pods' accounts may
/// review callers; without the PodMonitor CRD no PodMonitor and no
/// complaint.
async fn monitoring_gets_a_service_and_no_pod_monitor_without_its_crd(
    cluster: &Cluster,
    operator: &OperatorProcess,
) {
    testkit::apply_ok(
        cluster,
        "driver",
        &driver_yaml(
            "example.invalid/csi-test-driver:v0",
            std::path::Path::new("/var/lib/kubelet"),
            MONITORING,
        ),
    )
    .await;
    wait_for(DEADLINE, POLL, || async {
        exists(cluster, &SERVICE).await.then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("no metrics Service\n{}", operator.log_tail(60)));
    // The pods' ServiceAccounts may review callers (the shipped role,
    // bound to them).
    for sa in ["testdriver-controller", "testdriver-node"] {
        let user = format!("system:serviceaccount:{NS}:{sa}");
        for what in [
            "tokenreviews.authentication.k8s.io",
            "subjectaccessreviews.authorization.k8s.io",
        ] {
            assert!(
                testkit::can_i(cluster, &user, &["create", what]).await,
                "{user} may not create {what}"
            );
        }
    }
    // No PodMonitor kind, no PodMonitor, and no error for it.
    assert!(!exists(cluster, &["get", "podmonitors", "-A"]).await);
    let log = operator.log_tail(10_000);
    let complaints: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("PodMonitor") && (l.contains("ERROR") || l.contains("WARN")))
        .collect();
    assert!(complaints.is_empty(), "{complaints:#?}");
    let message = testkit::jsonpath(
        cluster,
        &["-n", NS, "get", "csidd", NAME],
        "{.status.message}",
    )
    .await
    .unwrap_or_default();
    assert!(!message.contains("PodMonitor"), "{message}");
}

/// The CRD appears: the next reconciliation (here: at once, on a touch)
/// creates the PodMonitor.
async fn the_pod_monitor_comes_once_its_crd_appears(cluster: &Cluster, operator: &OperatorProcess) {
    testkit::apply_ok(cluster, "podmonitor-crd", POD_MONITOR_CRD).await;
    let mut touches = 0u32;
    wait_for(DEADLINE, Duration::from_secs(2), || {
        touches += 1;
        let touch = format!("e2e.csiops.dev/touch={touches}");
        async move {
            // Touch until discovery serves the new kind and a pass picks it up.
            let _ = cluster
                .kubectl(["-n", NS, "annotate", "--overwrite", "csidd", NAME, &touch])
                .await;
            exists(cluster, &POD_MONITOR).await.then_some(())
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "no PodMonitor after its CRD appeared\n{}",
            operator.log_tail(60)
        )
    });
    let endpoints = testkit::jsonpath(
        cluster,
        &POD_MONITOR,
        "{.spec.podMetricsEndpoints[*].port} {.spec.podMetricsEndpoints[0].scheme}",
    )
    .await
    .expect("PodMonitor");
    assert_eq!(endpoints, "provisioner registrar-http healthz https");
}

/// Monitoring turned off: both go.
async fn monitoring_turned_off_removes_both(cluster: &Cluster, operator: &OperatorProcess) {
    cluster
        .kubectl_ok([
            "-n",
            NS,
            "patch",
            "csidd",
            NAME,
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/spec/monitoring"}]"#,
        ])
        .await
        .expect("monitoring removed");
    wait_for(DEADLINE, POLL, || async {
        (!exists(cluster, &SERVICE).await && !exists(cluster, &POD_MONITOR).await).then_some(())
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "metrics Service or PodMonitor left\n{}",
            operator.log_tail(60)
        )
    });
}

/// A certificate Secret without metricsAuth means nothing: refused at
/// admission, naming the fix.
async fn a_certificate_secret_without_metrics_auth_is_refused(cluster: &Cluster) {
    let refused = testkit::apply_yaml(
        cluster,
        "refused",
        &driver_yaml(
            "example.invalid/csi-test-driver:v0",
            std::path::Path::new("/var/lib/kubelet"),
            "    tlsSecretName: metrics-tls\n",
        ),
    )
    .await
    .expect("kubectl runs");
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("set metricsAuth: true"), "{stderr}");
}

/// Turned on again, then the object deleted: teardown leaves neither.
async fn teardown_leaves_neither(cluster: &Cluster, operator: &OperatorProcess) {
    testkit::apply_ok(
        cluster,
        "driver-again",
        &driver_yaml(
            "example.invalid/csi-test-driver:v0",
            std::path::Path::new("/var/lib/kubelet"),
            MONITORING,
        ),
    )
    .await;
    wait_for(DEADLINE, POLL, || async {
        (exists(cluster, &SERVICE).await && exists(cluster, &POD_MONITOR).await).then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("monitoring not back\n{}", operator.log_tail(60)));
    cluster
        .kubectl_ok([
            "-n",
            NS,
            "delete",
            "csidd",
            NAME,
            "--wait=true",
            "--timeout=120s",
        ])
        .await
        .unwrap_or_else(|e| panic!("teardown: {e}\n{}", operator.log_tail(60)));
    assert!(
        !exists(cluster, &SERVICE).await,
        "metrics Service left by teardown"
    );
    assert!(
        !exists(cluster, &POD_MONITOR).await,
        "PodMonitor left by teardown"
    );
}

/// The one pod matching `selector` in [`NS`], with its IP.
async fn pod_ip(client: &kube::Client, selector: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let list = pods
        .list(&ListParams::default().labels(selector))
        .await
        .expect("list pods");
    assert_eq!(list.items.len(), 1, "pods matching {selector}");
    list.items[0]
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("pod IP")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_pods_on_the_real_node_let_in_only_callers_rbac_allows() {
    let cluster = Cluster::start(ClusterOptions {
        nodes: 0,
        real_node: true,
        ..ClusterOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("cluster with a real node starts: {e}"));
    let node = cluster.real_node().expect("a real node");
    let image = node
        .images()
        .reference(images::TEST_DRIVER)
        .expect("driver image")
        .to_string();
    let kubelet_dir = node.layout().kubelet_dir();
    walkthrough::install_operator(&cluster)
        .await
        .unwrap_or_else(|e| panic!("operator installs: {e}\n{}", cluster.log_tails(30)));
    // Self-signed certificates; every sidecar checks its callers. The pods
    // become Ready only if kubelet's HTTPS probes pass.
    testkit::apply_ok(
        &cluster,
        "driver",
        &driver_yaml(&image, &kubelet_dir, "    metricsAuth: true\n"),
    )
    .await;
    testkit::wait_running(&cluster, NS, NAME, "v0.1.0", 1, DEADLINE)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{e}\n{}\n{}",
                testkit::operator_log(&cluster),
                cluster.log_tails(30)
            )
        });
    let tokens = scrapers(&cluster).await;

    let client = cluster.client().expect("client");
    let controller = pod_ip(
        &client,
        &format!("app.kubernetes.io/instance={NAME},app.kubernetes.io/component=controller"),
    )
    .await;
    let node_pod = pod_ip(&client, &testkit::node_pod_selector(NAME)).await;
    // provisioner and liveness-probe in the controller pod; registrar and
    // liveness-probe in the node pod.
    for addr in [
        SocketAddr::new(controller.parse().expect("IP"), 9809),
        SocketAddr::new(controller.parse().expect("IP"), 9808),
        SocketAddr::new(node_pod.parse().expect("IP"), 9809),
        SocketAddr::new(node_pod.parse().expect("IP"), 9808),
    ] {
        let url = format!("https://{addr}/metrics");
        answering(&url).await;
        check_callers(&url, &tokens).await;
    }
    // The headless Service lists both pods' metrics ports.
    let endpoints = testkit::jsonpath(
        &cluster,
        &[
            "-n",
            NS,
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=testdriver-metrics",
        ],
        "{.items[*].endpoints[*].addresses[0]}",
    )
    .await
    .expect("EndpointSlices");
    assert!(
        endpoints.contains(&controller) && endpoints.contains(&node_pod),
        "{endpoints}"
    );
    // kubelet's HTTPS liveness probes passed all along: nothing restarted.
    let restarts = testkit::jsonpath(
        &cluster,
        &["-n", NS, "get", "pods"],
        "{.items[*].status.containerStatuses[*].restartCount}",
    )
    .await
    .expect("pods");
    assert!(
        restarts.split_whitespace().all(|n| n == "0"),
        "restarts: {restarts}"
    );

    cluster
        .kubectl_ok([
            "-n",
            NS,
            "delete",
            "csidd",
            NAME,
            "--wait=true",
            "--timeout=180s",
        ])
        .await
        .expect("driver deleted");
    let left = cluster.stop_and_report().await.expect("cluster stops");
    assert!(left.is_empty(), "left behind: {left:#?}");
}
