//! The attacher's finalizer name, as upstream spells it, so a cluster can
//! switch between upstream external-attacher and ours without orphaning
//! finalizers: `external-attacher/<driver name with every character outside
//! [a-zA-Z0-9-] replaced by '-'>`, with an `X` appended when that ends in '-'
//! (a finalizer's name part must not end with '-').

/// `external-attacher/<sanitised driver>`.
pub fn finalizer_name(driver: &str) -> String {
    format!(
        "external-attacher/{}",
        crate::common::controller::sanitize_name(driver)
    )
}

/// Whether `finalizers` (an object's `metadata.finalizers`) holds `name`.
pub fn has(finalizers: Option<&Vec<String>>, name: &str) -> bool {
    finalizers.is_some_and(|f| f.iter().any(|x| x == name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_upstream() {
        let cases = [
            (
                "hostpath.csi.k8s.io",
                "external-attacher/hostpath-csi-k8s-io",
            ),
            (
                "test.csi.csiops.dev",
                "external-attacher/test-csi-csiops-dev",
            ),
            ("csi/dummy", "external-attacher/csi-dummy"),
            ("a_b-c", "external-attacher/a-b-c"),
            ("ebs.csi.aws.com.", "external-attacher/ebs-csi-aws-com-X"),
            ("plain", "external-attacher/plain"),
            ("ünï", "external-attacher/-n-X"),
        ];
        for (driver, want) in cases {
            assert_eq!(finalizer_name(driver), want, "{driver}");
        }
    }

    #[test]
    fn has_looks_for_the_exact_name() {
        let f = vec!["kubernetes.io/pv-protection".to_string(), "x/y".to_string()];
        assert!(has(Some(&f), "x/y"));
        assert!(!has(Some(&f), "x/"));
        assert!(!has(None, "x/y"));
    }
}
