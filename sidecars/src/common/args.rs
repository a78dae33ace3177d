//! Flags every sidecar shares, with the upstream kubernetes-csi names, and the
//! parsers of their value formats (Go durations, `host:port` endpoints).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use clap::Args;

pub use super::goflags::{parse_duration, MAX_DURATION};

use csiops_runtime::logging::LogFormat;

/// Flags of every role.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Address of the CSI driver socket: a path or `unix:///path`.
    #[arg(long, default_value = "/run/csi/socket")]
    pub csi_address: String,

    /// Timeout of each call to the CSI driver (Go duration: 500ms, 10s, 1m).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub timeout: Duration,

    /// `host:port` of the HTTP server for /healthz and metrics; `:9808` listens
    /// on every address. Empty disables the server.
    #[arg(long, default_value = "")]
    pub http_endpoint: String,

    /// Path of the metrics on the HTTP server.
    #[arg(long, default_value = "/metrics")]
    pub metrics_path: String,

    /// Log verbosity, as klog's `-v`: 0–2 info, 3–4 debug, 5+ trace.
    #[arg(short = 'v', long = "v", default_value_t = 2)]
    pub verbosity: u8,

    /// Log format (`--logging-format`, component-base's name, too).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, alias = "logging-format")]
    pub log_format: LogFormat,

    /// `--metrics-auth` and its certificate (HTTPS, TokenReview and
    /// SubjectAccessReview on the metrics path).
    #[command(flatten)]
    pub metrics_auth: csiops_runtime::admin::MetricsAuthArgs,

    #[command(flatten)]
    pub compat: super::compat::CompatArgs,
}

impl CommonArgs {
    /// The HTTP endpoint, if one is configured.
    pub fn http_addr(&self) -> Result<Option<SocketAddr>, FlagError> {
        parse_endpoint(&self.http_endpoint).map_err(|e| FlagError::new("--http-endpoint", e))
    }

    /// The log filter of `-v` and `--vmodule`.
    pub fn log_filter(&self) -> Result<String, FlagError> {
        let mut filter = csiops_runtime::logging::klog_filter(self.verbosity);
        let modules = super::vmodule::directives(&self.compat.vmodule)
            .map_err(|e| FlagError::new("--vmodule", e))?;
        for d in modules {
            filter.push(',');
            filter.push_str(&d);
        }
        Ok(filter)
    }

    /// The admin endpoint of a controller sidecar: `--http-endpoint`, or
    /// the deprecated `--metrics-address` (`metrics_address`); both set is
    /// an error, as upstream.
    pub fn http_or_metrics_addr(
        &self,
        metrics_address: &str,
    ) -> Result<Option<SocketAddr>, FlagError> {
        match (self.http_endpoint.is_empty(), metrics_address.is_empty()) {
            (false, false) => Err(FlagError::new(
                "--metrics-address, --http-endpoint",
                "only one of --metrics-address and --http-endpoint can be set",
            )),
            (true, false) => {
                parse_endpoint(metrics_address).map_err(|e| FlagError::new("--metrics-address", e))
            }
            _ => self.http_addr(),
        }
    }
}

/// A flag whose value cannot be used: the role stops before it does
/// anything else, naming the flag.
#[derive(Debug)]
pub struct FlagError {
    /// The flag, or the flags whose combination is wrong.
    pub flag: &'static str,
    reason: Box<dyn std::error::Error + Send + Sync>,
}

impl FlagError {
    /// `flag` is wrong for `reason` (a parser's message or a typed error).
    pub fn new(
        flag: &'static str,
        reason: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        FlagError {
            flag,
            reason: reason.into(),
        }
    }
}

impl std::fmt::Display for FlagError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The reason is the source; the flag is named once in the chain.
        if self.reason.to_string().contains(self.flag) {
            write!(f, "invalid flag")
        } else {
            write!(f, "invalid flag {}", self.flag)
        }
    }
}

impl std::error::Error for FlagError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.reason.as_ref())
    }
}

