//! Go's flag syntax on top of clap, so the arguments of an upstream manifest
//! work unchanged after an image swap.
//!
//! The upstream sidecars parse their flags with Go's `flag` package (the
//! provisioner with pflag plus the Go flags, which accepts a superset of our
//! forms for its own flags). Go accepts, for every flag, `-x` and `--x`,
//! `-x=v` and `--x=v`, and for non-boolean flags `-x v` (the next argument is
//! the value, whatever it looks like); a boolean flag given bare is true and
//! takes a value only as `-x=v` (`-x false` is the flag followed by a
//! positional argument). clap wants `--x=v`, so [`normalize`] rewrites the
//! arguments of a role into that one form before clap sees them, deciding
//! per flag from clap's own definition of it: the flags stay defined once,
//! in the role's `Args` struct.
//!
//! Flags we accept but have no use for are declared under the help heading
//! [`IGNORED_HEADING`]; [`ignored_given`] names those given on the command
//! line, which the role logs once at start.

use std::ffi::OsString;
use std::time::Duration;

use clap::{ArgAction, ArgMatches, Command};

/// The help heading of flags accepted for compatibility and ignored.
pub const IGNORED_HEADING: &str = "Accepted for compatibility with upstream and ignored";

/// How a flag takes its value, from clap's definition of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// clap takes no value (`--help`, `--version`, a `SetTrue` flag):
    /// `-x`/`-x=true` become `--x`, `-x=false` disappears.
    Switch,
    /// A boolean with an optional value (`num_args = 0..=1`): bare is true,
    /// a value only after `=`, normalised from Go's spellings.
    Bool,
    /// Takes a value: after `=` or as the next argument.
    Value,
}

/// The kind of the flag whose long name (or alias) is `name` in `cmd`.
pub fn kind(cmd: &Command, name: &str) -> Option<Kind> {
    if matches!(name, "help" | "h" | "version") {
        return Some(Kind::Switch);
    }
    let arg = cmd.get_arguments().find(|a| {
        a.get_long() == Some(name)
            || a.get_all_aliases()
                .is_some_and(|aliases| aliases.contains(&name))
    })?;
    Some(match arg.get_action() {
        ArgAction::SetTrue
        | ArgAction::SetFalse
        | ArgAction::Count
        | ArgAction::Help
        | ArgAction::HelpShort
        | ArgAction::HelpLong
        | ArgAction::Version => Kind::Switch,
        _ if arg.get_num_args().is_some_and(|r| r.min_values() == 0) => Kind::Bool,
        _ => Kind::Value,
    })
}

/// Go's `strconv.ParseBool`, the values a Go boolean flag takes.
pub fn go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// Rewrites the arguments of a role (those after the role name) from any
/// form Go accepts into `--name[=value]`. Anything that is not a flag of
/// `cmd` passes unchanged, for clap to refuse with its usual message; so
/// does a boolean's value Go would refuse (clap then names the flag).
pub fn translate(cmd: &Command, args: Vec<OsString>) -> Vec<OsString> {
    let mut out = Vec::with_capacity(args.len());
    let mut rest = args.into_iter();
    while let Some(arg) = rest.next() {
        let Some(text) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if text == "--" {
            // Go's end of flags: the rest is positional (and refused by clap).
            out.push(arg);
            out.extend(rest);
            break;
        }
        let Some((name, value)) = split_flag(text) else {
            out.push(arg);
            continue;
        };
        let Some(kind) = kind(cmd, name) else {
            out.push(arg);
            continue;
        };
        let name = if name == "h" { "help" } else { name };
        match (kind, value) {
            (Kind::Switch, None) => out.push(format!("--{name}").into()),
            (Kind::Switch, Some(v)) => match go_bool(v) {
                Some(true) => out.push(format!("--{name}").into()),
                Some(false) => {}
                None => out.push(arg),
            },
            (Kind::Bool, None) => out.push(format!("--{name}=true").into()),
            (Kind::Bool, Some(v)) => match go_bool(v) {
                Some(b) => out.push(format!("--{name}={b}").into()),
                None => out.push(format!("--{name}={v}").into()),
            },
            (Kind::Value, Some(v)) => out.push(format!("--{name}={v}").into()),
            (Kind::Value, None) => match rest.next() {
                Some(next) => {
                    let mut joined = OsString::from(format!("--{name}="));
                    joined.push(next);
                    out.push(joined);
                }
                // clap reports the missing value.
                None => out.push(format!("--{name}").into()),
            },
        }
    }
    out
}

