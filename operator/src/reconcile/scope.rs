//! `--watch-namespaces`: the namespaces whose CSIDriverDeployments the
//! operator acts on. A cluster admin lists the namespaces drivers may live
//! in; an object anywhere else is left alone (not rendered, not written,
//! and no rival of an allowed one for its driver name).

use std::collections::BTreeSet;

/// Where the operator acts: everywhere, or the listed namespaces.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Namespaces(Option<BTreeSet<String>>);

impl Namespaces {
    /// From the flag's values; none (or only empty ones): every namespace.
    pub fn from_list<I, S>(names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let set: BTreeSet<String> = names
            .into_iter()
            .map(|n| n.as_ref().trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        Namespaces((!set.is_empty()).then_some(set))
    }

    /// Whether objects in `namespace` are acted on.
    pub fn allows(&self, namespace: &str) -> bool {
        self.0.as_ref().is_none_or(|set| set.contains(namespace))
    }

    /// The list, for logs (`None`: every namespace).
    pub fn listed(&self) -> Option<Vec<&str>> {
        self.0
            .as_ref()
            .map(|s| s.iter().map(String::as_str).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_list_is_every_namespace_and_a_list_is_exactly_those() {
        let all = Namespaces::from_list(Vec::<String>::new());
        assert!(all.allows("anything"));
        assert!(Namespaces::from_list([" ", ""]).allows("x"));
        let some = Namespaces::from_list(["storage", " csi-hostpath "]);
        assert!(some.allows("storage") && some.allows("csi-hostpath"));
        assert!(!some.allows("team-a"));
        assert_eq!(some.listed(), Some(vec!["csi-hostpath", "storage"]));
    }
}
