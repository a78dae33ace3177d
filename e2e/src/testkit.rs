//! What the operator's e2e tests and `make demo` share: installing the CRD,
//! applying manifests, reading `kubectl get csidd` as a user would.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::node_side::{NodeSideConfig, NodeSideSim};
use crate::{wait_for, Cluster, Error, Result};

pub mod cr;

pub use cr::DriverCr;

/// The workspace root (the checkout).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The checked-in CRD.
pub fn crd_path() -> PathBuf {
    workspace_root().join("crds/csidriverdeployments.csiops.dev.yaml")
}

/// The hostpath example (topology NodeLocal: hostpathplugin on every node).
pub fn example_path() -> PathBuf {
    workspace_root().join("manifests/examples/hostpath.yaml")
}

/// A Central-topology CSIDriverDeployment with hostpathplugin's arguments
/// (the hostpath example as it was before topology NodeLocal): for the tests
/// on kwok nodes, whose node side [`node_side`] plays with csi-mock-driver.
pub fn central_fixture_path() -> PathBuf {
    workspace_root().join("e2e/fixtures/hostpath-central.yaml")
}

/// Installs the CRD and waits until the API serves it.
///
/// Polled rather than `kubectl wait`: kubectl 1.32 fails at once when the
/// CRD has no conditions yet instead of waiting for them.
pub async fn install_crd(cluster: &Cluster) -> Result<()> {
    let crd = crd_path();
    cluster
        .kubectl_ok(["apply", "--server-side", "-f", &crd.to_string_lossy()])
        .await?;
    let args = ["get", "crd", "csidriverdeployments.csiops.dev"];
    wait_for(
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let established = jsonpath(
                cluster,
                &args,
                "{.status.conditions[?(@.type==\"Established\")].status}",
            )
            .await
            .ok()?;
            (established == "True").then_some(())
        },
    )
    .await
    .map_err(|_| {
        Error::Other("CRD csidriverdeployments.csiops.dev not Established within 60s".into())
    })
}

/// The operator's namespace and ServiceAccount in `manifests/install.yaml`.
pub const OPERATOR_NAMESPACE: &str = "csiops-system";
pub const OPERATOR_ACCOUNT: &str = "csiops-operator";

