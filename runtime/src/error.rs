//! The one error convention of csiops: an error's message says what failed
//! without repeating its source, the source is kept as `#[source]`, and the
//! whole chain is rendered once, where the error is logged or reported, with
//! [`chain`].

use std::fmt;

/// An error and its sources, `outer: inner: innermost`, for log lines and
/// status messages.
#[derive(Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.to_string();
        f.write_str(&shown)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            let message = s.to_string();
            // Errors of other crates (kube's, for one) often print their
            // source in their own message too: say it once.
            if !shown.contains(&message) {
                write!(f, ": {message}")?;
            }
            shown = message;
            source = s.source();
        }
        Ok(())
    }
}

impl fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `error` with its sources, for `warn!(error = %chain(&e), …)`.
pub fn chain<'a>(error: &'a (dyn std::error::Error + 'static)) -> ErrorChain<'a> {
    ErrorChain(error)
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character
/// boundary (API fields such as an Event's message or a VolumeAttachment's
/// error have byte limits).
pub fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// [`truncate`], with `…` appended when something was cut.
pub fn ellipsize(s: &str, max: usize) -> String {
    let cut = truncate(s, max);
    if cut.len() == s.len() {
        s.to_string()
    } else {
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("inner")]
    struct Inner(#[source] std::io::Error);

    #[test]
    fn chain_renders_every_source_once() {
        let e = Outer(Inner(std::io::Error::other("disk")));
        assert_eq!(chain(&e).to_string(), "outer: inner: disk");
        assert_eq!(chain(&std::io::Error::other("alone")).to_string(), "alone");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("wrapper: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[test]
    fn a_source_already_in_the_message_is_not_repeated() {
        let e = Outer(Inner(std::io::Error::other("x")));
        let r = Repeats(std::io::Error::other("disk"));
        assert_eq!(chain(&r).to_string(), "wrapper: disk");
        assert_eq!(chain(&e).to_string(), "outer: inner: x");
    }

    #[test]
    fn truncate_keeps_characters_whole() {
        assert_eq!(truncate("abc", 5), "abc");
        assert_eq!(truncate("abcdef", 3), "abc");
        // "é" is two bytes: cutting in its middle drops it.
        assert_eq!(truncate("aé", 2), "a");
        assert_eq!(ellipsize("abcdef", 3), "abc…");
        assert_eq!(ellipsize("abc", 3), "abc");
        assert_eq!(ellipsize("aéb", 2), "a…");
    }
}