/// `-name[=value]` or `--name[=value]`, as Go splits it; `None` for what Go
/// does not take as a flag (`-`, a positional argument, `---x`, `-=x`).
fn split_flag(text: &str) -> Option<(&str, Option<&str>)> {
    let body = text.strip_prefix("--").or_else(|| text.strip_prefix('-'))?;
    if body.is_empty() || body.starts_with('-') || body.starts_with('=') {
        return None;
    }
    Some(match body.split_once('=') {
        Some((name, value)) => (name, Some(value)),
        None => (body, None),
    })
}

/// Why [`normalize`] chose a role the command line did not name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inferred {
    pub role: &'static str,
    pub because: &'static str,
}

/// The role of an upstream command line that names none, by the flags
/// only one upstream sidecar has: `--kubelet-registration-path` (required
/// by node-driver-registrar) or livenessprobe's `--probe-timeout` and
/// `--health-port` (the registrar's deprecated `--health-port` comes with
/// `--kubelet-registration-path`). The provisioner and attacher share every
/// flag a typical manifest gives them, so they are not guessed.
fn infer_role(args: &[OsString]) -> Option<Inferred> {
    let names: Vec<&str> = args
        .iter()
        .filter_map(|a| a.to_str())
        .filter_map(split_flag)
        .map(|(name, _)| name)
        .collect();
    if names.contains(&"kubelet-registration-path") {
        return Some(Inferred {
            role: "registrar",
            because: "--kubelet-registration-path",
        });
    }
    for flag in ["probe-timeout", "health-port"] {
        if names.contains(&flag) {
            return Some(Inferred {
                role: "liveness-probe",
                because: if flag == "probe-timeout" {
                    "--probe-timeout"
                } else {
                    "--health-port"
                },
            });
        }
    }
    None
}

/// The whole command line (`argv[0]` first) in clap's form: the role's
/// arguments translated (see [`translate`]). A command line that starts
/// with a flag names no role; if it is unmistakably the registrar's or the
/// liveness probe's (see [`infer_role`]), that role is inserted and
/// returned, so an upstream manifest works with only its image swapped.
pub fn normalize(cli: &Command, argv: Vec<OsString>) -> (Vec<OsString>, Option<Inferred>) {
    let mut argv = argv.into_iter();
    let mut out: Vec<OsString> = argv.next().into_iter().collect();
    let rest: Vec<OsString> = argv.collect();
    let role = rest
        .first()
        .and_then(|a| a.to_str())
        .and_then(|r| cli.find_subcommand(r));
    if let Some(role) = role {
        let mut rest = rest.into_iter();
        out.extend(rest.next());
        out.extend(translate(role, rest.collect()));
        return (out, None);
    }
    let top_level_only = rest.len() == 1
        && matches!(
            rest[0].to_str(),
            Some("-h" | "--help" | "-help" | "--version" | "-version" | "-V")
        );
    let first_is_flag = rest
        .first()
        .and_then(|a| a.to_str())
        .is_some_and(|a| a.starts_with('-'));
    if first_is_flag && !top_level_only {
        if let Some(inferred) = infer_role(&rest) {
            if let Some(role) = cli.find_subcommand(inferred.role) {
                out.push(inferred.role.into());
                out.extend(translate(role, rest));
                return (out, Some(inferred));
            }
        }
    }
    // No role: `-help`/`-version` of the binary, or an error clap reports.
    out.extend(translate(cli, rest));
    (out, None)
}

