//! The operator beside N volumes (issue 39, point 3): a CSIDriverDeployment
//! of the bench's driver is reconciled to Running before the volumes exist,
//! then the N claims, PVs and VolumeAttachments are laid out under it, then
//! the operator is restarted with them in place. Its cost must not grow
//! with the driver's volumes: it watches no claim, PV or VolumeAttachment.
//!
//! Measured each time: the operator's own request count
//! (`csiops_kube_api_requests_total`), kube-apiserver's count of requests
//! to PVs, claims and VolumeAttachments (from every client: at rest nobody
//! else sends any), and the operator's VmRSS and VmHWM.

use std::time::{Duration, Instant};

use super::{Args, Bed, DRIVER};
use crate::bench::sample::mib;
use crate::operator::ApiRequests;
use crate::process::memory_kib;
use crate::testkit::{self, DriverCr};
use crate::{apimetrics, fleet, operator_bin, Error, OperatorProcess, Result};

const NAMESPACE: &str = "scale-driver";
const NAME: &str = "scale";
const VERSION: &str = "v1";
/// The operator is quiet when it wrote nothing for this long.
const QUIET: Duration = Duration::from_secs(10);
const LIMIT: Duration = Duration::from_secs(600);

/// The volume resources: the operator has no reason to touch them.
const VOLUME_RESOURCES: &[&str] = &[
    "persistentvolumes",
    "persistentvolumeclaims",
    "volumeattachments",
];

/// kube-apiserver's requests to [`VOLUME_RESOURCES`], from every client,
/// and the objects its lists of them returned.
#[derive(Clone, Copy, Debug)]
struct VolumeRequests {
    requests: f64,
    listed: f64,
}

impl VolumeRequests {
    async fn take(client: &kube::Client) -> Result<VolumeRequests> {
        Ok(VolumeRequests::parse(&apimetrics::text(client).await?))
    }

    fn parse(text: &str) -> VolumeRequests {
        VolumeRequests {
            requests: apimetrics::sum_where(text, "apiserver_request_total", |l| {
                VOLUME_RESOURCES.contains(&l.get("resource"))
            }),
            listed: super::listed_objects(text, VOLUME_RESOURCES),
        }
    }

    fn since(&self, before: &VolumeRequests) -> VolumeRequests {
        VolumeRequests {
            requests: self.requests - before.requests,
            listed: self.listed - before.listed,
        }
    }
}

/// One measured stretch of the operator's life.
struct Window {
    what: String,
    volumes: usize,
    seconds: f64,
    own: ApiRequests,
    /// `None` while the bench itself writes the volume resources.
    volume: Option<VolumeRequests>,
    rss_kib: u64,
    hwm_kib: u64,
}

impl Window {
    fn row(&self) -> String {
        let volume = self.volume.map_or("– (the bench's own)".into(), |v| {
            format!("{:.0} ({:.0} objects listed)", v.requests, v.listed)
        });
        format!(
            "| {} | {} | {:.0} s | {:.0} ({:.0} writes) | {volume} | {} | {} |\n",
            self.what,
            self.volumes,
            self.seconds,
            self.own.all,
            self.own.writes,
            mib(self.rss_kib),
            mib(self.hwm_kib),
        )
    }
}

/// Starts the operator and waits for its `/metrics`.
async fn start_operator(bed: &Bed) -> Result<OperatorProcess> {
    let op = bed.cluster.run_operator(&operator_bin()?)?;
    crate::wait_for(
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { op.api_requests().await.ok() },
    )
    .await
    .map_err(|_| {
        Error::Other(format!(
            "the operator serves no /metrics\n{}",
            op.log_tail(20)
        ))
    })?;
    Ok(op)
}

/// Counts from here until [`Mark::window`].
struct Mark {
    t0: Instant,
    own: ApiRequests,
    volume: VolumeRequests,
}

impl Mark {
    /// Before a new operator process starts: its count starts at zero.
    async fn before_start(bed: &Bed) -> Result<Mark> {
        Ok(Mark {
            t0: Instant::now(),
            own: ApiRequests::default(),
            volume: VolumeRequests::take(&bed.client).await?,
        })
    }

    async fn now(bed: &Bed, op: &OperatorProcess) -> Result<Mark> {
        Ok(Mark {
            t0: Instant::now(),
            own: op.api_requests().await?,
            volume: VolumeRequests::take(&bed.client).await?,
        })
    }

    async fn window(
        &self,
        bed: &Bed,
        op: &OperatorProcess,
        what: &str,
        volumes: usize,
    ) -> Result<Window> {
        let own = op.api_requests().await?;
        let volume = VolumeRequests::take(&bed.client).await?.since(&self.volume);
        let (rss_kib, hwm_kib) =
            memory_kib(op.pid()).ok_or_else(|| Error::Other("the operator is gone".into()))?;
        Ok(Window {
            what: what.to_owned(),
            volumes,
            seconds: self.t0.elapsed().as_secs_f64(),
            own: ApiRequests {
                all: own.all - self.own.all,
                writes: own.writes - self.own.writes,
            },
            volume: Some(volume),
            rss_kib,
            hwm_kib,
        })
    }
}

