//! A short-lived memory of access verdicts, so that a scraper polling every
//! few seconds costs two API calls (TokenReview, SubjectAccessReview) per
//! minute, not per scrape — what kube-rbac-proxy and controller-runtime's
//! metrics filter do with the API server's delegating authenticator and
//! authorizer caches.
//!
//! Keys are SHA-256 digests of the bearer token: the map never holds a
//! token, so nothing dumped from it (a debug print, a core file's map pages)
//! can be replayed. Pure: the caller passes the clock.
//!
//! Also here: the [`ReviewBudget`] that bounds how many tokens not yet
//! judged are sent to the API server per second, so a caller spraying
//! random tokens cannot turn the metrics port into a TokenReview flood.

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
/// Most verdicts kept: beyond it expired ones are dropped, then the least
/// recently used. Bounds what a caller spraying random tokens can make us
/// hold; with the [`ReviewBudget`] such a caller adds at most
/// `REVIEWS_PER_SECOND * DENIED_TTL` live entries, far fewer, so a scraper
/// in use is never evicted by it.
pub const MAX_ENTRIES: usize = 1024;
/// How long an expired allow is still remembered as one: its token's next
/// review skips the [`ReviewBudget`], so a caller spraying new tokens
/// cannot keep a scraper in use out once its verdict expires. Only reviews
/// that allowed leave such an entry, so what it exempts is bounded by the
/// scrapers that really exist.
pub const ALLOWED_REMEMBERED: Duration = Duration::from_secs(600);
/// Reviews of tokens not yet judged, per second, sustained…
pub const REVIEWS_PER_SECOND: u32 = 10;
/// …and in a burst (a fleet of scrapers starting together).
pub const REVIEW_BURST: u32 = 20;

/// The SHA-256 of a token, the key of its verdict.
pub type TokenDigest = [u8; 32];

