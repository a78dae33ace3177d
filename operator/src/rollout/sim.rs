//! A small simulated cluster for the rollout tests: nodes one by one (each
//! may be lost and come back), a DaemonSet controller that rolls within its
//! `maxUnavailable`, and a StatefulSet controller with ordinals, a rolling
//! `partition` and one change per tick. The operator's plan runs between
//! ticks, so it acts on every intermediate state, and the invariants are
//! checked after every action and every tick.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::fleet::{Fleet, Lost, LostReason};

pub const NODES: usize = 3;

pub fn t0() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-21T10:00:00Z")
        .map(|t| t.with_timezone(&Utc))
        .expect("fixed time parses")
}

pub fn desired(n: &str, c: &str) -> Desired {
    Desired {
        node_hash: n.into(),
        controller_hash: c.into(),
        controller: true,
        registration_required: true,
        step_timeout: Duration::seconds(600),
        paused: false,
        ever_completed: false,
        strategy: RolloutStrategy::NonDisruptive,
        controller_replicas: 1,
        controller_kind: ControllerKind::StatefulSet,
    }
}

/// A node-local target (no controller workload) of node hash `n`.
pub fn node_local(n: &str) -> Desired {
    Desired {
        controller_hash: String::new(),
        controller: false,
        ..desired(n, "")
    }
}

/// An upgrade target: `desired` after a first completed rollout.
pub fn upgrade(n: &str, c: &str) -> Desired {
    Desired {
        ever_completed: true,
        ..desired(n, c)
    }
}

#[derive(Clone, Debug)]
pub struct CtrlPod {
    pub rev: String,
    pub ready: bool,
}

/// The controller StatefulSet (or Deployment: same model, no partition).
#[derive(Clone, Debug, Default)]
pub struct Ctrl {
    pub hash: String,
    pub generation: i64,
    pub observed_generation: i64,
    pub spec_replicas: i32,
    pub partition: i32,
    /// The revision of the pods before the current roll.
    pub current_rev: String,
    /// By ordinal.
    pub pods: Vec<Option<CtrlPod>>,
}

impl Ctrl {
    fn ready(&self) -> i32 {
        self.pods.iter().flatten().filter(|p| p.ready).count() as i32
    }
}

#[derive(Clone, Debug)]
pub struct SimNode {
    pub name: String,
    pub lost: bool,
    /// The node pod's template generation and readiness.
    pub pod: Option<(i64, bool)>,
    pub registered: bool,
}

#[derive(Clone, Debug, Default)]
pub struct Ds {
    pub hash: String,
    pub generation: i64,
    pub observed_generation: i64,
    pub template_generation: i64,
    pub max_unavailable: i32,
    /// The hash of each template generation.
    pub hashes: BTreeMap<i64, String>,
}

/// The simulated cluster and what the operator persisted.
pub struct Sim {
    pub ds: Option<Ds>,
    pub nodes: Vec<SimNode>,
    pub ctrl: Option<Ctrl>,
    /// A controller workload of the other kind exists, with this many pods.
    pub stale: bool,
    pub stale_pods: usize,
    pub cluster_scoped_remaining: usize,
    /// controller hash -> node hash it was rendered with.
    pub pairs: BTreeMap<String, String>,
    /// Every action in the order the reconciler would run it.
    pub log: Vec<Action>,
    pub rollout: Option<RolloutStatus>,
    pub completed: usize,
    /// Set once the driver serves: from then on, under `NonDisruptive`, a
    /// Ready controller replica must exist after every action and tick.
    pub must_serve: bool,
    /// The fewest Ready controller replicas seen while `must_serve`.
    pub min_ready: i32,
    pub strategy: RolloutStrategy,
    /// Controller pods of this revision never become Ready (a broken image).
    pub broken_rev: Option<String>,
    /// Node hashes rendered without a controller (topology NodeLocal): their
    /// node pods run a provisioner each.
    pub node_local: BTreeSet<String>,
}

impl Default for Sim {
    fn default() -> Self {
        Sim {
            ds: None,
            nodes: (0..NODES)
                .map(|i| SimNode {
                    name: format!("node-{i}"),
                    lost: false,
                    pod: None,
                    registered: false,
                })
                .collect(),
            ctrl: None,
            stale: false,
            stale_pods: 0,
            cluster_scoped_remaining: 0,
            pairs: BTreeMap::new(),
            log: Vec::new(),
            rollout: None,
            completed: 0,
            must_serve: false,
            min_ready: i32::MAX,
            strategy: RolloutStrategy::NonDisruptive,
            broken_rev: None,
            node_local: BTreeSet::new(),
        }
    }
}

