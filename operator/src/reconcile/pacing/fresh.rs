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

/// The resourceVersion of an object known to be current (kept with the
/// object's other state).
#[derive(Debug, Default)]
pub struct Freshness(Option<String>);

impl Freshness {
    /// `version` is the object's resourceVersion as of a write or read of
    /// it that came after all of the operator's writes (`None`: unknown).
    pub fn note(&mut self, version: Option<&str>) {
        self.0 = version.map(str::to_string);
    }

    /// Whether a copy of the object at `version` is current.
    pub fn is_current(&self, version: Option<&str>) -> bool {
        version.is_some() && self.0.as_deref() == version
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_noted_version_is_current() {
        let mut f = Freshness::default();
        assert!(!f.is_current(Some("5")), "nothing noted: read it");
        f.note(Some("7"));
        assert!(f.is_current(Some("7")));
        // The cache behind the operator's write, or someone's edit after it.
        assert!(!f.is_current(Some("6")));
        assert!(!f.is_current(Some("8")));
        assert!(!f.is_current(None));
        let b = Freshness::default();
        assert!(!b.is_current(Some("7")), "per object");
        f.note(None);
        assert!(!f.is_current(Some("7")));
    }
}
