//! Which volume names a task is working on, so a claim sync and the sweep
//! never act on the same intent at once.

use std::collections::HashSet;
use std::sync::Mutex;

/// Volume names some task works on right now (a claim sync, or the sweep):
/// at most one at a time per name.
#[derive(Default)]
pub struct Holds {
    names: Mutex<HashSet<String>>,
}

/// Releases its name when dropped.
pub struct Hold<'a> {
    holds: &'a Holds,
    name: String,
}

impl Holds {
    /// `None` when someone else holds `name`.
    pub fn take(&self, name: &str) -> Option<Hold<'_>> {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        names.insert(name.to_string()).then(|| Hold {
            holds: self,
            name: name.to_string(),
        })
    }

    pub fn is_held(&self, name: &str) -> bool {
        self.names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(name)
    }
}

impl Hold<'_> {
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.holds
            .names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.name);
    }
}
