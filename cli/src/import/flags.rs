//! The flags of upstream sidecars: split into one group per flag (Go's
//! `-x v` takes two arguments), compared with what the operator sets, and
//! checked with csiops-sidecar's own parser before they are carried into
//! `extraArgs`.
//!
//! What the operator sets is read from the operator itself: a sample
//! object is rendered with `render::render` and the sidecars' arguments
//! are taken from it, so a flag the operator starts to set is known here
//! without a second list.

use std::collections::BTreeMap;
use std::ffi::OsString;

use csiops_crds::CSIDriverDeployment;
use csiops_operator::render::{render, Helper, RenderConfig};
use csiops_sidecars::common::goflags::{self, Kind};
use k8s_openapi::api::core::v1::Container;

use super::classify::Role;
use super::ImportError;

/// One flag of a command line and the arguments it spans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlagGroup {
    /// Indices into the container's `args`.
    pub indices: Vec<usize>,
    /// The flag name without dashes; `None` for a positional argument.
    pub name: Option<String>,
    pub value: Option<String>,
    /// The arguments as written.
    pub tokens: Vec<String>,
}

/// The csiops-sidecar subcommand of a role, for the flags' kinds.
fn role_command(role: Role) -> Option<clap::Command> {
    let name = role.sidecar_role()?;
    csiops_sidecars::cli::command()
        .find_subcommand(name)
        .cloned()
}

/// Splits `args` into flag groups. A flag that takes a value and is given
/// without `=` takes the next argument (for our sidecars as their parser
/// decides; for the upstream helpers, when the next argument is no flag).
pub fn split(role: Role, args: &[String]) -> Vec<FlagGroup> {
    let cmd = role_command(role);
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        let body = arg
            .strip_prefix("--")
            .or_else(|| arg.strip_prefix('-'))
            .filter(|b| !b.is_empty() && !b.starts_with('-') && !b.starts_with('='));
        let Some(body) = body else {
            out.push(FlagGroup {
                indices: vec![i],
                name: None,
                value: None,
                tokens: vec![arg.clone()],
            });
            i += 1;
            continue;
        };
        let (name, value) = match body.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (body.to_string(), None),
        };
        let takes_next = value.is_none()
            && i + 1 < args.len()
            && match cmd.as_ref().and_then(|c| goflags::kind(c, &name)) {
                Some(Kind::Value) => true,
                Some(_) => false,
                None => !args[i + 1].starts_with('-'),
            };
        if takes_next {
            out.push(FlagGroup {
                indices: vec![i, i + 1],
                name: Some(name),
                value: Some(args[i + 1].clone()),
                tokens: vec![arg.clone(), args[i + 1].clone()],
            });
            i += 2;
        } else {
            out.push(FlagGroup {
                indices: vec![i],
                name: Some(name),
                value,
                tokens: vec![arg.clone()],
            });
            i += 1;
        }
    }
    out
}

