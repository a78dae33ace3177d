//! Whether the shipped admission policies are in force, looked at every
//! `--admission-check-seconds`: two lists of a handful of objects, so a poll costs less
//! than a watch's reconnects would. The judgement is
//! `policy::presence::differences`; a change of it wakes every object, so
//! each status says it within one interval.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::api::ListParams;
use kube::{Api, Client};
use tracing::warn;

use crate::install;
use crate::policy::presence;
use csiops_runtime::chain;

/// What differs from the shipped policies, as last seen (empty before the
/// first look and when all are in force).
#[derive(Clone, Debug, Default)]
pub struct Admission(Arc<Mutex<Vec<String>>>);

impl Admission {
    pub fn differences(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Records `now`; whether it differs from what was recorded.
    fn record(&self, now: Vec<String>) -> bool {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let changed = *seen != now;
        *seen = now;
        changed
    }
}

/// Starts looking every `interval` (lazily: nothing runs until the stream
/// is polled); with no interval (`--admission-check=false`) never looks,
/// and nothing is reported. The stream yields once each time the
/// differences change.
pub fn start(
    client: &Client,
    interval: Option<Duration>,
) -> (Admission, impl Stream<Item = ()> + Send + 'static) {
    let admission = Admission::default();
    let Some(interval) = interval else {
        return (admission, futures::stream::pending::<()>().left_stream());
    };
    let shipped = install::objects().policies;
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let state = admission.clone();
    // The first look is at once; a change (from "all in force", the
    // starting record) is yielded, sameness is not. A failed read counts
    // only when the one before failed too (as ReadFailed does): one API
    // server blip does not turn every object Degraded.
    let changes = futures::stream::unfold((true, 0u32), move |(mut first, mut failed)| {
        let (state, shipped, policies, bindings) = (
            state.clone(),
            shipped.clone(),
            policies.clone(),
            bindings.clone(),
        );
        async move {
            loop {
                if !first {
                    tokio::time::sleep(interval).await;
                }
                first = false;
                let now = match look(&shipped, &policies, &bindings).await {
                    Ok(now) => {
                        failed = 0;
                        now
                    }
                    Err(e) => {
                        failed += 1;
                        if failed < 2 {
                            continue;
                        }
                        vec![e]
                    }
                };
                if state.record(now.clone()) {
                    if !now.is_empty() {
                        warn!(differences = ?now, "admission policies not in force");
                    }
                    return Some(((), (false, failed)));
                }
            }
        }
    });
    (admission, changes.right_stream())
}

async fn look(
    shipped: &[(ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding)],
    policies: &Api<ValidatingAdmissionPolicy>,
    bindings: &Api<ValidatingAdmissionPolicyBinding>,
) -> Result<Vec<String>, String> {
    let lp = ListParams::default();
    match (policies.list(&lp).await, bindings.list(&lp).await) {
        (Ok(p), Ok(b)) => Ok(presence::differences(shipped, &p.items, &b.items)),
        (Err(e), _) | (_, Err(e)) => Err(format!(
            "the admission policies could not be read twice in a row, so nothing says they are in force: {}",
            chain(&e)
        )),
    }
}
