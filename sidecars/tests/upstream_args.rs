//! Drop-in arguments: every flag of the upstream sidecars we replace, in
//! every form Go's flag package accepts, and the argument sets of real
//! manifests, parse and pass the roles' start-up checks.
//!
//! The flag lists are upstream's, at the versions we replace:
//! external-provisioner v6.3.0 (`cmd/csi-provisioner/csi-provisioner.go`),
//! external-attacher v4.13.0 (`cmd/csi-attacher/main.go`),
//! node-driver-registrar v2.17.0 (`cmd/csi-node-driver-registrar/main.go`,
//! and its `--help`), livenessprobe v2.19.0 (`cmd/livenessprobe/main.go`,
//! and its `--help`), plus what they register from imported packages:
//! component-base's logging flags (`logsapi.AddGoFlags`/`AddFlags`),
//! csi-lib-utils v0.24.0's `standardflags.RegisterCommonFlags` (provisioner,
//! attacher) and `AddAutomaxprocs` (all four).

use std::ffi::OsString;

use csiops_sidecars::cli::{self, Parsed};

#[derive(Clone, Copy, Debug)]
enum Kind {
    /// A Go boolean: bare, or `=value`.
    Bool,
    /// Takes a value; a valid sample.
    Value(&'static str),
}
use Kind::{Bool, Value};

/// One upstream flag: its name, how it takes a value, and whether we
/// accept and ignore it (it must then be named in the start-up line).
type Flag = (&'static str, Kind, Ignored);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Ignored {
    No,
    Yes,
}
use Ignored::{No, Yes};

/// component-base logging flags and csi-lib-utils' `--automaxprocs`: every
/// sidecar has them.
const LOGGING: &[Flag] = &[
    ("v", Value("5"), No),
    ("vmodule", Value("controller=4,sync*=5"), No),
    ("logging-format", Value("json"), No),
    ("log-flush-frequency", Value("5s"), Yes),
    ("log-text-split-stream", Bool, Yes),
    ("log-text-info-buffer-size", Value("1Ki"), Yes),
    ("log-json-split-stream", Bool, Yes),
    ("log-json-info-buffer-size", Value("1Ki"), Yes),
    ("automaxprocs", Bool, Yes),
];

/// csi-lib-utils' `standardflags.RegisterCommonFlags` (provisioner,
/// attacher), `--version` aside (tested on its own).
const STANDARD: &[Flag] = &[
    ("kubeconfig", Value("/etc/kubeconfig"), No),
    ("csi-address", Value("/csi/csi.sock"), No),
    ("leader-election", Bool, No),
    ("leader-election-namespace", Value("kube-system"), No),
    ("leader-election-lease-duration", Value("15s"), No),
    ("leader-election-renew-deadline", Value("10s"), No),
    ("leader-election-retry-period", Value("5s"), No),
    ("leader-election-labels", Value("app:csi,tier:storage"), No),
    ("kube-api-qps", Value("20"), No),
    ("kube-api-burst", Value("40"), No),
    ("http-endpoint", Value(":8080"), No),
    ("metrics-address", Value(":8081"), No),
    ("metrics-path", Value("/metrics"), No),
];

const PROVISIONER: &[Flag] = &[
    ("master", Value("http://10.0.0.1:8080"), No),
    ("volume-name-prefix", Value("pvc"), No),
    ("volume-name-uuid-length", Value("16"), No),
    ("retry-interval-start", Value("1s"), No),
    ("retry-interval-max", Value("5m"), No),
    ("worker-threads", Value("100"), No),
    ("cloning-protection-threads", Value("1"), No),
    ("snapshot-orphan-sweep-interval", Value("5m"), No),
    ("capacity-threads", Value("1"), No),
    ("timeout", Value("10s"), No),
    ("strict-topology", Bool, No),
    ("immediate-topology", Bool, No),
    ("extra-create-metadata", Bool, No),
    ("enable-pprof", Bool, Yes),
    ("default-fstype", Value("ext4"), No),
    ("kube-api-capacity-qps", Value("1"), No),
    ("kube-api-capacity-burst", Value("5"), No),
    ("enable-capacity", Bool, No),
    ("capacity-for-immediate-binding", Bool, No),
    ("capacity-poll-interval", Value("1m"), No),
    ("capacity-ownerref-level", Value("1"), No),
    ("node-deployment", Bool, No),
    ("node-deployment-immediate-binding", Bool, No),
    ("node-deployment-base-delay", Value("20s"), No),
    ("node-deployment-max-delay", Value("60s"), No),
    ("controller-publish-readonly", Bool, No),
    ("prevent-volume-mode-conversion", Bool, No),
    (
        "feature-gates",
        Value("Topology=true,HonorPVReclaimPolicy=true,VolumeAttributesClass=true"),
        No,
    ),
];

const ATTACHER: &[Flag] = &[
    ("resync", Value("10m"), No),
    ("timeout", Value("15s"), No),
    ("retry-interval-start", Value("1s"), No),
    ("retry-interval-max", Value("5m"), No),
    ("worker-threads", Value("10"), No),
    ("max-entries", Value("0"), No),
    ("default-fstype", Value("ext4"), No),
    ("reconcile-sync", Value("1m"), No),
    ("max-grpc-log-length", Value("-1"), Yes),
    (
        "feature-gates",
        Value("ReleaseLeaderElectionOnExit=true"),
        No,
    ),
];

const REGISTRAR: &[Flag] = &[
    ("connection-timeout", Value("15s"), Yes),
    ("timeout", Value("1s"), No),
    ("csi-address", Value("/csi/csi.sock"), No),
    ("plugin-registration-path", Value("/registration"), No),
    (
        "kubelet-registration-path",
        Value("/var/lib/kubelet/plugins/x/csi.sock"),
        No,
    ),
    ("health-port", Value("9809"), No),
    ("http-endpoint", Value(":9809"), No),
    ("mode", Value("registration"), No),
    ("enable-pprof", Bool, Yes),
];

const LIVENESS: &[Flag] = &[
    ("probe-timeout", Value("3s"), No),
    ("csi-address", Value("/csi/csi.sock"), No),
    ("health-port", Value("9898"), No),
    ("metrics-address", Value(":8081"), No),
    ("http-endpoint", Value(":9808"), No),
    ("metrics-path", Value("/metrics"), No),
];

/// Each role with its upstream flags and the arguments it needs anyway.
fn roles() -> Vec<(&'static str, Vec<Flag>, &'static [&'static str])> {
    let with = |own: &[Flag], shared: &[&[Flag]]| {
        let mut all = own.to_vec();
        for s in shared {
            all.extend_from_slice(s);
        }
        all
    };
    vec![
        (
            "provisioner",
            with(PROVISIONER, &[STANDARD, LOGGING]),
            &[][..],
        ),
        ("attacher", with(ATTACHER, &[STANDARD, LOGGING]), &[]),
        (
            "registrar",
            with(REGISTRAR, &[LOGGING]),
            &["--kubelet-registration-path=/k/csi.sock"],
        ),
        ("liveness-probe", with(LIVENESS, &[LOGGING]), &[]),
    ]
}

/// Every form Go's flag package accepts for a flag of `kind`.
fn forms(name: &str, kind: Kind) -> Vec<Vec<String>> {
    match kind {
        Value(v) => vec![
            vec![format!("-{name}={v}")],
            vec![format!("--{name}={v}")],
            vec![format!("-{name}"), v.to_string()],
            vec![format!("--{name}"), v.to_string()],
        ],
        Bool => [
            "-{}",
            "--{}",
            "-{}=true",
            "--{}=false",
            "-{}=false",
            "-{}=1",
            "--{}=F",
        ]
        .iter()
        .map(|f| vec![f.replace("{}", name)])
        .collect(),
    }
}

fn parse(role: &str, args: &[String]) -> Result<Parsed, clap::Error> {
    let mut argv: Vec<OsString> = vec!["csiops-sidecar".into(), role.into()];
    argv.extend(args.iter().map(OsString::from));
    cli::parse_from(argv)
}

#[test]
fn every_upstream_flag_parses_in_every_go_form() {
    let mut checked = 0;
    for (role, flags, base) in roles() {
        for (name, kind, ignored) in flags {
            for form in forms(name, kind) {
                let mut args: Vec<String> = base
                    .iter()
                    .filter(|b| !b.starts_with(&format!("--{name}=")))
                    .map(|b| b.to_string())
                    .collect();
                args.extend(form.iter().cloned());
                let parsed =
                    parse(role, &args).unwrap_or_else(|e| panic!("{role} {args:?}: refused:\n{e}"));
                if let Err(e) = parsed.cli.role.check() {
                    panic!(
                        "{role} {args:?}: parsed but refused at start: {}",
                        csiops_runtime::chain(&e)
                    );
                }
                let want: Vec<String> = if ignored == Yes {
                    vec![format!("--{name}")]
                } else {
                    vec![]
                };
                assert_eq!(
                    parsed.ignored, want,
                    "{role} {args:?}: the flags named as ignored"
                );
                checked += 1;
            }
        }
    }
    // 4 roles, ~150 flags, 4–7 forms each: the table was really walked.
    assert!(checked > 500, "only {checked} cases");
}

#[test]
fn version_prints_and_exits_zero_in_every_form() {
    for role in ["provisioner", "attacher", "registrar", "liveness-probe"] {
        for form in ["-version", "--version", "-version=true", "--version=1"] {
            let err = parse(role, &[form.to_string()]).expect_err(form);
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::DisplayVersion,
                "{role} {form}"
            );
            assert_eq!(err.exit_code(), 0);
        }
        // `-version=false` is no request for the version.
        let base = if role == "registrar" {
            vec!["--kubelet-registration-path=/k".to_string()]
        } else {
            vec![]
        };
        let mut args = base.clone();
        args.push("-version=false".into());
        assert!(parse(role, &args).is_ok(), "{role}");
    }
}

#[test]
fn ignored_flags_are_listed_in_the_sidecar_docs() {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/sidecars.md"))
        .expect("docs/sidecars.md");
    for (role, flags, _) in roles() {
        for (name, _, ignored) in flags {
            if ignored == Yes {
                assert!(
                    docs.contains(&format!("`--{name}`")),
                    "{role}: --{name} is ignored but not in docs/sidecars.md"
                );
            }
        }
    }
}

/// One argument set of a real manifest: where it is from, the role named
/// (`None`: only the image was swapped), the arguments (with kubelet's
/// `$(VAR)` expansion done), and what must happen.
struct Manifest {
    source: &'static str,
    role: Option<&'static str>,
    args: &'static [&'static str],
    expect: Expect,
}

