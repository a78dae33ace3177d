//! `import --from-cluster --driver NAME`: the live objects of a driver,
//! read with the user's kubeconfig and handed to the same mapping as
//! files. Selection ([`selects`]) and clean-up ([`strip`]) are pure; only
//! [`read_driver`] talks to the API server.
//!
//! What is read: the CSIDriver `NAME`; the Deployments, StatefulSets and
//! DaemonSets of every namespace whose pod template names the driver (a
//! container with `--drivername=NAME` or an env var whose value is `NAME`,
//! or a volume under `…/plugins/NAME`); their ServiceAccounts, the
//! bindings of those and the roles they bind; the StorageClasses and
//! VolumeAttributesClasses of the driver.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass, VolumeAttributesClass};
use kube::api::{Api, ListParams};
use kube::Client;
use serde::Serialize;
use serde_json::Value;

use crate::input::{InputError, Object, Origin};

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot reach the cluster (kubeconfig): {0}")]
    Client(#[source] kube::Error),
    #[error("cannot read {what} from the cluster: {source}")]
    Read {
        what: &'static str,
        source: kube::Error,
    },
    #[error("no workload in the cluster runs driver {0} (a container with --drivername={0}, or a volume under /plugins/{0})")]
    NothingFound(String),
    #[error("cannot start the client's runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    Object(#[from] InputError),
    #[error("cannot serialize a live object: {0}")]
    Json(#[from] serde_json::Error),
}

/// Whether a workload (as JSON) runs the driver `driver`.
pub fn selects(driver: &str, workload: &Value) -> bool {
    let pod = &workload["spec"]["template"]["spec"];
    let plugin_dir = format!("/plugins/{driver}");
    let containers = ["containers", "initContainers"]
        .iter()
        .flat_map(|k| pod[*k].as_array().cloned().unwrap_or_default());
    for c in containers {
        let args: Vec<&str> = ["command", "args"]
            .iter()
            .flat_map(|k| c[*k].as_array().into_iter().flatten())
            .filter_map(Value::as_str)
            .collect();
        for (i, a) in args.iter().enumerate() {
            let body = a.trim_start_matches('-');
            if let Some((name, value)) = body.split_once('=') {
                if matches!(name, "drivername" | "driver-name") && value == driver {
                    return true;
                }
            } else if matches!(body, "drivername" | "driver-name")
                && args.get(i + 1) == Some(&driver)
            {
                return true;
            }
            if a.contains(&format!("{plugin_dir}/")) {
                return true;
            }
        }
        let env_names_driver = c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["value"].as_str() == Some(driver));
        if env_names_driver {
            return true;
        }
    }
    pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["hostPath"]["path"].as_str())
        .any(|p| p.trim_end_matches('/').ends_with(&plugin_dir))
}

/// Drops what the API server adds to an object (status, managed fields,
/// resource version, uid, timestamps, owner references).
pub fn strip(value: &mut Value) {
    if let Some(o) = value.as_object_mut() {
        o.remove("status");
    }
    if let Some(meta) = value["metadata"].as_object_mut() {
        for key in [
            "managedFields",
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "generation",
            "selfLink",
            "ownerReferences",
        ] {
            meta.remove(key);
        }
        if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            a.remove("kubectl.kubernetes.io/last-applied-configuration");
            a.remove("deprecated.daemonset.template.generation");
        }
    }
}

fn to_object<T: Serialize>(obj: &T, n: usize) -> Result<Object, ClusterError> {
    let mut value = serde_json::to_value(obj)?;
    strip(&mut value);
    Ok(Object::from_value(
        value,
        Origin {
            source: "cluster".into(),
            doc: n,
        },
    )?)
}

async fn list<K>(api: Api<K>, what: &'static str) -> Result<Vec<K>, ClusterError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|source| ClusterError::Read { what, source })
}

/// The live objects of `driver`, stripped, in a stable order.
pub fn read_driver(driver: &str) -> Result<Vec<Object>, ClusterError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ClusterError::Runtime)?
        .block_on(read(driver))
}

async fn read(driver: &str) -> Result<Vec<Object>, ClusterError> {
    let client = Client::try_default().await.map_err(ClusterError::Client)?;
    read_with(client, driver).await
}