/// Whether two values of a flag mean the same (Go's booleans: bare is
/// `true`, `1`/`t`/`True`… are too).
pub fn same_value(a: Option<&str>, b: Option<&str>) -> bool {
    let norm = |v: Option<&str>| match v {
        None => Some(true),
        Some(v) => goflags::go_bool(v),
    };
    match (norm(a), norm(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// The arguments the operator gives each sidecar and helper, from a
/// rendered sample (central with every helper, and node-local).
#[derive(Clone, Debug, Default)]
pub struct OperatorArgs {
    central: BTreeMap<&'static str, Vec<String>>,
    node_local: BTreeMap<&'static str, Vec<String>>,
}

const SAMPLE: &str = r#"{
  "apiVersion": "csiops.dev/v1alpha1", "kind": "CSIDriverDeployment",
  "metadata": {"name": "sample", "namespace": "sample", "uid": "sample"},
  "spec": {"driverName": "sample.csi.example.com", "version": "1", "driver": {"image": "sample"},
           "sidecars": {"resizer": {"enabled": true}, "snapshotter": {"enabled": true},
                        "healthMonitor": {"enabled": true}}}
}"#;

fn containers_by_role(containers: &[Container], out: &mut BTreeMap<&'static str, Vec<String>>) {
    for role in [
        Role::Provisioner,
        Role::Attacher,
        Role::Registrar,
        Role::LivenessProbe,
        Role::Helper(Helper::Resizer),
        Role::Helper(Helper::Snapshotter),
        Role::Helper(Helper::HealthMonitor),
    ] {
        let name = match role {
            Role::Helper(h) => h.container_name(),
            Role::Provisioner => csiops_operator::render::names::CONTAINER_PROVISIONER,
            Role::Attacher => csiops_operator::render::names::CONTAINER_ATTACHER,
            Role::Registrar => csiops_operator::render::names::CONTAINER_REGISTRAR,
            _ => csiops_operator::render::names::CONTAINER_LIVENESS_PROBE,
        };
        if let Some(c) = containers.iter().find(|c| c.name == name) {
            out.entry(role.key())
                .or_insert_with(|| c.args.clone().unwrap_or_default());
        }
    }
}

impl OperatorArgs {
    /// Renders the samples.
    pub fn from_operator(cfg: &RenderConfig) -> Result<OperatorArgs, ImportError> {
        let sample: CSIDriverDeployment =
            serde_json::from_str(SAMPLE).map_err(|source| ImportError::Invalid {
                object: "the operator's sample".into(),
                source,
            })?;
        let mut node_local = sample.clone();
        node_local.spec.topology = csiops_crds::Topology::NodeLocal;
        node_local.spec.csi_driver.attach_required = false;
        node_local.spec.sidecars.resizer.enabled = false;
        node_local.spec.sidecars.snapshotter.enabled = false;
        node_local.spec.sidecars.health_monitor.enabled = false;

        let mut out = OperatorArgs::default();
        let central = render(&sample, cfg)?;
        let pods = [
            central
                .controller
                .as_ref()
                .and_then(|c| c.template())
                .and_then(|t| t.spec.as_ref()),
            central
                .daemonset
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref()),
        ];
        for pod in pods.into_iter().flatten() {
            containers_by_role(&pod.containers, &mut out.central);
        }
        let local = render(&node_local, cfg)?;
        if let Some(pod) = local
            .daemonset
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
        {
            containers_by_role(&pod.containers, &mut out.node_local);
        }
        Ok(out)
    }

    /// The operator's arguments of `role`.
    pub fn of(&self, role: Role, node_local: bool) -> &[String] {
        let map = if node_local && role == Role::Provisioner {
            &self.node_local
        } else {
            &self.central
        };
        map.get(role.key()).map(Vec::as_slice).unwrap_or_default()
    }

    /// The value the operator gives flag `name` of `role`, if it sets it.
    pub fn value_of(&self, role: Role, node_local: bool, name: &str) -> Option<Option<String>> {
        split(role, self.of(role, node_local))
            .into_iter()
            .find(|g| g.name.as_deref() == Some(name))
            .map(|g| g.value)
    }
}

/// What csiops-sidecar makes of one carried flag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    Accepted,
    /// Accepted for compatibility and ignored.
    Ignored,
    /// Refused, with the parser's message.
    Refused(String),
}

fn parse(role: &str, args: &[String]) -> Result<Vec<String>, String> {
    let mut argv: Vec<OsString> = vec!["csiops-sidecar".into(), role.into()];
    argv.extend(args.iter().map(OsString::from));
    let parsed = csiops_sidecars::cli::parse_from(argv).map_err(|e| {
        e.to_string()
            .lines()
            .next()
            .unwrap_or_default()
            .trim_start_matches("error: ")
            .to_string()
    })?;
    parsed.cli.role.check().map_err(|e| {
        let mut msg = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            msg.push_str(": ");
            msg.push_str(&s.to_string());
            source = s.source();
        }
        msg
    })?;
    Ok(parsed.ignored)
}