/// The operator running before the volumes are laid out, and what it cost
/// so far.
pub struct Before {
    op: OperatorProcess,
    rows: Vec<Window>,
    layout: Mark,
}

/// Before the layout: the CRD, the operator and the driver's object, until
/// Running and quiet, then `--rest` seconds at rest with no volume.
pub async fn before_layout(bed: &Bed, args: &Args) -> Result<Before> {
    testkit::install_crd(&bed.cluster).await?;
    eprintln!("operator: {}", operator_bin()?.display());
    let start = Mark::before_start(bed).await?;
    let op = start_operator(bed).await?;
    let yaml = DriverCr::new(NAMESPACE, NAME, DRIVER, VERSION)
        .image("example.invalid/scale-driver:v1")
        .driver_args(["--endpoint=$(CSI_ENDPOINT)", "--nodeid=$(KUBE_NODE_NAME)"])
        .with("csiDriver.attachRequired", true)
        .yaml();
    let out = testkit::apply_yaml(&bed.cluster, "scale-driver", &yaml).await?;
    if !out.status.success() {
        return Err(Error::Other(format!(
            "apply the driver's object: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let d = fleet::FleetDriver {
        namespace: NAMESPACE.into(),
        name: NAME.into(),
        driver: DRIVER.into(),
    };
    fleet::wait_settled(
        &bed.client,
        std::slice::from_ref(&d),
        VERSION,
        args.nodes,
        LIMIT,
    )
    .await?;
    op.wait_quiet(QUIET, LIMIT).await?;
    let mut rows = vec![
        start
            .window(bed, &op, "install to Running and quiet", 0)
            .await?,
    ];
    rows.push(rest(bed, &op, args, 0).await?);
    let layout = Mark::now(bed, &op).await?;
    Ok(Before { op, rows, layout })
}

/// `--rest` seconds at rest.
async fn rest(bed: &Bed, op: &OperatorProcess, args: &Args, volumes: usize) -> Result<Window> {
    let m = Mark::now(bed, op).await?;
    tokio::time::sleep(Duration::from_secs(args.rest)).await;
    m.window(bed, op, "at rest", volumes).await
}

/// After the layout: what it cost the operator while the volumes came, a
/// window at rest beside them, and a restart with them in place. The table.
pub async fn after_layout(bed: &Bed, args: &Args, before: Before) -> Result<String> {
    let Before {
        op,
        mut rows,
        layout,
    } = before;
    let n = args.volumes;
    // The layout's own requests to the volume resources are the bench's:
    // only the operator's own count says what it did meanwhile.
    let mut w = layout
        .window(bed, &op, "while the volumes were laid out", n)
        .await?;
    w.volume = None;
    rows.push(w);
    rows.push(rest(bed, &op, args, n).await?);
    op.stop().await;
    let m = Mark::before_start(bed).await?;
    let op = start_operator(bed).await?;
    op.wait_quiet(QUIET, LIMIT).await?;
    rows.push(m.window(bed, &op, "restarted, until quiet", n).await?);
    rows.push(rest(bed, &op, args, n).await?);
    op.stop().await;
    let rows: String = rows.iter().map(Window::row).collect();
    Ok(format!(
        "### The operator beside {n} volumes\n\n\
         One CSIDriverDeployment of the bench's driver ({nodes} kwok nodes), reconciled to Running before the \
         volumes exist; then the {n} claims, PVs and VolumeAttachments laid out; then the operator restarted. \
         Requests: its own count (`csiops_kube_api_requests_total`; watches count when they start), and \
         kube-apiserver's count of requests to PVs, claims and VolumeAttachments from every client (not counted \
         while the bench lays them out).\n\n\
         | window | volumes | length | operator's requests | requests to PVs, claims, VolumeAttachments | VmRSS (MiB) | VmHWM (MiB) |\n\
         |---|---|---|---|---|---|---|\n{rows}\n",
        nodes = args.nodes,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_requests_count_only_volume_resources() {
        let text = "apiserver_request_total{resource=\"volumeattachments\",verb=\"GET\"} 5\n\
            apiserver_request_total{resource=\"csinodes\",verb=\"LIST\"} 4\n\
            apiserver_cache_list_returned_objects_total{resource_prefix=\"/persistentvolumeclaims\"} 10000\n\
            apiserver_cache_list_returned_objects_total{resource_prefix=\"/pods\"} 7\n";
        let v = VolumeRequests::parse(text);
        assert_eq!((v.requests, v.listed), (5.0, 10000.0));
    }
}