/// The live objects of `driver` through `client`, stripped, in a stable
/// order.
pub async fn read_with(client: Client, driver: &str) -> Result<Vec<Object>, ClusterError> {
    let mut values: Vec<Value> = Vec::new();
    let csidriver = Api::<CSIDriver>::all(client.clone())
        .get_opt(driver)
        .await
        .map_err(|source| ClusterError::Read {
            what: "CSIDriver",
            source,
        })?;
    if let Some(d) = csidriver {
        values.push(serde_json::to_value(&d)?);
    }
    let mut workloads: Vec<Value> = Vec::new();
    for d in list(Api::<Deployment>::all(client.clone()), "Deployments").await? {
        workloads.push(serde_json::to_value(&d)?);
    }
    for s in list(Api::<StatefulSet>::all(client.clone()), "StatefulSets").await? {
        workloads.push(serde_json::to_value(&s)?);
    }
    for d in list(Api::<DaemonSet>::all(client.clone()), "DaemonSets").await? {
        workloads.push(serde_json::to_value(&d)?);
    }
    workloads.retain(|w| selects(driver, w));
    if workloads.is_empty() {
        return Err(ClusterError::NothingFound(driver.to_string()));
    }
    // (namespace, name) of the workloads' ServiceAccounts.
    let accounts: BTreeSet<(String, String)> = workloads
        .iter()
        .map(|w| {
            let ns = w["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let sa = w["spec"]["template"]["spec"]["serviceAccountName"]
                .as_str()
                .unwrap_or("default")
                .to_string();
            (ns, sa)
        })
        .collect();
    for (ns, name) in &accounts {
        if let Some(sa) = Api::<ServiceAccount>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await
            .map_err(|source| ClusterError::Read {
                what: "ServiceAccount",
                source,
            })?
        {
            values.push(serde_json::to_value(&sa)?);
        }
    }
    let binds = |b: &Value| {
        b["subjects"].as_array().into_iter().flatten().any(|s| {
            s["kind"] == "ServiceAccount"
                && accounts.contains(&(
                    s["namespace"].as_str().unwrap_or_default().to_string(),
                    s["name"].as_str().unwrap_or_default().to_string(),
                ))
        })
    };
    let mut roles: BTreeSet<(String, String, String)> = BTreeSet::new();
    let mut bindings = Vec::new();
    for b in list(
        Api::<ClusterRoleBinding>::all(client.clone()),
        "ClusterRoleBindings",
    )
    .await?
    {
        bindings.push(serde_json::to_value(&b)?);
    }
    for b in list(Api::<RoleBinding>::all(client.clone()), "RoleBindings").await? {
        bindings.push(serde_json::to_value(&b)?);
    }
    for b in bindings.into_iter().filter(|b| binds(b)) {
        let ns = b["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let kind = b["roleRef"]["kind"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let name = b["roleRef"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        roles.insert((kind, ns, name));
        values.push(b);
    }
    for (kind, ns, name) in roles {
        let role = if kind == "ClusterRole" {
            Api::<ClusterRole>::all(client.clone())
                .get_opt(&name)
                .await
                .map(|r| r.map(|r| serde_json::to_value(&r)))
        } else {
            Api::<Role>::namespaced(client.clone(), &ns)
                .get_opt(&name)
                .await
                .map(|r| r.map(|r| serde_json::to_value(&r)))
        };
        if let Some(v) = role.map_err(|source| ClusterError::Read {
            what: "roles",
            source,
        })? {
            values.push(v?);
        }
    }
    for c in list(Api::<StorageClass>::all(client.clone()), "StorageClasses").await? {
        if c.provisioner == driver {
            values.push(serde_json::to_value(&c)?);
        }
    }
    // Older servers do not serve VolumeAttributesClasses: left out then.
    if let Ok(classes) = list(
        Api::<VolumeAttributesClass>::all(client.clone()),
        "VolumeAttributesClasses",
    )
    .await
    {
        for c in classes.into_iter().filter(|c| c.driver_name == driver) {
            values.push(serde_json::to_value(&c)?);
        }
    }
    values.extend(workloads);
    values
        .iter()
        .enumerate()
        .map(|(i, v)| to_object(v, i + 1))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn workload(container: Value, volumes: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "x", "namespace": "n"},
               "spec": {"template": {"spec": {"containers": [container], "volumes": volumes}}}})
    }

    #[test]
    fn selection_by_flag_env_and_plugin_dir() {
        let d = "nfs.csi.k8s.io";
        assert!(selects(
            d,
            &workload(
                json!({"name": "p", "args": ["--drivername=nfs.csi.k8s.io"]}),
                json!([])
            )
        ));
        assert!(selects(
            d,
            &workload(
                json!({"name": "p", "args": ["-drivername", "nfs.csi.k8s.io"]}),
                json!([])
            )
        ));
        assert!(selects(
            d,
            &workload(
                json!({"name": "p", "env": [{"name": "DRIVER_NAME", "value": "nfs.csi.k8s.io"}]}),
                json!([])
            )
        ));
        assert!(selects(
            d,
            &workload(
                json!({"name": "p"}),
                json!([{"name": "s", "hostPath": {"path": "/var/lib/kubelet/plugins/nfs.csi.k8s.io/"}}])
            )
        ));
        assert!(selects(
            d,
            &workload(
                json!({"name": "r", "args": ["--kubelet-registration-path=/var/lib/kubelet/plugins/nfs.csi.k8s.io/csi.sock"]}),
                json!([])
            )
        ));
        // Another driver, or a name that only starts like this one.
        assert!(!selects(
            d,
            &workload(
                json!({"name": "p", "args": ["--drivername=smb.csi.k8s.io"]}),
                json!([])
            )
        ));
        assert!(!selects(
            d,
            &workload(
                json!({"name": "p"}),
                json!([{"name": "s", "hostPath": {"path": "/var/lib/kubelet/plugins/nfs.csi.k8s.io.old"}}])
            )
        ));
        assert!(!selects(d, &json!({"kind": "DaemonSet"})));
    }

    #[test]
    fn strip_drops_what_the_server_adds() {
        let mut v = json!({"metadata": {"name": "x", "managedFields": [], "resourceVersion": "1", "uid": "u",
                           "annotations": {"keep": "1", "kubectl.kubernetes.io/last-applied-configuration": "{}"}},
                           "status": {"numberReady": 1}, "spec": {}});
        strip(&mut v);
        assert_eq!(
            v,
            json!({"metadata": {"name": "x", "annotations": {"keep": "1"}}, "spec": {}})
        );
    }
}