impl Sim {
    pub fn with_nodes(n: usize) -> Sim {
        Sim {
            nodes: (0..n)
                .map(|i| SimNode {
                    name: format!("node-{i:03}"),
                    lost: false,
                    pod: None,
                    registered: false,
                })
                .collect(),
            ..Sim::default()
        }
    }

    /// What the operator observes, for `d`'s node hash.
    pub fn observed(&self, d: &Desired) -> Observed {
        let controller = self.ctrl.as_ref().map(|c| ControllerObs {
            hash: Some(c.hash.clone()),
            generation: c.generation,
            observed_generation: c.observed_generation,
            spec_replicas: c.spec_replicas,
            replicas: c.pods.iter().flatten().count() as i32,
            ready: c.ready(),
            updated: c.pods.iter().flatten().filter(|p| p.rev == c.hash).count() as i32,
            partition: c.partition,
            updated_ready: c
                .pods
                .iter()
                .flatten()
                .filter(|p| p.rev == c.hash && p.ready)
                .count() as i32,
        });
        let node = self.ds.as_ref().map(|ds| NodeObs {
            hash: Some(ds.hash.clone()),
            generation: ds.generation,
            observed_generation: ds.observed_generation,
        });
        Observed {
            controller,
            stale_controller: self.stale,
            controller_pods: self
                .ctrl
                .as_ref()
                .map_or(0, |c| c.pods.iter().flatten().count())
                + self.stale_pods,
            node,
            node_pods: self.nodes.iter().filter(|n| n.pod.is_some()).count(),
            fleet: self.fleet(d),
            cluster_scoped_remaining: self.cluster_scoped_remaining,
        }
    }

    fn fleet(&self, d: &Desired) -> Fleet {
        let Some(ds) = &self.ds else {
            return Fleet::default();
        };
        let current_ds = ds.hash == d.node_hash && ds.observed_generation >= ds.generation;
        let mut f = Fleet {
            daemonset_current: current_ds,
            ..Fleet::default()
        };
        for n in &self.nodes {
            let current = current_ds && n.pod.is_some_and(|(g, _)| g == ds.template_generation);
            let ready = n.pod.is_some_and(|(_, r)| r);
            if n.lost {
                f.lost.push(Lost {
                    node: n.name.clone(),
                    reason: LostReason::Unreachable,
                    since: None,
                    pod: n.pod.map(|_| format!("{}-pod", n.name)),
                    current,
                });
                continue;
            }
            f.ready += i32::from(ready);
            f.updated += i32::from(current);
            f.available += i32::from(current && ready);
            f.registered += i32::from(n.registered && n.pod.is_some());
            let why = if n.pod.is_none() {
                Some("its pod is being replaced")
            } else if !current {
                Some("runs the previous node pod")
            } else if !ready {
                Some("its node pod is not Ready")
            } else if d.registration_required && !n.registered {
                Some("the driver is not registered in its CSINode")
            } else {
                None
            };
            if let Some(why) = why {
                f.pending.push((n.name.clone(), why));
                f.rolling += i32::from(!current);
            }
        }
        f.desired = self.nodes.len() as i32;
        f
    }

    pub fn run(&mut self, d: &Desired, now: DateTime<Utc>) -> Plan {
        self.pairs
            .insert(d.controller_hash.clone(), d.node_hash.clone());
        self.strategy = d.strategy;
        if !d.controller {
            self.node_local.insert(d.node_hash.clone());
            // No controller is wanted: none must serve.
            self.must_serve = false;
        }
        let p = plan(d, &self.observed(d), self.rollout.as_ref(), now);
        for a in &p.actions {
            self.apply(*a, d);
        }
        self.rollout = p.rollout.clone();
        if p.completed {
            self.completed += 1;
            if d.strategy == RolloutStrategy::NonDisruptive && d.controller {
                self.must_serve = true;
            }
        }
        p
    }

