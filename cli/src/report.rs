//! The accounting of an import: every container, flag, env var, volume,
//! mount, probe, port, security setting, toleration, affinity, priority
//! class, label and RBAC rule of the input is one [`Item`], with one of three
//! outcomes:
//!
//! - **mapped** to a field of the CSIDriverDeployment (or to nothing, when
//!   it is bookkeeping that is not needed, such as Helm's labels);
//! - **replaced** by what the operator does itself (its sidecars, volumes,
//!   flags, ServiceAccounts and RBAC);
//! - **not representable** today, with why and what the user can do.
//!
//! What the CRD cannot express is data ([`GAPS`]): when the CRD grows a
//! field, its line leaves the table and the mapping code maps it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

/// What an item of the input is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum What {
    Object,
    Field,
    Container,
    InitContainer,
    Arg,
    Env,
    EnvFrom,
    Volume,
    VolumeMount,
    Probe,
    Port,
    SecurityContext,
    Resources,
    Toleration,
    Affinity,
    NodeSelector,
    PriorityClass,
    PodField,
    Label,
    Annotation,
    RbacRule,
}

/// What became of an item.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "camelCase")]
pub enum Outcome {
    /// Carried into the CR at `to` (a field path), or `None`: not needed.
    #[serde(rename_all = "camelCase")]
    Mapped {
        #[serde(skip_serializing_if = "Option::is_none")]
        to: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
    /// Done by the operator itself: `by` what, and why nothing is carried.
    #[serde(rename_all = "camelCase")]
    Replaced { by: String, reason: String },
    /// The CRD cannot say it.
    #[serde(rename_all = "camelCase")]
    NotRepresentable { why: String, todo: String },
}

impl Outcome {
    pub fn mapped(to: impl Into<String>) -> Outcome {
        Outcome::Mapped {
            to: Some(to.into()),
            note: None,
        }
    }

    pub fn mapped_note(to: impl Into<String>, note: impl Into<String>) -> Outcome {
        Outcome::Mapped {
            to: Some(to.into()),
            note: Some(note.into()),
        }
    }

    /// Mapped to nothing: not needed.
    pub fn not_needed(note: impl Into<String>) -> Outcome {
        Outcome::Mapped {
            to: None,
            note: Some(note.into()),
        }
    }

    pub fn replaced(by: impl Into<String>, reason: impl Into<String>) -> Outcome {
        Outcome::Replaced {
            by: by.into(),
            reason: reason.into(),
        }
    }

    /// Not representable, for one of the known [`Gap`]s; `detail` says what
    /// of this input it is.
    pub fn gap(gap: Gap, detail: impl Into<String>) -> Outcome {
        let info = gap.info();
        let detail = detail.into();
        Outcome::NotRepresentable {
            why: if detail.is_empty() {
                info.why.to_string()
            } else {
                format!("{} ({detail})", info.why)
            },
            todo: info.todo.to_string(),
        }
    }

    pub fn not_representable(why: impl Into<String>, todo: impl Into<String>) -> Outcome {
        Outcome::NotRepresentable {
            why: why.into(),
            todo: todo.into(),
        }
    }

    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Mapped { .. } => "mapped",
            Outcome::Replaced { .. } => "replaced",
            Outcome::NotRepresentable { .. } => "not representable",
        }
    }
}

/// One element of the input and what became of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Item {
    /// `Kind/name` of the input object.
    pub object: String,
    /// The container it belongs to, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    pub what: What,
    /// Which one: the arg's index, the env var's or volume's name, the
    /// mount's path, the field's name…
    pub key: String,
    /// The input's value, shortened, where it helps to read the report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// Everything an import says.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub items: Vec<Item>,
    /// Decisions that belong to no single item (a sidecar left out because
    /// the input does not run it, a default chosen…).
    pub notes: Vec<String>,
}

/// Where an item sits, for [`Report::push`].
#[derive(Clone, Debug)]
pub struct At<'a> {
    pub object: &'a str,
    pub container: Option<&'a str>,
}