#[derive(Debug, PartialEq)]
enum Expect {
    /// Parses and passes the checks; `role` is the one run.
    Runs(&'static str),
}

const HP: &str = "kubernetes-csi/csi-driver-host-path";

fn manifests() -> Vec<Manifest> {
    use Expect::Runs;
    vec![
        // csi-driver-host-path deploy/kubernetes-1.34 (and 1.35, a link to it).
        Manifest {
            source: "hostpath kubernetes-1.34 csi-node-driver-registrar",
            role: None,
            args: &[
                "--v=5",
                "--csi-address=/csi/csi.sock",
                "--kubelet-registration-path=/var/lib/kubelet/plugins/csi-hostpath/csi.sock",
                "--http-endpoint=:9809",
            ],
            expect: Runs("registrar"),
        },
        Manifest {
            source: "hostpath kubernetes-1.34 livenessprobe",
            role: None,
            args: &["--csi-address=/csi/csi.sock", "--health-port=9898"],
            expect: Runs("liveness-probe"),
        },
        Manifest {
            source: "hostpath kubernetes-1.34 csi-attacher",
            role: Some("attacher"),
            args: &["--v=5", "--csi-address=/csi/csi.sock"],
            expect: Runs("attacher"),
        },
        Manifest {
            source: "hostpath kubernetes-1.34 csi-provisioner",
            role: Some("provisioner"),
            args: &[
                "-v=5",
                "--csi-address=/csi/csi.sock",
                "--feature-gates=Topology=true",
            ],
            expect: Runs("provisioner"),
        },
        // csi-driver-host-path v1.17.1 deploy/kubernetes-distributed.
        Manifest {
            source: "hostpath v1.17.1 kubernetes-distributed csi-provisioner",
            role: Some("provisioner"),
            args: &[
                "-v=5",
                "--csi-address=/csi/csi.sock",
                "--feature-gates=Topology=true",
                "--enable-capacity",
                "--capacity-ownerref-level=0",
                "--node-deployment=true",
                "--strict-topology=true",
                "--immediate-topology=false",
                "--worker-threads=5",
            ],
            expect: Runs("provisioner"),
        },
        Manifest {
            source: "hostpath v1.17.1 kubernetes-distributed csi-node-driver-registrar",
            role: None,
            args: &[
                "--v=5",
                "--csi-address=/csi/csi.sock",
                "--kubelet-registration-path=/var/lib/kubelet/plugins/csi-hostpath/csi.sock",
            ],
            expect: Runs("registrar"),
        },
        // csi-driver-host-path v1.1.0 deploy/kubernetes-1.14: older flags.
        Manifest {
            source: "hostpath v1.1.0 kubernetes-1.14 livenessprobe",
            role: None,
            args: &[
                "--csi-address=/csi/csi.sock",
                "--connection-timeout=3s",
                "--health-port=9898",
            ],
            expect: Runs("liveness-probe"),
        },
        Manifest {
            source: "hostpath v1.1.0 kubernetes-1.14 csi-provisioner",
            role: Some("provisioner"),
            args: &[
                "-v=5",
                "--csi-address=/csi/csi.sock",
                "--connection-timeout=15s",
            ],
            expect: Runs("provisioner"),
        },
        // node-driver-registrar v2.17.0 README examples.
        Manifest {
            source: "node-driver-registrar README, --health-port example",
            role: None,
            args: &[
                "--csi-address=/csi/csi.sock",
                "--kubelet-registration-path=/var/lib/kubelet/plugins/x.example.com/csi.sock",
                "--health-port=9809",
            ],
            expect: Runs("registrar"),
        },
        Manifest {
            source: "node-driver-registrar README, exec livenessProbe (--mode)",
            role: Some("registrar"),
            args: &[
                "--kubelet-registration-path=/var/lib/kubelet/plugins/x.example.com/csi.sock",
                "--mode=kubelet-registration-probe",
            ],
            expect: Runs("registrar"),
        },
        // ceph/ceph-csi deploy/rbd/kubernetes/csi-rbdplugin-provisioner.yaml.
        Manifest {
            source: "ceph-csi rbd csi-provisioner",
            role: Some("provisioner"),
            args: &[
                "--csi-address=unix:///csi/csi-provisioner.sock",
                "--v=1",
                "--timeout=150s",
                "--retry-interval-start=500ms",
                "--leader-election=true",
                "--feature-gates=HonorPVReclaimPolicy=true",
                "--prevent-volume-mode-conversion=true",
                "--default-fstype=ext4",
                "--extra-create-metadata=true",
                "--immediate-topology=false",
                "--http-endpoint=10.1.2.3:8090",
            ],
            expect: Runs("provisioner"),
        },
        Manifest {
            source: "ceph-csi rbd csi-attacher",
            role: Some("attacher"),
            args: &[
                "--v=1",
                "--csi-address=/csi/csi-provisioner.sock",
                "--leader-election=true",
                "--retry-interval-start=500ms",
                "--default-fstype=ext4",
                "--http-endpoint=10.1.2.3:8093",
            ],
            expect: Runs("attacher"),
        },
        // kubernetes-sigs/aws-ebs-csi-driver deploy/kubernetes/base/controller.yaml.
        Manifest {
            source: "aws-ebs-csi-driver csi-provisioner",
            role: Some("provisioner"),
            args: &[
                "--csi-address=/var/lib/csi/sockets/pluginproxy/csi.sock",
                "--v=2",
                "--feature-gates=Topology=true",
                "--extra-create-metadata",
                "--leader-election=true",
                "--default-fstype=ext4",
            ],
            expect: Runs("provisioner"),
        },
        Manifest {
            source: "aws-ebs-csi-driver csi-attacher",
            role: Some("attacher"),
            args: &[
                "--csi-address=/var/lib/csi/sockets/pluginproxy/csi.sock",
                "--v=2",
                "--leader-election=true",
            ],
            expect: Runs("attacher"),
        },
        Manifest {
            source: "aws-ebs-csi-driver liveness-probe (nothing to tell the role by)",
            role: Some("liveness-probe"),
            args: &["--csi-address=/csi/csi.sock"],
            expect: Runs("liveness-probe"),
        },
        // kubernetes-sigs/azuredisk-csi-driver deploy/csi-azuredisk-{controller,node}.yaml.
        Manifest {
            source: "azuredisk csi-provisioner",
            role: Some("provisioner"),
            args: &[
                "--feature-gates=Topology=true",
                "--csi-address=/csi/csi.sock",
                "--v=2",
                "--timeout=15s",
                "--leader-election",
                "--worker-threads=40",
                "--extra-create-metadata=true",
                "--strict-topology=true",
            ],
            expect: Runs("provisioner"),
        },
        Manifest {
            source: "azuredisk csi-attacher (Go single-dash flags)",
            role: Some("attacher"),
            args: &[
                "-v=2",
                "-csi-address=/csi/csi.sock",
                "-timeout=600s",
                "-leader-election",
                "-worker-threads=500",
            ],
            expect: Runs("attacher"),
        },
        Manifest {
            source: "azuredisk node liveness-probe",
            role: None,
            args: &[
                "--csi-address=/csi/csi.sock",
                "--probe-timeout=3s",
                "--health-port=29603",
                "--v=2",
            ],
            expect: Runs("liveness-probe"),
        },
        Manifest {
            source: "azuredisk node csi-node-driver-registrar",
            role: None,
            args: &[
                "--csi-address=/csi/csi.sock",
                "--kubelet-registration-path=/var/lib/kubelet/plugins/disk.csi.azure.com/csi.sock",
                "--v=2",
            ],
            expect: Runs("registrar"),
        },
    ]
}

#[test]
fn the_argument_sets_of_real_manifests_parse_and_start() {
    let sets = manifests();
    // docs/sidecars.md counts them: an entry dropped by mistake shows here.
    assert_eq!(sets.len(), 19, "{} sets", sets.len());
    for m in sets {
        let mut argv: Vec<OsString> = vec!["csiops-sidecar".into()];
        argv.extend(m.role.map(OsString::from));
        argv.extend(m.args.iter().map(OsString::from));
        let parsed = cli::parse_from(argv)
            .unwrap_or_else(|e| panic!("{} ({HP} et al.): refused:\n{e}", m.source));
        let role = match &parsed.cli.role {
            cli::Role::Registrar(_) => "registrar",
            cli::Role::LivenessProbe(_) => "liveness-probe",
            cli::Role::Provisioner(_) => "provisioner",
            cli::Role::Attacher(_) => "attacher",
        };
        if m.role.is_none() {
            assert_eq!(
                parsed.inferred.as_ref().map(|i| i.role),
                Some(role),
                "{}",
                m.source
            );
        }
        match (&m.expect, parsed.cli.role.check()) {
            (Expect::Runs(want), Ok(())) => assert_eq!(role, *want, "{}", m.source),
            (want, got) => panic!("{}: expected {want:?}, got {got:?}", m.source),
        }
    }
}

/// The registrar's old `--mode=kubelet-registration-probe` exits 0 at once,
/// as upstream, without a driver; `--version` prints and exits 0.
#[test]
fn the_binary_exits_zero_for_the_probe_mode_and_version() {
    let bin = env!("CARGO_BIN_EXE_csiops-sidecar");
    let out = std::process::Command::new(bin)
        .args([
            "-kubelet-registration-path=/var/lib/kubelet/plugins/x/csi.sock",
            "-mode",
            "kubelet-registration-probe",
            "-csi-address=/nonexistent/csi.sock",
        ])
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for args in [&["-version"][..], &["registrar", "--version"]] {
        let out = std::process::Command::new(bin)
            .args(args)
            .output()
            .expect("runs");
        assert!(out.status.success(), "{args:?}: {:?}", out.status);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(env!("CARGO_PKG_VERSION")), "{args:?}: {text}");
    }
}
