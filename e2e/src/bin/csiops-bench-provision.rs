//! Benchmark (not a test): time to Bound for N claims and to deletion of
//! their volumes, the provisioner's API requests per claim (its own
//! `csiops_kube_api_requests_total{verb}`: writes, and GETs outside the
//! watches), and its memory, on the local control plane with
//! `csi-test-driver`. Prints a Markdown table.
//!
//! `csiops-bench-provision [claims] [qps] [burst]` (defaults 500, 50, 100).
//! The provisioner binary is `CSIOPS_SIDECAR_BIN` (use a release build).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use csiops_e2e::process::memory_kib;
use csiops_e2e::provisioning::{ProvisionerBed, DRIVER};
use csiops_e2e::{testkit, wait_for, Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

const NS: &str = "default";

/// (writes, reads) the provisioner has sent so far, from its metrics.
async fn requests(port: u16) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    let (_, text) = testkit::http_get_async(([127, 0, 0, 1], port).into(), "/metrics")
        .await
        .ok_or("no metrics")?;
    let (mut writes, mut reads) = (0.0, 0.0);
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("csiops_kube_api_requests_total{verb=\"") else {
            continue;
        };
        let Some((verb, value)) = rest.split_once("\"} ") else {
            continue;
        };
        let n: f64 = value.trim().parse().unwrap_or(0.0);
        match verb {
            "GET" => reads += n,
            _ => writes += n,
        }
    }
    Ok((writes, reads))
}

fn arg<T: std::str::FromStr>(i: usize, default: T) -> T {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn claim(i: usize) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(format!("bench-{i:04}")),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some("bench".into()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".into(), Quantity("1Mi".into()))])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let claims: usize = arg(1, 500);
    let qps: u32 = arg(2, 50);
    let burst: u32 = arg(3, 100);
    let cluster = Cluster::start(ClusterOptions::kwok(3)).await?;
    let qps_flag = format!("--kube-api-qps={qps}");
    let burst_flag = format!("--kube-api-burst={burst}");
    let mut bed = ProvisionerBed::start(&cluster, &[], &[&qps_flag, &burst_flag, "--v=2"]).await?;
    let client = cluster.client()?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let classes: Api<StorageClass> = Api::all(client);
    classes
        .create(
            &PostParams::default(),
            &StorageClass {
                metadata: ObjectMeta {
                    name: Some("bench".into()),
                    ..Default::default()
                },
                provisioner: DRIVER.into(),
                reclaim_policy: Some("Delete".into()),
                volume_binding_mode: Some("Immediate".into()),
                ..Default::default()
            },
        )
        .await?;
    // Let the provisioner sync its caches before the clock starts.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let (writes0, reads0) = requests(bed.http_port).await?;
    let start = Instant::now();
    for i in 0..claims {
        pvcs.create(&PostParams::default(), &claim(i)).await?;
    }
    let created = start.elapsed();
    let limit = Duration::from_secs(1800);
    wait_for(limit, Duration::from_millis(250), || async {
        let list = pvcs.list(&ListParams::default()).await.ok()?;
        let bound = list
            .items
            .iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .count();
        (bound == claims).then_some(())
    })
    .await?;
    let to_bound = start.elapsed();
    let pid = bed.sidecar_pid().ok_or("provisioner not running")?;
    let (_, hwm_provision) = memory_kib(pid).ok_or("provisioner gone")?;
    let (writes1, reads1) = requests(bed.http_port).await?;

    let start = Instant::now();
    pvcs.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    wait_for(limit, Duration::from_millis(250), || async {
        let list = pvs.list(&ListParams::default()).await.ok()?;
        list.items.is_empty().then_some(())
    })
    .await?;
    let to_deleted = start.elapsed();
    let (writes2, reads2) = requests(bed.http_port).await?;
    let (rss, hwm) = memory_kib(pid).ok_or("provisioner gone")?;
    let left = bed.driver_volumes()?.len();
    bed.stop_sidecar();
    cluster.stop().await?;

    let mib = |kib: u64| kib as f64 / 1024.0;
    let n = claims as f64;
    println!("| provisioner | claims | QPS/burst | claims created in | all Bound | all deleted | writes (GETs) per provision | per deletion | VmHWM after provisioning (MiB) | VmRSS / VmHWM at the end (MiB) | volumes left |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| csiops | {claims} | {qps}/{burst} | {:.1}s | {:.1}s | {:.1}s | {:.2} ({:.2}) | {:.2} ({:.2}) | {:.1} | {:.1} / {:.1} | {left} |",
        created.as_secs_f64(),
        to_bound.as_secs_f64(),
        to_deleted.as_secs_f64(),
        (writes1 - writes0) / n,
        (reads1 - reads0) / n,
        (writes2 - writes1) / n,
        (reads2 - reads1) / n,
        mib(hwm_provision),
        mib(rss),
        mib(hwm),
    );
    Ok(())
}