impl Report {
    pub fn push(
        &mut self,
        at: &At<'_>,
        what: What,
        key: impl Into<String>,
        value: Option<String>,
        outcome: Outcome,
    ) {
        self.items.push(Item {
            object: at.object.to_string(),
            container: at.container.map(str::to_string),
            what,
            key: key.into(),
            value: value.map(|v| shorten(&v)),
            outcome,
        });
    }

    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// Whether some item is not representable.
    pub fn partial(&self) -> bool {
        self.items
            .iter()
            .any(|i| matches!(i.outcome, Outcome::NotRepresentable { .. }))
    }

    /// Counts per outcome.
    pub fn counts(&self) -> BTreeMap<&'static str, usize> {
        let mut counts = BTreeMap::new();
        for item in &self.items {
            *counts.entry(item.outcome.label()).or_default() += 1;
        }
        counts
    }

    /// The report as JSON (`--report-format json`), stable for goldens.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        #[derive(Serialize)]
        struct Json<'a> {
            summary: BTreeMap<&'static str, usize>,
            #[serde(flatten)]
            report: &'a Report,
            footer: &'static str,
        }
        serde_json::to_string_pretty(&Json {
            summary: self.counts(),
            report: self,
            footer: FOOTER,
        })
        .map(|s| s + "\n")
    }

    /// The report for a reader: per object, one line per item, then what
    /// is not representable with what to do, and the footer.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let mut last_object = "";
        for item in &self.items {
            if item.object != last_object {
                let _ = writeln!(out, "{}", item.object);
                last_object = &item.object;
            }
            let mut subject = String::new();
            if let Some(c) = &item.container {
                let _ = write!(subject, "{c} ");
            }
            let _ = write!(subject, "{} {}", what_name(item.what), item.key);
            if let Some(v) = &item.value {
                let _ = write!(subject, " = {v}");
            }
            let detail = match &item.outcome {
                Outcome::Mapped { to, note } => match (to, note) {
                    (Some(to), Some(note)) => format!("-> {to} ({note})"),
                    (Some(to), None) => format!("-> {to}"),
                    (None, Some(note)) => format!("-> nothing: {note}"),
                    (None, None) => "-> nothing".to_string(),
                },
                Outcome::Replaced { by, reason } => format!("by {by}: {reason}"),
                Outcome::NotRepresentable { why, .. } => why.clone(),
            };
            let _ = writeln!(out, "  [{}] {subject} {detail}", item.outcome.label());
        }
        if !self.notes.is_empty() {
            let _ = writeln!(out, "\nNotes:");
            for note in &self.notes {
                let _ = writeln!(out, "  - {note}");
            }
        }
        let missing: Vec<&Item> = self
            .items
            .iter()
            .filter(|i| matches!(i.outcome, Outcome::NotRepresentable { .. }))
            .collect();
        if !missing.is_empty() {
            let _ = writeln!(out, "\nNot representable ({}):", missing.len());
            for item in missing {
                if let Outcome::NotRepresentable { why, todo } = &item.outcome {
                    let container = item
                        .container
                        .as_deref()
                        .map(|c| format!(" {c}"))
                        .unwrap_or_default();
                    let _ = writeln!(
                        out,
                        "  - {}{container} {} {}: {why}\n    what to do: {todo}",
                        item.object,
                        what_name(item.what),
                        item.key
                    );
                }
            }
        }
        let counts = self.counts();
        let count = |k| counts.get(k).copied().unwrap_or(0);
        let _ = writeln!(
            out,
            "\nSummary: {} items: {} mapped, {} replaced, {} not representable.\n{FOOTER}",
            self.items.len(),
            count("mapped"),
            count("replaced"),
            count("not representable"),
        );
        out
    }
}

/// The end of every report.
pub const FOOTER: &str = "Without --adopt, the CSIDriverDeployment above deploys a new instance of the driver, beside nothing that runs it. To take over the running deployment these manifests describe, without a volume outage, import again with --adopt (docs/adoption.md).";

