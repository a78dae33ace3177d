//! Logging: `tracing` with klog-like `-v` levels, text or JSON.

use tracing_subscriber::EnvFilter;

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The tracing level of a klog verbosity.
pub fn level_for(verbosity: u8) -> &'static str {
    match verbosity {
        0..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
    }
}

/// Installs the global subscriber; `RUST_LOG` overrides `-v`.
pub fn init(format: LogFormat, verbosity: u8) -> Result<(), String> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => {
            EnvFilter::try_new(&v).map_err(|e| format!("RUST_LOG={v:?}: {e}"))?
        }
        _ => EnvFilter::new(format!(
            "{},h2=warn,hyper=warn,tower=warn",
            level_for(verbosity)
        )),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    let res = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    res.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn klog_levels_map_to_tracing_levels() {
        assert_eq!(level_for(0), "info");
        assert_eq!(level_for(2), "info");
        assert_eq!(level_for(4), "debug");
        assert_eq!(level_for(5), "trace");
    }
}