/// Parses `host:port`, `:port` (every address) or empty (disabled).
pub fn parse_endpoint(s: &str) -> Result<Option<SocketAddr>, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    if let Some(port) = s.strip_prefix(':') {
        let port: u16 = port
            .parse()
            .map_err(|_| format!("endpoint {s:?}: bad port"))?;
        return Ok(Some(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            port,
        )));
    }
    s.parse::<SocketAddr>()
        .map(Some)
        .or_else(|_| match s.rsplit_once(':') {
            Some(("localhost", port)) => port
                .parse()
                .map(|p| Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p)))
                .map_err(|_| format!("endpoint {s:?}: bad port")),
            _ => Err(format!("endpoint {s:?} is not host:port")),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2.5s"), Ok(Duration::from_millis(2500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("10").unwrap_err().contains("lacks a unit"));
        assert!(parse_duration("3d").unwrap_err().contains("unknown unit"));
        assert_eq!(parse_duration(".5h"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("1.s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("+2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("-0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("-0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1\u{b5}s"), Ok(Duration::from_micros(1)));
        assert_eq!(parse_duration("1\u{3bc}s"), Ok(Duration::from_micros(1)));
        assert_eq!(
            parse_duration("1.0000000009s"),
            Ok(Duration::from_nanos(1_000_000_000)),
            "finer than a nanosecond is truncated"
        );
        assert!(parse_duration("-1s").unwrap_err().contains("negative"));
        for bad in ["", ".", "s", ".s", "1..2s", "+", "-", "1s2"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn huge_durations_are_errors_not_panics() {
        // Go's limit, to the nanosecond.
        assert_eq!(parse_duration("2562047h47m16.854775807s"), Ok(MAX_DURATION));
        for huge in [
            "2562047h47m16.854775808s",
            "20000000000000000000s",
            "9223372036854775808ns",
            "99999999999999999999999999999999999999999h",
            "2562047h2562047h",
        ] {
            let err = parse_duration(huge).expect_err(huge);
            assert!(err.contains("longer than"), "{huge}: {err}");
        }
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn never_panics(s in ".*") {
                let _ = parse_duration(&s);
            }

            #[test]
            fn never_panics_on_duration_like_input(
                s in "[+-]?([0-9]{0,25}(\\.[0-9]{0,30})?(ns|us|\u{b5}s|ms|s|m|h|d|)){1,4}"
            ) {
                if let Ok(d) = parse_duration(&s) {
                    prop_assert!(d <= MAX_DURATION);
                }
            }

            #[test]
            fn components_round_trip(
                h in 0u64..1_000_000,
                m in 0u64..100_000,
                sec in 0u64..100_000,
                ms in 0u64..10_000,
                us in 0u64..10_000,
                ns in 0u64..10_000,
            ) {
                let want = Duration::from_secs(h * 3600 + m * 60 + sec)
                    + Duration::from_millis(ms)
                    + Duration::from_micros(us)
                    + Duration::from_nanos(ns);
                let text = format!("{h}h{m}m{sec}s{ms}ms{us}us{ns}ns");
                prop_assert_eq!(parse_duration(&text), Ok(want));
            }

            #[test]
            fn decimal_seconds_round_trip(
                secs in 0u64..=(i64::MAX as u64 / 1_000_000_000 - 1),
                nanos in 0u32..1_000_000_000,
            ) {
                let want = Duration::new(secs, nanos);
                let text = format!("{secs}.{nanos:09}s");
                prop_assert_eq!(parse_duration(&text), Ok(want));
            }
        }
    }

    #[test]
    fn endpoints() {
        assert_eq!(parse_endpoint(""), Ok(None));
        assert_eq!(
            parse_endpoint(":9808"),
            Ok(Some("0.0.0.0:9808".parse().expect("addr")))
        );
        assert_eq!(
            parse_endpoint("127.0.0.1:8080"),
            Ok(Some("127.0.0.1:8080".parse().expect("addr")))
        );
        assert_eq!(
            parse_endpoint("localhost:1"),
            Ok(Some("127.0.0.1:1".parse().expect("addr")))
        );
        assert!(parse_endpoint("nohost").is_err());
    }
}