/// Checks the flags carried into a bundled sidecar's `extraArgs` with
/// csiops-sidecar's parser, after the operator's own arguments, as the
/// container will run them. One result per group.
pub fn check(role: Role, operator: &[String], carried: &[FlagGroup]) -> Vec<Check> {
    let Some(name) = role.sidecar_role() else {
        return vec![Check::Accepted; carried.len()];
    };
    let operator: Vec<String> = operator.iter().skip(1).cloned().collect();
    let ignored_or_accepted = |group: &FlagGroup, ignored: &[String]| {
        let flag = group.name.as_deref().map(|n| format!("--{n}"));
        if flag.is_some_and(|f| ignored.contains(&f)) {
            Check::Ignored
        } else {
            Check::Accepted
        }
    };
    // Flags that are only valid together (the three leader-election
    // durations, each checked against the others) are judged together
    // first: when all the carried flags pass as one command line, each is
    // accepted (or ignored) as it is.
    let mut all = operator.clone();
    all.extend(carried.iter().flat_map(|g| g.tokens.iter().cloned()));
    if let Ok(ignored) = parse(name, &all) {
        return carried
            .iter()
            .map(|g| ignored_or_accepted(g, &ignored))
            .collect();
    }
    let one = |group: &FlagGroup| {
        let mut args = operator.clone();
        args.extend(group.tokens.iter().cloned());
        match parse(name, &args) {
            Err(msg) => Check::Refused(msg),
            Ok(ignored) => ignored_or_accepted(group, &ignored),
        }
    };
    carried.iter().map(one).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn split_follows_the_sidecars_parser() {
        let groups = split(
            Role::Provisioner,
            &strings(&["-v", "5", "--extra-create-metadata", "--timeout=30s", "x"]),
        );
        let names: Vec<Option<&str>> = groups.iter().map(|g| g.name.as_deref()).collect();
        assert_eq!(
            names,
            [
                Some("v"),
                Some("extra-create-metadata"),
                Some("timeout"),
                None
            ]
        );
        assert_eq!(groups[0].indices, [0, 1]);
        assert_eq!(groups[0].value.as_deref(), Some("5"));
    }

    #[test]
    fn values_compare_as_go_does() {
        assert!(same_value(None, Some("true")));
        assert!(same_value(Some("True"), Some("1")));
        assert!(!same_value(Some("false"), None));
        assert!(same_value(Some("60s"), Some("60s")));
        assert!(!same_value(Some("60s"), Some("30s")));
    }

    #[test]
    fn operator_args_come_from_rendering() {
        let cfg = RenderConfig {
            sidecar_image: "s".into(),
            operator_version: "0".into(),
        };
        let ops = OperatorArgs::from_operator(&cfg).expect("renders");
        assert_eq!(
            ops.value_of(Role::Provisioner, false, "timeout"),
            Some(Some("60s".into()))
        );
        assert_eq!(
            ops.value_of(Role::Provisioner, true, "node-deployment"),
            Some(None)
        );
        assert!(!ops.of(Role::Helper(Helper::Resizer), false).is_empty());
    }

    #[test]
    fn flags_valid_only_together_are_judged_together() {
        // A vSphere-style controller: longer leader-election durations,
        // each inconsistent with the defaults of the other two.
        let args = strings(&[
            "--leader-election-lease-duration=120s",
            "--leader-election-renew-deadline=60s",
            "--leader-election-retry-period=30s",
        ]);
        let groups = split(Role::Provisioner, &args);
        let cfg = RenderConfig {
            sidecar_image: "s".into(),
            operator_version: "0".into(),
        };
        let ops = OperatorArgs::from_operator(&cfg).expect("renders");
        let operator = ops.of(Role::Provisioner, false);
        let checks = check(Role::Provisioner, operator, &groups);
        assert_eq!(checks, vec![Check::Accepted; 3]);
        // A lease shorter than the (default) renew deadline is refused.
        let short = split(
            Role::Provisioner,
            &strings(&["--leader-election-lease-duration=5s"]),
        );
        assert!(matches!(
            check(Role::Provisioner, operator, &short)[0],
            Check::Refused(_)
        ));
    }

    #[test]
    fn the_sidecars_parser_judges_carried_flags() {
        let cfg = RenderConfig {
            sidecar_image: "s".into(),
            operator_version: "0".into(),
        };
        let ops = OperatorArgs::from_operator(&cfg).expect("renders");
        let carried = split(
            Role::Provisioner,
            &strings(&[
                "--feature-gates=Topology=true",
                "--no-such-flag",
                "--enable-pprof",
            ]),
        );
        let checks = check(
            Role::Provisioner,
            ops.of(Role::Provisioner, false),
            &carried,
        );
        assert_eq!(checks[0], Check::Accepted);
        assert!(matches!(checks[1], Check::Refused(_)), "{:?}", checks[1]);
        assert_eq!(checks[2], Check::Ignored);
    }
}
