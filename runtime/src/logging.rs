//! Process-wide logging setup, the same for the operator and the sidecars:
//! to stderr, without colours, text or JSON.
//!
//! Logging is initialised once, at start-up, before anything else logs, so that
//! every later `tracing` event (including those from kube-runtime) goes through
//! the same filter and format.

use tracing_subscriber::EnvFilter;

/// Name of the environment variable that, when set and non-empty, replaces the
/// filter passed to [`init`]. It follows the usual Rust convention so that an
/// operator can turn up verbosity on a running Deployment without knowing this
/// binary's flags.
pub const LOG_ENV: &str = "RUST_LOG";

/// Output format of log lines.
///
/// `Text` is meant for humans reading `kubectl logs`; `Json` is one object per
/// line for log pipelines (Loki, Elasticsearch, Cloud Logging) that index fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable, single-line text.
    #[default]
    Text,
    /// One JSON object per line, event fields flattened to the top level.
    Json,
}

/// Why logging could not be set up. Each variant is fatal at start-up: running
/// without logs, or with a filter other than the one asked for, would hide
/// problems instead of reporting them.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// The filter directives did not parse. `origin` tells whether they came
    /// from `RUST_LOG` or from the configured default, so the user knows which
    /// one to fix.
    #[error("invalid log filter {directives:?} (from {origin})")]
    InvalidFilter {
        /// The directives as given.
        directives: String,
        /// Where they came from: `RUST_LOG` or the configured filter.
        origin: &'static str,
        /// The parser's complaint.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// Someone already installed a global subscriber; a second one would be
    /// silently ignored, so we report it instead.
    #[error("a global tracing subscriber is already installed")]
    AlreadyInitialized(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
}

/// Installs the global `tracing` subscriber.
///
/// `filter` is an `EnvFilter` directive string such as `info,csiops_operator=debug`
/// (the sidecars make theirs from klog's `-v` with [`klog_filter`]);
/// when `RUST_LOG` is set and non-empty it wins, so verbosity can be changed
/// through the environment without changing the command line.
///
/// Call this exactly once, early in `main`; a second call returns
/// [`LoggingError::AlreadyInitialized`].
pub fn init(format: LogFormat, filter: &str) -> Result<(), LoggingError> {
    let env = std::env::var(LOG_ENV).ok();
    let env_filter = build_filter(env.as_deref(), filter)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
    result.map_err(LoggingError::AlreadyInitialized)
}

/// The tracing level of a klog verbosity (`-v`): 0–2 info, 3–4 debug, 5+ trace.
pub fn level_for(verbosity: u8) -> &'static str {
    match verbosity {
        0..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
    }
}

/// The filter of a klog verbosity, with the HTTP/2 and tower internals kept
/// at `warn` (they are noisy at debug and say nothing about the role).
pub fn klog_filter(verbosity: u8) -> String {
    format!("{},h2=warn,hyper=warn,tower=warn", level_for(verbosity))
}

/// Chooses between the environment's directives and the configured ones and
/// parses the winner. Kept separate from [`init`] so the choice can be tested
/// without touching process-global state.
fn build_filter(env: Option<&str>, filter: &str) -> Result<EnvFilter, LoggingError> {
    let (directives, origin) = match env {
        Some(value) if !value.trim().is_empty() => (value, LOG_ENV),
        _ => (filter, "configured log filter"),
    };
    EnvFilter::try_new(directives).map_err(|source| LoggingError::InvalidFilter {
        directives: directives.to_owned(),
        origin,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    #[test]
    fn env_overrides_configured_filter() {
        let f = build_filter(Some("warn"), "debug").unwrap();
        assert_eq!(f.to_string(), "warn");
    }

    #[test]
    fn empty_env_falls_back_to_configured_filter() {
        let f = build_filter(Some("  "), "info,csiops_operator=debug").unwrap();
        let s = f.to_string();
        assert!(s.contains("csiops_operator=debug"), "{s}");
        let f = build_filter(None, "info").unwrap();
        assert_eq!(f.to_string(), "info");
    }

    #[test]
    fn invalid_filter_reports_origin() {
        let err = build_filter(Some("foo=notalevel"), "info").unwrap_err();
        match err {
            LoggingError::InvalidFilter { origin, .. } => assert_eq!(origin, LOG_ENV),
            other => panic!("unexpected error {other:?}"),
        }
        let err = build_filter(None, "foo=notalevel").unwrap_err();
        assert!(err.to_string().contains("configured log filter"), "{err}");
    }

    #[test]
    fn klog_levels_map_to_tracing_levels() {
        assert_eq!(level_for(0), "info");
        assert_eq!(level_for(2), "info");
        assert_eq!(level_for(4), "debug");
        assert_eq!(level_for(5), "trace");
        assert!(build_filter(None, &klog_filter(4)).is_ok());
    }

    #[test]
    fn log_format_parses_from_cli_values() {
        assert_eq!(LogFormat::from_str("json", true).unwrap(), LogFormat::Json);
        assert_eq!(LogFormat::from_str("text", true).unwrap(), LogFormat::Text);
        assert_eq!(LogFormat::default(), LogFormat::Text);
    }
}
