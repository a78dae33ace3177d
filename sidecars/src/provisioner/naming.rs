//! Volume and PersistentVolume names.
//!
//! The CreateVolume name and the PV name are the same string,
//! `<--volume-name-prefix>-<PVC UID>`: deterministic per claim, so a retried
//! CreateVolume is idempotent on the driver's side and a PV that already
//! exists is found by name.
//!
//! `--volume-name-uuid-length` (default -1, "NOT truncate") keeps only the
//! first N characters of the UID; like upstream, the dashes are removed before
//! truncating (`pvc-` + `9f3b1c2a` for N = 8, not `9f3b1c2a-...`).

/// `--volume-name-prefix` default.
pub const DEFAULT_VOLUME_NAME_PREFIX: &str = "pvc";

/// `--volume-name-uuid-length` default: keep the whole UID, dashes included.
pub const UUID_LENGTH_WHOLE: i64 = -1;

/// Why no name can be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamingError {
    #[error("--volume-name-prefix must not be empty")]
    EmptyPrefix,
    #[error("--volume-name-uuid-length must be -1 (whole UID) or a positive length, got {0}")]
    UuidLength(i64),
    #[error("PersistentVolumeClaim has no UID")]
    NoUid,
    #[error("volume name {0:?} is not a valid PersistentVolume name (DNS-1123 subdomain)")]
    InvalidName(String),
}

/// How names are made, from the two flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeNamer {
    prefix: String,
    uuid_length: Option<usize>,
}

impl Default for VolumeNamer {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_VOLUME_NAME_PREFIX.to_string(),
            uuid_length: None,
        }
    }
}

impl VolumeNamer {
    /// From `--volume-name-prefix` and `--volume-name-uuid-length`.
    ///
    /// Upstream rejects an empty prefix. A length of 0 (every claim would get
    /// the same name `pvc-`) and lengths below -1 are rejected here too.
    pub fn new(prefix: &str, uuid_length: i64) -> Result<Self, NamingError> {
        if prefix.is_empty() {
            return Err(NamingError::EmptyPrefix);
        }
        let uuid_length = match uuid_length {
            UUID_LENGTH_WHOLE => None,
            n if n > 0 => Some(usize::try_from(n).map_err(|_| NamingError::UuidLength(n))?),
            n => return Err(NamingError::UuidLength(n)),
        };
        Ok(Self {
            prefix: prefix.to_string(),
            uuid_length,
        })
    }

    /// The CreateVolume name for a claim with this UID; the PV gets the same
    /// name ([`Self::pv_name`]).
    pub fn volume_name(&self, pvc_uid: &str) -> Result<String, NamingError> {
        if pvc_uid.is_empty() {
            return Err(NamingError::NoUid);
        }
        let name = match self.uuid_length {
            None => format!("{}-{}", self.prefix, pvc_uid),
            Some(n) => {
                // Upstream slices `[0:n]` and would panic past the end; a
                // length longer than the UID keeps all of it instead.
                let short: String = pvc_uid.chars().filter(|c| *c != '-').take(n).collect();
                format!("{}-{}", self.prefix, short)
            }
        };
        if !is_dns1123_subdomain(&name) {
            return Err(NamingError::InvalidName(name));
        }
        Ok(name)
    }

    /// The PersistentVolume name: the volume name (upstream names both alike).
    pub fn pv_name(&self, pvc_uid: &str) -> Result<String, NamingError> {
        self.volume_name(pvc_uid)
    }
}

fn is_label_body(label: &str) -> bool {
    let bytes = label.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            alnum(first) && alnum(last) && bytes.iter().all(|b| alnum(b) || *b == b'-')
        }
        _ => false,
    }
}

/// `IsDNS1123Label`: at most 63 of `[a-z0-9-]`, alphanumeric at both ends
/// (what a namespace name must be).
pub fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && is_label_body(s)
}

/// `IsDNS1123Subdomain`: at most 253 characters, dot-separated labels
/// (what a Secret or PersistentVolume name must be).
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_label_body)
}