/// The digest of `token`.
pub fn digest(token: &str) -> TokenDigest {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// One remembered verdict.
#[derive(Clone, Copy, Debug)]
struct Entry {
    verdict: Verdict,
    expires: Instant,
    /// When it was last inserted or read: the LRU order.
    used: u64,
}

/// Verdicts by token digest, each with its expiry.
#[derive(Debug, Default)]
pub struct Verdicts {
    entries: HashMap<TokenDigest, Entry>,
    /// A counter, not a clock: orders uses even within one instant.
    tick: u64,
}

impl Verdicts {
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// The verdict on `key` if it has not expired at `now` (a use, for the
    /// LRU order).
    pub fn get(&mut self, key: &TokenDigest, now: Instant) -> Option<Verdict> {
        let tick = self.next_tick();
        let entry = self.entries.get_mut(key).filter(|e| e.expires > now)?;
        entry.used = tick;
        Some(entry.verdict)
    }

    /// Whether `key` was allowed at its last review, however long ago
    /// within [`ALLOWED_REMEMBERED`]: a scraper in use, whose re-review
    /// the budget must not hold up.
    pub fn was_allowed(&self, key: &TokenDigest, now: Instant) -> bool {
        self.entries
            .get(key)
            .is_some_and(|e| e.verdict == Verdict::Allowed && e.expires + ALLOWED_REMEMBERED > now)
    }

    /// Remembers `verdict` for `key` from `now` for its TTL. At capacity,
    /// expired verdicts go first (but allows still remembered, see
    /// [`ALLOWED_REMEMBERED`]), then the least recently used one.
    pub fn insert(&mut self, key: TokenDigest, verdict: Verdict, now: Instant) {
        if self.entries.len() >= MAX_ENTRIES && !self.entries.contains_key(&key) {
            self.entries.retain(|_, e| {
                e.expires > now
                    || (e.verdict == Verdict::Allowed && e.expires + ALLOWED_REMEMBERED > now)
            });
            if self.entries.len() >= MAX_ENTRIES {
                if let Some(oldest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, e)| e.used)
                    .map(|(k, _)| *k)
                {
                    self.entries.remove(&oldest);
                }
            }
        }
        let ttl = match verdict {
            Verdict::Allowed => ALLOWED_TTL,
            Verdict::Unauthenticated | Verdict::Forbidden => DENIED_TTL,
        };
        let used = self.next_tick();
        self.entries.insert(
            key,
            Entry {
                verdict,
                expires: now + ttl,
                used,
            },
        );
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

/// A token bucket for reviews of unjudged tokens: [`REVIEW_BURST`] at
/// once, refilled at [`REVIEWS_PER_SECOND`]. Remembered verdicts cost
/// nothing, so scrapers in use never meet it.
#[derive(Debug)]
pub struct ReviewBudget {
    tokens: f64,
    last: Option<Instant>,
    rate: f64,
    burst: f64,
}

impl Default for ReviewBudget {
    fn default() -> Self {
        Self::new(REVIEWS_PER_SECOND, REVIEW_BURST)
    }
}

impl ReviewBudget {
    pub fn new(per_second: u32, burst: u32) -> Self {
        Self {
            tokens: f64::from(burst),
            last: None,
            rate: f64::from(per_second),
            burst: f64::from(burst),
        }
    }

    /// Takes one review at `now`; `false` when the budget is spent.
    pub fn take(&mut self, now: Instant) -> bool {
        if let Some(last) = self.last {
            let elapsed = now.saturating_duration_since(last).as_secs_f64();
            self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        }
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
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
        // None expired: it never grows past the bound.
        for i in 0..2 * MAX_ENTRIES {
            v.insert(digest(&format!("x{i}")), Verdict::Forbidden, later);
            assert!(v.len() <= MAX_ENTRIES, "{}", v.len());
        }
    }

    #[test]
    fn at_capacity_the_least_recently_used_goes_not_everything() {
        let t0 = Instant::now();
        let mut v = Verdicts::default();
        let scraper = digest("scraper");
        v.insert(scraper, Verdict::Allowed, t0);
        for i in 0..MAX_ENTRIES - 1 {
            v.insert(digest(&format!("spray{i}")), Verdict::Unauthenticated, t0);
        }
        assert_eq!(v.len(), MAX_ENTRIES);
        // The scraper is in use (read after the spray began).
        assert_eq!(v.get(&scraper, t0), Some(Verdict::Allowed));
        // More spraying, nothing expired: only the least recently used go,
        // one per insert; the scraper's verdict stays.
        for i in 0..10 {
            v.insert(digest(&format!("more{i}")), Verdict::Unauthenticated, t0);
        }
        assert_eq!(v.len(), MAX_ENTRIES);
        assert_eq!(v.get(&scraper, t0), Some(Verdict::Allowed));
        assert_eq!(v.get(&digest("spray0"), t0), None, "the oldest went");
        assert_eq!(
            v.get(&digest("spray10"), t0),
            Some(Verdict::Unauthenticated)
        );
    }

    #[test]
    fn the_review_budget_bounds_the_rate_of_new_reviews() {
        let t0 = Instant::now();
        let mut b = ReviewBudget::new(10, 20);
        // The burst, then nothing until it refills.
        assert_eq!((0..25).filter(|_| b.take(t0)).count(), 20);
        assert!(!b.take(t0));
        // A tenth of a second brings one back; a minute no more than the burst.
        assert!(b.take(t0 + Duration::from_millis(100)));
        assert!(!b.take(t0 + Duration::from_millis(100)));
        let later = t0 + Duration::from_secs(60);
        assert_eq!((0..100).filter(|_| b.take(later)).count(), 20);
        // Sustained: about `rate` per second over ten seconds.
        let mut granted = 0;
        for ms in (0..10_000).step_by(10) {
            if b.take(later + Duration::from_millis(ms)) {
                granted += 1;
            }
        }
        assert!((99..=101).contains(&granted), "{granted}");
    }

    #[test]
    fn keys_are_digests_not_tokens() {
        assert_ne!(digest("a"), digest("b"));
        assert_eq!(digest("a"), digest("a"));
        let d = digest("secret-token");
        assert!(!d.windows(6).any(|w| w == b"secret"));
    }
}