/// Applies what `manifests/install.yaml` installs but the operator's
/// Deployment: its Namespace, the CRD (waited for), its ServiceAccount and
/// RBAC, and the sidecars' shipped roles. With
/// [`Cluster::run_operator_as`] a local operator then runs with exactly
/// the permissions a real installation gives it.
pub async fn install_operator_rbac(cluster: &Cluster) -> Result<()> {
    let text = std::fs::read_to_string(workspace_root().join("manifests/install.yaml"))
        .map_err(|e| Error::Other(format!("reading manifests/install.yaml: {e}")))?;
    let mut kept = Vec::new();
    for doc in text.split("\n---\n") {
        let kind = doc
            .lines()
            .find_map(|l| l.strip_prefix("kind: "))
            .unwrap_or_default()
            .trim();
        if kind != "Deployment" && kind != "CustomResourceDefinition" && !kind.is_empty() {
            kept.push(doc.trim_start_matches("---\n"));
        }
    }
    install_crd(cluster).await?;
    let out = apply_yaml(cluster, "install-rbac", &kept.join("\n---\n")).await?;
    if !out.status.success() {
        return Err(Error::Other(format!(
            "applying install.yaml's RBAC: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

/// Whether the API server's authorizer lets `user` do what `args` say, in
/// `kubectl auth can-i` words: `verb resource[.group][/name]`, then `-n NS`,
/// `-A` (any namespace, the default) and `--subresource=S`. Asked with a
/// SubjectAccessReview (kubectl resolves resources through discovery and
/// answers "no" for a subresource of a CRD it does not know); a
/// ServiceAccount user gets the groups the API server would give it.
pub async fn can_i(cluster: &Cluster, user: &str, args: &[&str]) -> bool {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    let (verb, target) = match args {
        [verb, target, ..] => (*verb, *target),
        _ => panic!("can_i needs a verb and a resource: {args:?}"),
    };
    let (resource_group, name) = match target.split_once('/') {
        Some((rg, name)) => (rg, Some(name.to_string())),
        None => (target, None),
    };
    let (resource, group) = resource_group
        .split_once('.')
        .unwrap_or((resource_group, ""));
    let mut namespace = None;
    let mut subresource = None;
    let mut rest = args[2..].iter();
    while let Some(flag) = rest.next() {
        match *flag {
            "-n" => namespace = rest.next().map(|n| n.to_string()),
            "-A" => namespace = None,
            f if f.starts_with("--subresource=") => {
                subresource = f.strip_prefix("--subresource=").map(str::to_string)
            }
            other => panic!("can_i: unknown flag {other}"),
        }
    }
    let groups = user
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split(':').next())
        .map(|ns| {
            vec![
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".to_string(),
            ]
        });
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_string()),
            groups,
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.to_string()),
                group: Some(group.to_string()),
                resource: Some(resource.to_string()),
                subresource,
                name,
                namespace,
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let client = cluster.client().expect("client");
    let api: kube::Api<SubjectAccessReview> = kube::Api::all(client);
    match api.create(&Default::default(), &review).await {
        Ok(answer) => answer.status.is_some_and(|s| s.allowed),
        Err(e) => panic!("SubjectAccessReview of {user} {args:?}: {e}"),
    }
}

/// `kubectl apply -f -` of a YAML text (through a file in the cluster's dir).
pub async fn apply_yaml(cluster: &Cluster, name: &str, yaml: &str) -> Result<std::process::Output> {
    let path = applied_path(cluster, name);
    std::fs::write(&path, yaml)
        .map_err(|e| Error::Other(format!("writing {}: {e}", path.display())))?;
    cluster
        .kubectl(["apply", "-f", &path.to_string_lossy()])
        .await
}

/// Where [`apply_yaml`] keeps the manifest it applied as `name` (to delete
/// its objects later with `kubectl delete -f`).
pub fn applied_path(cluster: &Cluster, name: &str) -> std::path::PathBuf {
    cluster.work_dir().join(format!("{name}.yaml"))
}

/// [`apply_yaml`] that must succeed (a test's step; panics with kubectl's stderr).
pub async fn apply_ok(cluster: &Cluster, name: &str, yaml: &str) {
    let out = apply_yaml(cluster, name, yaml).await.expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl apply {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits until claim `name` is Bound and returns it (a test's step: panics
/// after `deadline`).
pub async fn wait_bound(
    claims: &kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim>,
    name: &str,
    deadline: Duration,
) -> k8s_openapi::api::core::v1::PersistentVolumeClaim {
    wait_for(deadline, Duration::from_millis(100), || async {
        let c = claims.get_opt(name).await.ok().flatten()?;
        (c.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(c)
    })
    .await
    .unwrap_or_else(|_| panic!("claim {name} not Bound within {deadline:?}"))
}

/// Waits until no PersistentVolume is left (every claim's volume deleted
/// by its provisioner), as a test does before tearing a driver down;
/// `Err` with what `kubectl get pv` shows at the deadline.
pub async fn wait_no_volumes(cluster: &Cluster, deadline: Duration) -> Result<()> {
    let pvs: kube::Api<k8s_openapi::api::core::v1::PersistentVolume> =
        kube::Api::all(cluster.client()?);
    wait_for(deadline, Duration::from_millis(500), || async {
        let list = pvs.list(&Default::default()).await.ok()?;
        list.items.is_empty().then_some(())
    })
    .await
    .map_err(|_| {
        Error::Other(format!(
            "PersistentVolumes left after {deadline:?}:\n{}",
            kubectl_text(cluster, &["get", "pv"])
        ))
    })
}

/// [`wait_bound`], with the claim's PersistentVolume.
pub async fn wait_bound_volume(
    claims: &kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim>,
    volumes: &kube::Api<k8s_openapi::api::core::v1::PersistentVolume>,
    name: &str,
    deadline: Duration,
) -> (
    k8s_openapi::api::core::v1::PersistentVolumeClaim,
    k8s_openapi::api::core::v1::PersistentVolume,
) {
    let c = wait_bound(claims, name, deadline).await;
    let pv_name = c
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .expect("bound claim names its PV");
    let pv = volumes.get(&pv_name).await.expect("PV of a bound claim");
    (c, pv)
}

/// Applies `yaml` and asserts the API server refuses it with a message
/// containing `expect` (CRD validation or the admission policy): a test's
/// step, `what` names the case in the panic.
pub async fn assert_refused(cluster: &Cluster, what: &str, yaml: &str, expect: &str) {
    let out = apply_yaml(cluster, "refused", yaml)
        .await
        .expect("kubectl runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{what} must be refused");
    assert!(
        stderr.contains(expect),
        "the refusal of {what} should name {expect:?}: {stderr}"
    );
}

/// `kubectl <args>` against the cluster, its stdout and stderr as one text,
/// blocking: for the diagnostics of a failing step (inside a panic closure).
pub fn kubectl_text(cluster: &Cluster, args: &[&str]) -> String {
    std::process::Command::new("kubectl")
        .arg(format!(
            "--kubeconfig={}",
            cluster.kubeconfig_path().display()
        ))
        .args(args)
        .output()
        .map(|o| {
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .unwrap_or_else(|e| format!("kubectl {args:?}: {e}"))
}

/// The last 40 lines of the in-cluster operator's log (install.yaml's Deployment).
pub fn operator_log(cluster: &Cluster) -> String {
    kubectl_text(
        cluster,
        &[
            "-n",
            "csiops-system",
            "logs",
            "deployment/csiops-operator",
            "--tail=40",
        ],
    )
}

/// The containerd ID of container `name` of `pod`.
pub fn container_id(pod: &k8s_openapi::api::core::v1::Pod, name: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == name)?
        .container_id
        .as_deref()?
        .strip_prefix("containerd://")
        .map(String::from)
}

/// Label selector of a CSIDriverDeployment's node pods.
pub fn node_pod_selector(instance: &str) -> String {
    format!(
        "app.kubernetes.io/managed-by=csiops-operator,app.kubernetes.io/component=node,app.kubernetes.io/instance={instance}"
    )
}

/// Starts the node side (a real driver process and the csiops registrar per
/// node, registered by a plugin-watcher client) for a CSIDriverDeployment.
pub fn node_side(
    cluster: &Cluster,
    namespace: &str,
    instance: &str,
    driver: &str,
) -> Result<NodeSideSim> {
    let cfg = NodeSideConfig {
        kubeconfig: cluster.kubeconfig_path().to_path_buf(),
        bin_dir: cluster.bin_dir().to_path_buf(),
        sidecar: crate::sidecar_bin()?,
        // Short: socket paths must fit in 108 bytes.
        dir: cluster.work_dir().join(format!("ns-{instance}")),
        namespace: namespace.to_string(),
        pod_selector: node_pod_selector(instance),
        driver: driver.to_string(),
    };
    Ok(NodeSideSim::spawn(cluster.client()?, cfg))
}

/// Parses kubectl's table output into one map per row, keyed by header.
pub fn parse_table(text: &str) -> Vec<BTreeMap<String, String>> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    // Column starts from the header: values may be empty (e.g. VERSION before
    // the first rollout), so split by header offsets, not by whitespace.
    let mut starts = Vec::new();
    let mut prev_space = true;
    for (i, c) in header.char_indices() {
        if !c.is_whitespace() && prev_space {
            starts.push(i);
        }
        prev_space = c.is_whitespace();
    }
    let names: Vec<String> = header.split_whitespace().map(str::to_string).collect();
    lines
        .map(|line| {
            let mut row = BTreeMap::new();
            for (k, name) in names.iter().enumerate() {
                let start = starts[k].min(line.len());
                let end = starts
                    .get(k + 1)
                    .copied()
                    .unwrap_or(line.len())
                    .min(line.len());
                let value = line.get(start..end).unwrap_or("").trim().to_string();
                row.insert(name.clone(), value);
            }
            row
        })
        .collect()
}

/// One object's row of `kubectl get csidd`.
pub async fn csidd_row(
    cluster: &Cluster,
    ns: &str,
    name: &str,
) -> Result<BTreeMap<String, String>> {
    let out = cluster
        .kubectl_ok(["-n", ns, "get", "csidriverdeployments", name])
        .await?;
    parse_table(&out)
        .into_iter()
        .next()
        .ok_or_else(|| Error::Other(format!("no row in `kubectl get csidd`: {out}")))
}

/// Waits until `kubectl get csidd` shows the object Running at `version` with
/// every count complete; returns the row. The error shows the last row seen.
pub async fn wait_running(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    version: &str,
    nodes: usize,
    deadline: Duration,
) -> Result<BTreeMap<String, String>> {
    let want_nodes = format!("{nodes}/{nodes}");
    let last = std::sync::Mutex::new(BTreeMap::new());
    let res = wait_for(deadline, Duration::from_millis(500), || async {
        let row = csidd_row(cluster, ns, name).await.ok()?;
        if let Ok(mut l) = last.lock() {
            *l = row.clone();
        }
        let ok = row.get("PHASE").map(String::as_str) == Some("Running")
            && row.get("VERSION").map(String::as_str) == Some(version)
            && row.get("NODES") == Some(&want_nodes)
            && row.get("REGISTERED") == Some(&want_nodes);
        ok.then_some(row)
    })
    .await;
    res.map_err(|_| {
        let last = last.lock().map(|l| format!("{l:?}")).unwrap_or_default();
        Error::Other(format!(
            "{ns}/{name} not Running at {version} within {deadline:?}; last row: {last}"
        ))
    })
}

/// A JSONPath of one object.
/// The Events of `object` in `namespace`, one `reason|note` line each (the
/// note from `note` or the core API's `message`).
pub async fn event_lines(cluster: &Cluster, namespace: &str, object: &str) -> Vec<String> {
    let out = cluster
        .kubectl([
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            &format!("involvedObject.name={object}"),
            "-o",
            "jsonpath={range .items[*]}{.reason}|{.note}{.message}{\"\\n\"}{end}",
        ])
        .await
        .expect("kubectl get events");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// `kubectl -n ns patch csidd name --type=merge -p patch`, as an admin.
pub async fn merge_patch_cr(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    patch: &str,
) -> Result<String> {
    cluster
        .kubectl_ok([
            "-n",
            ns,
            "patch",
            "csidd",
            name,
            "--type=merge",
            "-p",
            patch,
        ])
        .await
}

/// Deletes the CSIDriverDeployment `ns/name` and waits (at most `timeout`)
/// until it is gone, i.e. until the operator's teardown released it.
pub async fn delete_cr(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> Result<String> {
    let timeout = format!("--timeout={}s", timeout.as_secs());
    cluster
        .kubectl_ok(["-n", ns, "delete", "csidd", name, "--wait=true", &timeout])
        .await
}

pub async fn jsonpath(cluster: &Cluster, args: &[&str], path: &str) -> Result<String> {
    let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    all.push("-o".into());
    all.push(format!("jsonpath={path}"));
    cluster.kubectl_ok(&all).await
}

/// A plain HTTP/1.1 GET on loopback: `(status code, body)`, `None` if the
/// server is not there. Blocking; call it from `spawn_blocking`.
pub fn http_get(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Some((code, body))
}

/// [`http_get`] from async code.
pub async fn http_get_async(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || http_get(addr, &path))
        .await
        .ok()
        .flatten()
}

/// A CSIDriverDeployment of csi-test-driver (image `image`) in its own
/// namespace, for the real node: its node pods use `kubelet_dir`, and with
/// `on_simulated_nodes` they also go to the (tainted) kwok nodes.
pub struct TestDriverDeployment<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub driver: &'a str,
    pub image: &'a str,
    pub version: &'a str,
    pub kubelet_dir: &'a Path,
    pub on_simulated_nodes: bool,
}

impl TestDriverDeployment<'_> {
    /// The Namespace and the CSIDriverDeployment as YAML.
    pub fn yaml(&self) -> String {
        let cr = DriverCr::new(self.namespace, self.name, self.driver, self.version)
            .image(self.image)
            .driver_args([
                format!("--drivername={}", self.driver),
                "--endpoint=$(CSI_ENDPOINT)".into(),
                "--nodeid=$(KUBE_NODE_NAME)".into(),
                "--state-dir=/csi/state".into(),
            ])
            .with("node.kubeletDir", self.kubelet_dir.display().to_string())
            .with("csiDriver.attachRequired", false);
        if self.on_simulated_nodes {
            cr.with("node.tolerations", simulated_toleration())
        } else {
            cr
        }
        .yaml()
    }
}

/// `node.tolerations` that let node pods onto the (tainted) kwok nodes.
pub fn simulated_toleration() -> serde_json::Value {
    serde_json::json!([{
        "key": crate::kwok::SIMULATED_TAINT.0,
        "operator": "Exists",
        "effect": crate::kwok::SIMULATED_TAINT.1,
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_with_empty_cells_parse_by_header_offsets() {
        let text = "NAME       DRIVER                VERSION   PHASE       CONTROLLER\n\
                    hostpath   hostpath.csi.k8s.io             Deploying   0/1\n";
        let rows = parse_table(text);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0]["VERSION"], "");
        assert_eq!(rows[0]["PHASE"], "Deploying");
        assert_eq!(rows[0]["CONTROLLER"], "0/1");
    }
}