    fn apply(&mut self, a: Action, d: &Desired) {
        self.log.push(a);
        match a {
            Action::ApplyNode => {
                let ds = self.ds.get_or_insert_with(|| Ds {
                    max_unavailable: 1,
                    ..Ds::default()
                });
                if ds.hash != d.node_hash {
                    ds.hash = d.node_hash.clone();
                    ds.generation += 1;
                    ds.template_generation += 1;
                    ds.hashes
                        .insert(ds.template_generation, d.node_hash.clone());
                }
            }
            Action::ApplyController => self.apply_controller(d, d.controller_replicas, 0),
            Action::ApplyControllerSurge {
                replicas,
                partition,
            } => self.apply_controller(d, replicas, partition),
            Action::ScaleControllerToZero => {
                if let Some(c) = &mut self.ctrl {
                    if c.spec_replicas != 0 {
                        c.spec_replicas = 0;
                        c.generation += 1;
                    }
                }
            }
            Action::DeleteStaleController => self.stale = false,
            Action::DeleteController => {
                // Its pods terminate at the next tick, like the other kind's.
                if let Some(c) = self.ctrl.take() {
                    self.stale_pods += c.pods.iter().flatten().count();
                }
            }
        }
        self.check();
    }

    fn apply_controller(&mut self, d: &Desired, replicas: i32, partition: i32) {
        // Switching kinds: the new controller never starts while the old
        // one or any of its pods is still there.
        assert!(!self.stale, "controller applied while the old kind exists");
        assert!(
            self.ctrl.is_some() || self.stale_pods == 0,
            "new controller applied while {} old pod(s) run",
            self.stale_pods
        );
        // The order: a controller's content is only ever applied over the
        // node side it was rendered with, fully rolled on healthy nodes.
        let paired = self.pairs.get(&d.controller_hash).cloned();
        let ds_hash = self.ds.as_ref().map(|ds| ds.hash.clone());
        assert_eq!(
            paired, ds_hash,
            "controller {} applied over node side {:?}",
            d.controller_hash, ds_hash
        );
        let f = self.fleet(d);
        let first_apply = self
            .ctrl
            .as_ref()
            .is_none_or(|c| c.hash != d.controller_hash);
        assert!(
            !first_apply || !f.is_rolling(),
            "controller {} first applied while nodes run a previous node pod: {:?}",
            d.controller_hash,
            f.pending
        );
        let c = self.ctrl.get_or_insert_with(Ctrl::default);
        if c.hash != d.controller_hash || c.spec_replicas != replicas || c.partition != partition {
            if c.hash != d.controller_hash && c.pods.iter().flatten().all(|p| p.rev == c.hash) {
                c.current_rev = c.hash.clone();
            }
            c.hash = d.controller_hash.clone();
            c.spec_replicas = replicas;
            c.partition = partition;
            c.generation += 1;
        }
    }

    /// Controller pods that exist, terminating ones included.
    fn controller_pod_count(&self) -> usize {
        self.ctrl
            .as_ref()
            .map_or(0, |c| c.pods.iter().flatten().count())
            + self.stale_pods
    }

    /// Healthy nodes running a node-local pod (a provisioner of their own).
    fn node_local_pods(&self) -> Vec<String> {
        let Some(ds) = &self.ds else {
            return Vec::new();
        };
        self.nodes
            .iter()
            .filter(|n| !n.lost)
            .filter(|n| {
                n.pod
                    .and_then(|(g, _)| ds.hashes.get(&g))
                    .is_some_and(|h| self.node_local.contains(h))
            })
            .map(|n| n.name.clone())
            .collect()
    }

    /// The invariant of topology switches, judged when a pod starts: a
    /// controller's provisioner never starts beside a healthy node's
    /// node-local provisioner, nor one of those beside a controller pod.
    /// (A lost node that returns with its old pod is not a start: nobody
    /// could replace that pod while it was away.)
    fn check_start(&self, what: &str) {
        let controller = self.controller_pod_count();
        let node_local = self.node_local_pods();
        assert!(
            controller == 0 || node_local.is_empty(),
            "{what} started while {controller} controller pod(s) run beside node-local pods on {node_local:?}; last actions {:?}",
            &self.log[self.log.len().saturating_sub(8)..]
        );
    }

