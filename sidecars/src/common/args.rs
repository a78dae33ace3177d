//! Flags every sidecar shares, with the upstream kubernetes-csi names, and the
//! parsers of their value formats (Go durations, `host:port` endpoints).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use clap::Args;

use super::logging::LogFormat;

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

    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl CommonArgs {
    /// The HTTP endpoint, if one is configured.
    pub fn http_addr(&self) -> Result<Option<SocketAddr>, String> {
        parse_endpoint(&self.http_endpoint)
    }
}

/// Parses a Go-style duration: a sequence of `<number><unit>` with units
/// `ns`, `us`, `ms`, `s`, `m`, `h` (e.g. `1m30s`, `250ms`, `2.5s`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("duration {s:?} lacks a unit (ns, us, ms, s, m, h)"))?;
        let (num, tail) = rest.split_at(num_len);
        let value: f64 = num
            .parse()
            .map_err(|_| format!("duration {s:?}: {num:?} is not a number"))?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let seconds = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            other => return Err(format!("duration {s:?}: unknown unit {other:?}")),
        };
        total += value * seconds;
        rest = next;
    }
    Ok(Duration::from_secs_f64(total))
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
