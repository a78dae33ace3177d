//! Whether the watch's copy of an object is known to be current, so that a
//! reconcile may plan from it without reading the object first.
//!
//! The danger of planning from the watch cache is the operator's own last
//! write: a reconcile woken by, say, its own DaemonSet apply can see the
//! object as it was before its last status write and decide a rollout step
//! twice. So the cached copy is used only when its resourceVersion is the
//! one the operator's last status write returned (or the last read of the
//! object gave), which the cache can only hold once it has seen that write.
//! Anything else (no such version noted yet, the cache behind, someone
//! else's edit after it) reads the object from the API server. So a pass
//! reads only when the object changed since the operator last wrote or read
//! it: a settled object's periodic resync costs no request at all.

use std::collections::HashMap;
use std::sync::Mutex;

/// The resourceVersion known to be current, per object (`namespace/name`).
#[derive(Debug, Default)]
pub struct Freshness(Mutex<HashMap<String, String>>);

impl Freshness {
    /// `version` is the object's resourceVersion as of a write or read of
    /// it that came after all of the operator's writes.
    pub fn note(&self, key: &str, version: Option<&str>) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match version {
            Some(v) => {
                map.insert(key.to_string(), v.to_string());
            }
            None => {
                map.remove(key);
            }
        }
    }

    /// Whether a copy of the object at `version` is current.
    pub fn is_current(&self, key: &str, version: Option<&str>) -> bool {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        version.is_some() && map.get(key).map(String::as_str) == version
    }

    /// Forgets a deleted object.
    pub fn forget(&self, key: &str) {
        self.note(key, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_noted_version_is_current() {
        let f = Freshness::default();
        assert!(!f.is_current("ns/a", Some("5")), "nothing noted: read it");
        f.note("ns/a", Some("7"));
        assert!(f.is_current("ns/a", Some("7")));
        // The cache behind the operator's write, or someone's edit after it.
        assert!(!f.is_current("ns/a", Some("6")));
        assert!(!f.is_current("ns/a", Some("8")));
        assert!(!f.is_current("ns/a", None));
        assert!(!f.is_current("ns/b", Some("7")), "per object");
        f.forget("ns/a");
        assert!(!f.is_current("ns/a", Some("7")));
    }
}