    /// One step of the cluster's controllers.
    pub fn tick(&mut self) {
        let node_local_before = self.node_local_pods();
        if let Some(ds) = &mut self.ds {
            ds.observed_generation = ds.generation;
            let template = ds.template_generation;
            let budget = ds.max_unavailable.max(1);
            let mut unavailable = self
                .nodes
                .iter()
                .filter(|n| !n.lost && !n.pod.is_some_and(|(_, r)| r))
                .count() as i32;
            for n in self.nodes.iter_mut().filter(|n| !n.lost) {
                match n.pod {
                    None => n.pod = Some((template, false)),
                    Some((g, false)) => {
                        n.pod = Some((g, true));
                        n.registered = true;
                    }
                    Some((g, true)) if g != template && unavailable < budget => {
                        n.pod = None;
                        unavailable += 1;
                    }
                    Some(_) => {}
                }
            }
        } else {
            for n in &mut self.nodes {
                if !n.lost {
                    n.pod = None;
                }
            }
        }
        let mut created_controller_pod = false;
        let broken = self.broken_rev.clone();
        if let Some(c) = &mut self.ctrl {
            c.observed_generation = c.generation;
            let want = c.spec_replicas.max(0) as usize;
            c.pods.truncate(want);
            c.pods.resize(want, None);
            // Parallel pod management: every missing pod is created at once.
            let mut changed = false;
            for (ordinal, slot) in c.pods.iter_mut().enumerate() {
                match slot {
                    None => {
                        let rev = if ordinal as i32 >= c.partition {
                            c.hash.clone()
                        } else {
                            c.current_rev.clone()
                        };
                        *slot = Some(CtrlPod { rev, ready: false });
                        changed = true;
                        created_controller_pod = true;
                    }
                    Some(p) if !p.ready && broken.as_deref() != Some(p.rev.as_str()) => {
                        p.ready = true;
                        changed = true;
                    }
                    Some(_) => {}
                }
            }
            // Rolling update: one outdated pod at or above the partition,
            // highest ordinal first, once all are Ready.
            if !changed {
                let outdated = c
                    .pods
                    .iter()
                    .enumerate()
                    .rev()
                    .find(|(o, p)| {
                        *o as i32 >= c.partition && p.as_ref().is_some_and(|p| p.rev != c.hash)
                    })
                    .map(|(o, _)| o);
                if let Some(o) = outdated {
                    c.pods[o] = None;
                } else if c.partition == 0 {
                    c.current_rev = c.hash.clone();
                }
            }
        }
        if !self.stale {
            self.stale_pods = 0;
        }
        let started_node_local = self
            .node_local_pods()
            .into_iter()
            .any(|n| !node_local_before.contains(&n));
        if started_node_local {
            self.check_start("a node-local pod");
        }
        if created_controller_pod {
            self.check_start("a controller pod");
        }
        self.check();
    }

    /// Ticks until nothing changes any more.
    pub fn settle(&mut self) {
        for _ in 0..200 {
            let before = format!("{:?}{:?}", self.nodes, self.ctrl);
            self.tick();
            if before == format!("{:?}{:?}", self.nodes, self.ctrl) {
                return;
            }
        }
        panic!("cluster never settled");
    }

    /// The invariants.
    fn check(&mut self) {
        if self.must_serve && self.strategy == RolloutStrategy::NonDisruptive {
            let ready = self.ctrl.as_ref().map_or(0, Ctrl::ready);
            self.min_ready = self.min_ready.min(ready);
            assert!(ready >= 1, "no Ready controller replica: {:?}", self.ctrl);
        }
        if self.strategy == RolloutStrategy::StopController {
            // A running controller is only ever the one rendered with the
            // live node side.
            if let (Some(c), Some(ds)) = (&self.ctrl, &self.ds) {
                for p in c.pods.iter().flatten() {
                    let pair = self.pairs.get(&p.rev);
                    assert_eq!(
                        pair,
                        Some(&ds.hash),
                        "controller {} runs over node side {}; rollout {:?}; last actions {:?}",
                        p.rev,
                        ds.hash,
                        self.rollout,
                        &self.log[self.log.len().saturating_sub(8)..]
                    );
                }
            }
        }
    }

    /// Plans and ticks until the rollout is done.
    pub fn drive(&mut self, d: &Desired, now: DateTime<Utc>) {
        for _ in 0..200 {
            let p = self.run(d, now);
            if p.rollout.is_none() {
                return;
            }
            self.tick();
        }
        panic!("rollout did not finish: {:?}", self.rollout);
    }

    pub fn installed(d: &Desired) -> Sim {
        let mut sim = Sim::default();
        sim.drive(d, t0());
        sim.settle();
        sim.log.clear();
        sim
    }

    pub fn ctrl_hash(&self) -> Option<&str> {
        self.ctrl.as_ref().map(|c| c.hash.as_str())
    }

    pub fn ds_hash(&self) -> Option<&str> {
        self.ds.as_ref().map(|d| d.hash.as_str())
    }
}

pub fn first(log: &[Action], a: Action) -> usize {
    log.iter()
        .position(|x| *x == a)
        .unwrap_or_else(|| panic!("{a:?} never happened in {log:?}"))
}

pub fn first_surge(log: &[Action]) -> Option<usize> {
    log.iter()
        .position(|x| matches!(x, Action::ApplyControllerSurge { .. }))
}
