//! A short-lived memory of access verdicts, so that a scraper polling every
//! few seconds costs two API calls (TokenReview, SubjectAccessReview) per
//! minute, not per scrape — what kube-rbac-proxy and controller-runtime's
//! metrics filter do with the API server's delegating authenticator and
//! authorizer caches.
//!
//! Keys are SHA-256 digests of the bearer token: the map never holds a
//! token, so nothing dumped from it (a debug print, a core file's map pages)
//! can be replayed. Pure: the caller passes the clock.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The outcome of checking one caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Authenticated and allowed to `get` the metrics path: 200.
    Allowed,
    /// No token, or the API server does not accept it: 401.
    Unauthenticated,
    /// A valid identity without the permission: 403.
    Forbidden,
}

/// How long a verdict is trusted. An allow lasts longer than a denial so
/// that a just-granted scraper is let in soon, while a revoked one is shut
/// out within [`ALLOWED_TTL`] (controller-runtime: 5 min allow, 30 s deny;
/// ours is stricter on revocation).
pub const ALLOWED_TTL: Duration = Duration::from_secs(60);
/// See [`ALLOWED_TTL`]. Also bounds how often a scraper with a bad or
/// unauthorized token makes us call the API server.
pub const DENIED_TTL: Duration = Duration::from_secs(10);
/// Most verdicts kept: beyond it expired ones are dropped, and if none has
/// expired the memory starts over. Bounds what a caller spraying random
/// tokens can make us hold.
pub const MAX_ENTRIES: usize = 1024;

/// The SHA-256 of a token, the key of its verdict.
pub type TokenDigest = [u8; 32];

/// The digest of `token`.
pub fn digest(token: &str) -> TokenDigest {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Verdicts by token digest, each with its expiry.
#[derive(Debug, Default)]
pub struct Verdicts {
    entries: HashMap<TokenDigest, (Verdict, Instant)>,
}

impl Verdicts {
    /// The verdict on `key` if it has not expired at `now`.
    pub fn get(&self, key: &TokenDigest, now: Instant) -> Option<Verdict> {
        self.entries
            .get(key)
            .filter(|(_, expires)| *expires > now)
            .map(|(v, _)| *v)
    }

    /// Remembers `verdict` for `key` from `now` for its TTL.
    pub fn insert(&mut self, key: TokenDigest, verdict: Verdict, now: Instant) {
        if self.entries.len() >= MAX_ENTRIES && !self.entries.contains_key(&key) {
            self.entries.retain(|_, (_, expires)| *expires > now);
            if self.entries.len() >= MAX_ENTRIES {
                self.entries.clear();
            }
        }
        let ttl = match verdict {
            Verdict::Allowed => ALLOWED_TTL,
            Verdict::Unauthenticated | Verdict::Forbidden => DENIED_TTL,
        };
        self.entries.insert(key, (verdict, now + ttl));
    }

    /// How many verdicts are held (expired ones included until pruned).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_expire_after_their_ttl() {
        let t0 = Instant::now();
        let mut v = Verdicts::default();
        let (a, b) = (digest("allowed"), digest("denied"));
        v.insert(a, Verdict::Allowed, t0);
        v.insert(b, Verdict::Forbidden, t0);
        assert_eq!(v.get(&a, t0), Some(Verdict::Allowed));
        assert_eq!(v.get(&b, t0 + DENIED_TTL / 2), Some(Verdict::Forbidden));
        // A denial is asked again sooner than an allow.
        assert_eq!(v.get(&b, t0 + DENIED_TTL), None);
        assert_eq!(v.get(&a, t0 + DENIED_TTL), Some(Verdict::Allowed));
        assert_eq!(v.get(&a, t0 + ALLOWED_TTL), None);
        assert_eq!(v.get(&digest("other"), t0), None);
    }

    #[test]
    fn the_memory_is_bounded() {
        let t0 = Instant::now();
        let mut v = Verdicts::default();
        for i in 0..MAX_ENTRIES {
            v.insert(digest(&i.to_string()), Verdict::Unauthenticated, t0);
        }
        assert_eq!(v.len(), MAX_ENTRIES);
        // Expired ones make room first.
        let later = t0 + DENIED_TTL;
        v.insert(digest("new"), Verdict::Allowed, later);
        assert_eq!(v.len(), 1);
        assert_eq!(v.get(&digest("new"), later), Some(Verdict::Allowed));
        // None expired: it starts over rather than grow.
        for i in 0..MAX_ENTRIES {
            v.insert(digest(&format!("x{i}")), Verdict::Forbidden, later);
        }
        assert!(v.len() <= MAX_ENTRIES, "{}", v.len());
    }

    #[test]
    fn keys_are_digests_not_tokens() {
        assert_ne!(digest("a"), digest("b"));
        assert_eq!(digest("a"), digest("a"));
        let d = digest("secret-token");
        assert!(!d.windows(6).any(|w| w == b"secret"));
    }
}