fn what_name(what: What) -> &'static str {
    match what {
        What::Object => "object",
        What::Field => "field",
        What::Container => "container",
        What::InitContainer => "init container",
        What::Arg => "arg",
        What::Env => "env",
        What::EnvFrom => "envFrom",
        What::Volume => "volume",
        What::VolumeMount => "mount",
        What::Probe => "probe",
        What::Port => "port",
        What::SecurityContext => "securityContext",
        What::Resources => "resources",
        What::Toleration => "toleration",
        What::Affinity => "affinity",
        What::NodeSelector => "nodeSelector",
        What::PriorityClass => "priorityClassName",
        What::PodField => "pod field",
        What::Label => "label",
        What::Annotation => "annotation",
        What::RbacRule => "rbac rule",
    }
}

fn shorten(v: &str) -> String {
    const MAX: usize = 120;
    if v.chars().count() <= MAX {
        v.to_string()
    } else {
        let cut: String = v.chars().take(MAX).collect();
        format!("{cut}…")
    }
}

/// What the CRD cannot express today. One entry per gap: when the CRD
/// grows a field, its entry goes and the mapping maps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gap {
    DriverRbac,
    ServiceAccountMetadata,
    SidecarPorts,
    DriverProbes,
    DriverCommand,
    EnvFrom,
    Lifecycle,
    ExtraContainerPorts,
    ConfigMap,
    Service,
    OtherObject,
    OtherWorkload,
    ControllerUpdateStrategy,
    DaemonSetSurge,
    PodField,
    WindowsDaemonSet,
    StorageClassTopology,
    ForeignClass,
    PullPolicyPerWorkload,
    SidecarFlag,
    NonRootDriver,
}

/// Why a gap is one and what the user can do.
pub struct GapInfo {
    pub gap: Gap,
    pub why: &'static str,
    pub todo: &'static str,
}

/// The gaps, as data.
pub const GAPS: &[GapInfo] = &[
    GapInfo { gap: Gap::DriverRbac, why: "the driver's own RBAC: csiops binds only its shipped per-sidecar roles", todo: "apply this (Cluster)Role yourself and bind it to the ServiceAccount <name>-controller or <name>-node the operator creates; set driver.mountServiceAccountToken: true if the driver calls the API" },
    GapInfo { gap: Gap::ServiceAccountMetadata, why: "the operator creates the ServiceAccounts and sets no annotations or labels of yours on them (e.g. IRSA's eks.amazonaws.com/role-arn)", todo: "annotate <name>-controller / <name>-node after the operator created them (kubectl annotate); the operator does not remove annotations it does not own" },
    GapInfo { gap: Gap::SidecarPorts, why: "the sidecars' ports move together from spec.sidecars.portBase (1024 to 65520), and this port cannot be a base", todo: "set spec.sidecars.portBase to a free range of eight ports on the nodes" },
    GapInfo { gap: Gap::DriverProbes, why: "the driver's liveness probe is the operator's (the liveness-probe sidecar's /healthz); there is no field for readiness or startup probes", todo: "none needed for CSI health; a driver that must not receive traffic before it is ready has to be kept in its own manifests" },
    GapInfo { gap: Gap::DriverCommand, why: "spec.driver has no command: the image's entrypoint runs", todo: "check that the image's ENTRYPOINT is this command, or build an image whose entrypoint it is" },
    GapInfo { gap: Gap::EnvFrom, why: "env in the CR takes single variables, not envFrom", todo: "list the variables in the env field (spec.driver.env, an extra container's env) with valueFrom.configMapKeyRef / secretKeyRef" },
    GapInfo { gap: Gap::Lifecycle, why: "lifecycle hooks are the driver container's only (spec.controller/node.lifecycle); the bundled sidecars and extra containers take none", todo: "move the hook into the driver container's preStop, or do the work on SIGTERM" },
    GapInfo { gap: Gap::ExtraContainerPorts, why: "spec.sidecars.extra containers have no ports or probes", todo: "the container still listens; a Service must target the port by number" },
    GapInfo { gap: Gap::ConfigMap, why: "the operator creates no ConfigMaps", todo: "apply the ConfigMap yourself in the CR's namespace; the volumes that mount it are mapped" },
    GapInfo { gap: Gap::Service, why: "the operator creates no Services (except the metrics Service of spec.monitoring)", todo: "apply the Service yourself; select the pods by the labels in spec.controller/node.podLabels" },
    GapInfo { gap: Gap::OtherObject, why: "csiops does not create objects of this kind", todo: "apply it yourself" },
    GapInfo { gap: Gap::OtherWorkload, why: "a workload that is neither the driver's controller nor its node DaemonSet", todo: "keep deploying it from its own manifest" },
    GapInfo { gap: Gap::ControllerUpdateStrategy, why: "the operator rolls the controller itself (surge under NonDisruptive), so its update strategy is its own", todo: "none: see spec.rollout.strategy" },
    GapInfo { gap: Gap::DaemonSetSurge, why: "the node DaemonSet rolls by maxUnavailable only (node-locally maxSurge is 0)", todo: "set spec.node.maxUnavailable" },
    GapInfo { gap: Gap::PodField, why: "the CRD has no field for this pod setting", todo: "check whether the driver needs it; if so, keep the upstream manifests for now" },
    GapInfo { gap: Gap::WindowsDaemonSet, why: "a CSIDriverDeployment runs one node DaemonSet (Linux)", todo: "keep the Windows DaemonSet from its own manifest" },
    GapInfo { gap: Gap::StorageClassTopology, why: "spec.storageClasses has no allowedTopologies", todo: "apply this StorageClass yourself instead of listing it in the CR" },
    GapInfo { gap: Gap::ForeignClass, why: "the class names another driver", todo: "apply it yourself; csiops creates classes of its own driver only" },
    GapInfo { gap: Gap::PullPolicyPerWorkload, why: "spec.driver.imagePullPolicy is one policy for the driver in both workloads", todo: "the node's policy is used; set one policy for both" },
    GapInfo { gap: Gap::NonRootDriver, why: "the driver would run as a non-root user and own its CSI socket, which csiops' sidecars (uid 0 with every capability dropped, docs/security.md) cannot connect to", todo: "leave it out: the driver runs as the image's user (root for most drivers); a driver that must run non-root has to make its socket writable for the sidecars" },
    GapInfo { gap: Gap::SidecarFlag, why: "csiops-sidecar refuses this flag", todo: "drop it, or see docs/sidecars.md for the flag that replaces it" },
];