/// The long names of the flags under [`IGNORED_HEADING`] that the command
/// line gave (defaults and environment do not count), sorted.
pub fn ignored_given(role: &Command, matches: &ArgMatches) -> Vec<String> {
    let mut given: Vec<String> = role
        .get_arguments()
        .filter(|a| a.get_help_heading() == Some(IGNORED_HEADING))
        .filter(|a| {
            matches.value_source(a.get_id().as_str())
                == Some(clap::parser::ValueSource::CommandLine)
        })
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect();
    given.sort();
    given
}

/// The longest duration accepted: Go's (`math.MaxInt64` nanoseconds, about
/// 292 years). Anything longer is refused like Go refuses it; this bound also
/// keeps `Instant::now() + d` from overflowing wherever a flag's value is
/// used as a timeout or period.
pub const MAX_DURATION: Duration = Duration::from_nanos(i64::MAX as u64);

/// Parses a Go duration (`time.ParseDuration`): an optional sign, then a
/// sequence of `<decimal number><unit>` with units `ns`, `us` (`µs`, `μs`),
/// `ms`, `s`, `m`, `h` (`1m30s`, `250ms`, `2.5s`, `.5h`). A negative
/// duration is refused (none of the flags means anything by it), as is one
/// longer than [`MAX_DURATION`]. Exact integer arithmetic: a fraction finer
/// than a nanosecond is truncated, as in Go.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (negative, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if body == "0" {
        return Ok(Duration::ZERO);
    }
    if body.is_empty() {
        return Err(format!("invalid duration {s:?}"));
    }
    let too_long = || format!("duration {s:?} is longer than {MAX_DURATION:?}");
    let mut total: u128 = 0;
    let mut rest = body;
    while !rest.is_empty() {
        let int_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (int_digits, tail) = rest.split_at(int_len);
        let (frac_digits, tail) = match tail.strip_prefix('.') {
            Some(t) => t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len())),
            None => ("", tail),
        };
        if int_digits.is_empty() && frac_digits.is_empty() {
            return Err(format!("invalid duration {s:?}"));
        }
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(format!("duration {s:?} lacks a unit (ns, us, ms, s, m, h)")),
            other => return Err(format!("duration {s:?}: unknown unit {other:?}")),
        };
        let mut int: u128 = 0;
        for d in int_digits.bytes() {
            int = int
                .checked_mul(10)
                .and_then(|v| v.checked_add(u128::from(d - b'0')))
                .filter(|&v| v <= MAX_DURATION.as_nanos())
                .ok_or_else(too_long)?;
        }
        // Digits past the 25th add less than a nanosecond even with the
        // largest unit (an hour is 3.6e12 ns), and 25 digits times that unit
        // stay far inside u128.
        let frac = &frac_digits[..frac_digits.len().min(25)];
        let mut numerator: u128 = 0;
        for d in frac.bytes() {
            numerator = numerator * 10 + u128::from(d - b'0');
        }
        let scale = 10u128.pow(frac.len() as u32);
        let nanos = int
            .checked_mul(unit_nanos)
            .and_then(|v| v.checked_add(numerator * unit_nanos / scale))
            .ok_or_else(too_long)?;
        total = total
            .checked_add(nanos)
            .filter(|&t| t <= MAX_DURATION.as_nanos())
            .ok_or_else(too_long)?;
        rest = next;
    }
    if negative && total != 0 {
        return Err(format!("duration {s:?} is negative"));
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| too_long())?;
    // The remainder of a division by 1e9 always fits.
    let nanos = (total % 1_000_000_000) as u32;
    Ok(Duration::new(secs, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, Parser};

    #[derive(Debug, Args)]
    struct T {
        #[arg(long)]
        name: Option<String>,
        #[arg(long, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set)]
        on: Option<bool>,
        #[arg(long)]
        switch: bool,
        #[arg(short = 'v', long = "v")]
        v: Option<u8>,
        #[arg(long, help_heading = IGNORED_HEADING)]
        old: Option<String>,
    }

    #[derive(Debug, Parser)]
    enum Cli {
        Role(T),
    }

    fn cmd() -> Command {
        use clap::CommandFactory;
        Cli::command()
    }

    fn tr(args: &[&str]) -> Vec<String> {
        let cmd = cmd();
        let role = cmd.find_subcommand("role").expect("role");
        translate(role, args.iter().map(OsString::from).collect())
            .into_iter()
            .map(|a| a.into_string().expect("utf-8"))
            .collect()
    }

    #[test]
    fn every_go_form_becomes_double_dash_equals() {
        for form in [
            &["-name=x"][..],
            &["--name=x"],
            &["-name", "x"],
            &["--name", "x"],
        ] {
            assert_eq!(tr(form), ["--name=x"], "{form:?}");
        }
        // The next argument is the value, whatever it looks like (as in Go).
        assert_eq!(tr(&["-name", "-v"]), ["--name=-v"]);
        assert_eq!(tr(&["-name="]), ["--name="]);
        assert_eq!(tr(&["-name=a=b"]), ["--name=a=b"]);
        assert_eq!(
            tr(&["-v=5", "-v", "6", "--v=7"]),
            ["--v=5", "--v=6", "--v=7"]
        );
    }

    #[test]
    fn booleans_take_a_value_only_after_equals() {
        assert_eq!(tr(&["-on"]), ["--on=true"]);
        assert_eq!(tr(&["--on=F"]), ["--on=false"]);
        assert_eq!(tr(&["-on=1"]), ["--on=true"]);
        // Go: `-on false` is the flag, then a positional argument.
        assert_eq!(tr(&["-on", "false"]), ["--on=true", "false"]);
        // A value Go refuses reaches clap as given, which names the flag.
        assert_eq!(tr(&["-on=yes"]), ["--on=yes"]);
        assert_eq!(tr(&["-switch"]), ["--switch"]);
        assert_eq!(tr(&["-switch=true"]), ["--switch"]);
        assert!(tr(&["-switch=false"]).is_empty());
        assert_eq!(tr(&["-h"]), ["--help"]);
        assert_eq!(tr(&["-version"]), ["--version"]);
    }

    #[test]
    fn what_is_not_a_known_flag_passes_unchanged() {
        assert_eq!(
            tr(&["-nope=1", "---name=x", "-", "pos", "-name"]),
            ["-nope=1", "---name=x", "-", "pos", "--name"]
        );
        assert_eq!(tr(&["--", "-name=x"]), ["--", "-name=x"]);
    }

    #[test]
    fn normalize_translates_after_the_role_and_infers_node_roles() {
        let s = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        let cli = crate::cli::command();
        let (argv, inferred) = normalize(&cli, s(&["bin", "registrar", "-v", "5"]));
        assert_eq!(argv, s(&["bin", "registrar", "--v=5"]));
        assert_eq!(inferred, None);
        let (argv, inferred) = normalize(
            &cli,
            s(&["bin", "-v=5", "-kubelet-registration-path", "/k/csi.sock"]),
        );
        assert_eq!(
            argv,
            s(&[
                "bin",
                "registrar",
                "--v=5",
                "--kubelet-registration-path=/k/csi.sock"
            ])
        );
        assert_eq!(inferred.map(|i| i.role), Some("registrar"));
        let (argv, inferred) =
            normalize(&cli, s(&["bin", "--csi-address=/c", "--health-port=9898"]));
        assert_eq!(argv[1], "liveness-probe");
        assert_eq!(inferred.map(|i| i.because), Some("--health-port"));
        // Nothing to go by: clap says a role is missing.
        let (argv, inferred) = normalize(&cli, s(&["bin", "--csi-address=/c"]));
        assert_eq!(argv, s(&["bin", "--csi-address=/c"]));
        assert_eq!(inferred, None);
        let (argv, _) = normalize(&cli, s(&["bin", "--version"]));
        assert_eq!(argv, s(&["bin", "--version"]));
    }

    #[test]
    fn ignored_flags_given_are_named_once() {
        let cmd = cmd();
        let m = cmd
            .clone()
            .try_get_matches_from(["bin", "role", "--old=x", "--name=y"])
            .expect("parses");
        let (_, sub) = m.subcommand().expect("role");
        let role = cmd.find_subcommand("role").expect("role");
        assert_eq!(ignored_given(role, sub), ["--old"]);
    }
}
