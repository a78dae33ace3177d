//! Whether every cache has its first complete list: a reconcile judged on a
//! cache still filling would see workloads, pods or nodes as missing (and,
//! say, take every node for lost), so reconciles wait until all are in.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// The caches still waiting for their first complete list.
#[derive(Clone, Debug, Default)]
pub struct SyncGate(Arc<AtomicUsize>);

/// One cache's part of a [`SyncGate`]; marking it twice counts once.
#[derive(Clone, Debug)]
pub struct SyncFlag {
    gate: SyncGate,
    done: Arc<AtomicBool>,
}

impl SyncGate {
    /// A flag for one more cache to wait for.
    pub fn flag(&self) -> SyncFlag {
        self.0.fetch_add(1, Ordering::SeqCst);
        SyncFlag {
            gate: self.clone(),
            done: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Every flag has been marked.
    pub fn ready(&self) -> bool {
        self.0.load(Ordering::SeqCst) == 0
    }
}

impl SyncFlag {
    /// This cache has its first complete list.
    pub fn mark(&self) {
        if !self.done.swap(true, Ordering::SeqCst) {
            self.gate.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_every_flag_is_marked_once() {
        let gate = SyncGate::default();
        assert!(gate.ready(), "nothing to wait for");
        let (a, b) = (gate.flag(), gate.flag());
        a.mark();
        a.mark();
        assert!(!gate.ready(), "b is still filling");
        b.mark();
        assert!(gate.ready());
    }
}