impl Gap {
    pub fn info(self) -> &'static GapInfo {
        GAPS.iter().find(|g| g.gap == self).unwrap_or(&GAPS[0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_gap_has_one_line() {
        let all = [
            Gap::DriverRbac,
            Gap::ServiceAccountMetadata,
            Gap::SidecarPorts,
            Gap::DriverProbes,
            Gap::DriverCommand,
            Gap::EnvFrom,
            Gap::Lifecycle,
            Gap::ExtraContainerPorts,
            Gap::ConfigMap,
            Gap::Service,
            Gap::OtherObject,
            Gap::OtherWorkload,
            Gap::ControllerUpdateStrategy,
            Gap::DaemonSetSurge,
            Gap::PodField,
            Gap::WindowsDaemonSet,
            Gap::StorageClassTopology,
            Gap::ForeignClass,
            Gap::PullPolicyPerWorkload,
            Gap::SidecarFlag,
            Gap::NonRootDriver,
        ];
        assert_eq!(all.len(), GAPS.len());
        for gap in all {
            assert_eq!(GAPS.iter().filter(|g| g.gap == gap).count(), 1, "{gap:?}");
        }
    }

    #[test]
    fn partial_and_text() {
        let mut r = Report::default();
        let at = At {
            object: "DaemonSet/x",
            container: Some("plugin"),
        };
        r.push(
            &at,
            What::Arg,
            "0",
            Some("--v=5".into()),
            Outcome::mapped("spec.logLevel"),
        );
        assert!(!r.partial());
        r.push(
            &at,
            What::Port,
            "metrics",
            None,
            Outcome::gap(Gap::DriverProbes, "readinessProbe"),
        );
        assert!(r.partial());
        let text = r.to_text();
        assert!(
            text.contains("[not representable] plugin port metrics"),
            "{text}"
        );
        assert!(
            text.contains("1 mapped, 0 replaced, 1 not representable"),
            "{text}"
        );
    }
}