/// FNV-1a, 32 bit (Go's `hash/fnv.New32a`).
fn fnv1a_32(data: &[u8]) -> u32 {
    data.iter().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// The first `n` bytes of `s`, or fewer to stay on a character boundary
/// (the names joined here are ASCII; this only keeps a stray one from
/// panicking).
fn head(s: &str, n: usize) -> &str {
    let mut end = n.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `<base>-<suffix>` in at most `max` bytes, deterministically, as upstream
/// external-provisioner's `getNameWithMaxLength` makes the managed-by label
/// of a node's CSIStorageCapacity objects (so ours and upstream's agree):
/// - it fits: `<base>-<suffix>` (just `<suffix>` for an empty base);
/// - else, if the suffix leaves room: `<base cut short>-<hash of base>-<suffix>`,
///   the suffix (the node name) kept whole;
/// - else: `<base cut short>-<hash of base-suffix>`, cut to `max`.
///
/// The hash is FNV-1a (32 bit) in 8 hex digits. Two suffixes that differ
/// only past the cut share a name in the last case: a node name longer than
/// `max` minus the base is astronomically rare.
pub fn bounded_name(base: &str, suffix: &str, max: usize) -> String {
    let name = if base.is_empty() {
        suffix.to_string()
    } else {
        format!("{base}-{suffix}")
    };
    if name.len() <= max {
        return name;
    }
    let hash = |s: &str| format!("{:08x}", fnv1a_32(s.as_bytes()));
    // 10: the two dashes and the 8 digits around the hash.
    match max.checked_sub(10 + suffix.len()).filter(|n| *n > 0) {
        Some(keep) => format!("{}-{}-{suffix}", head(base, keep), hash(base)),
        None => {
            let prefix = head(base, max.saturating_sub(9));
            let short = if prefix.is_empty() {
                hash(&name)
            } else {
                format!("{prefix}-{}", hash(&name))
            };
            head(&short, max).to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "9f3b1c2a-5d4e-4f60-8a7b-0c1d2e3f4a5b";

    #[test]
    fn names() {
        // (prefix, --volume-name-uuid-length, uid, expected)
        let cases: &[(&str, i64, &str, Result<&str, NamingError>)] = &[
            // README: "Default value is "pvc", i.e. created PersistentVolume
            // objects will have name `pvc-<uuid>`."
            (
                "pvc",
                -1,
                UID,
                Ok("pvc-9f3b1c2a-5d4e-4f60-8a7b-0c1d2e3f4a5b"),
            ),
            (
                "fast",
                -1,
                UID,
                Ok("fast-9f3b1c2a-5d4e-4f60-8a7b-0c1d2e3f4a5b"),
            ),
            // README: "Length of UUID to be added to `--volume-name-prefix`.
            // Default behavior is to NOT truncate the UUID." Upstream removes
            // the dashes before truncating.
            ("pvc", 8, UID, Ok("pvc-9f3b1c2a")),
            ("pvc", 10, UID, Ok("pvc-9f3b1c2a5d")),
            ("pvc", 100, UID, Ok("pvc-9f3b1c2a5d4e4f608a7b0c1d2e3f4a5b")),
            ("pvc", -1, "", Err(NamingError::NoUid)),
            (
                "PVC",
                -1,
                UID,
                Err(NamingError::InvalidName(
                    "PVC-9f3b1c2a-5d4e-4f60-8a7b-0c1d2e3f4a5b".into(),
                )),
            ),
        ];
        for (prefix, len, uid, want) in cases {
            let namer = VolumeNamer::new(prefix, *len).expect("valid flags");
            let got = namer.volume_name(uid);
            assert_eq!(
                got.as_deref().map_err(Clone::clone),
                want.clone(),
                "{prefix} {len} {uid}"
            );
            assert_eq!(namer.pv_name(uid), got, "PV name is the volume name");
        }
    }

    #[test]
    fn flags() {
        let cases: &[(&str, i64, Option<NamingError>)] = &[
            ("pvc", -1, None),
            ("pvc", 1, None),
            ("", -1, Some(NamingError::EmptyPrefix)),
            ("pvc", 0, Some(NamingError::UuidLength(0))),
            ("pvc", -2, Some(NamingError::UuidLength(-2))),
        ];
        for (prefix, len, want) in cases {
            assert_eq!(
                VolumeNamer::new(prefix, *len).err(),
                *want,
                "{prefix:?} {len}"
            );
        }
        assert_eq!(
            VolumeNamer::default(),
            VolumeNamer::new("pvc", -1).expect("defaults")
        );
    }

    #[test]
    fn dns_names() {
        let cases: &[(&str, bool, bool)] = &[
            // (s, label, subdomain)
            ("default", true, true),
            ("kube-system", true, true),
            ("a", true, true),
            ("my.secret", false, true),
            ("-a", false, false),
            ("a-", false, false),
            ("A", false, false),
            ("", false, false),
            ("a..b", false, false),
            ("a_b", false, false),
            (&"a".repeat(63), true, true),
            (&"a".repeat(64), false, true),
            (&"a".repeat(254), false, false),
        ];
        for (s, label, sub) in cases {
            assert_eq!(is_dns1123_label(s), *label, "label {s:?}");
            assert_eq!(is_dns1123_subdomain(s), *sub, "subdomain {s:?}");
        }
    }

    #[test]
    fn bounded_names_are_upstreams() {
        // getNameWithMaxLength's own cases (util_test.go, v6.3.0).
        const EP: &str = "external-provisioner";
        let node = |n: usize| format!("node{}", "a".repeat(n));
        let cases: &[(&str, String, String)] = &[
            (EP, "node01".into(), "external-provisioner-node01".into()),
            ("", "node01".into(), "node01".into()),
            (EP, node(38), format!("{EP}-{}", node(38))),
            (EP, node(39), format!("external-p-53f40b57-{}", node(39))),
            (EP, node(48), format!("e-53f40b57-{}", node(48))),
            (EP, node(49), format!("{EP}-a3607ff1")),
            (EP, node(63), format!("{EP}-df38e37f")),
            ("", node(63), "fa65587e".into()),
        ];
        for (base, suffix, want) in cases {
            let got = bounded_name(base, suffix, 63);
            assert_eq!(&got, want, "{base:?} {suffix:?}");
            assert!(got.len() <= 63, "{got}");
        }
        // A tight limit cuts even the hash.
        assert_eq!(bounded_name("ab", "cdefgh", 5), "3872e");
        assert_eq!(fnv1a_32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a_32(b"a"), 0xe40c_292c);
    }
}
