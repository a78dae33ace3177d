//! The flags every upstream sidecar registers from imported packages
//! (component-base's logging flags, csi-lib-utils' `--automaxprocs`) or
//! for Go's profiler, that have no other home here. `--vmodule` is
//! honoured (see [`super::vmodule`]); the rest are accepted and ignored,
//! each with its reason, under [`IGNORED_HEADING`].

use std::time::Duration;

use clap::{ArgAction, Args};

use super::goflags::parse_duration;
use super::goflags::IGNORED_HEADING;

/// Upstream logging and runtime flags (see the module doc).
#[derive(Debug, Clone, Default, Args)]
pub struct CompatArgs {
    /// klog's per-module verbosity: `pattern=N,...`, a pattern naming our
    /// modules (`controller`, `sync`, `nodeinfo`, globs with `*` and `?`).
    #[arg(long, default_value = "")]
    pub vmodule: String,

    /// Ignored: log lines are written at once, unbuffered, so there is
    /// nothing to flush.
    #[arg(long, value_parser = parse_duration, help_heading = IGNORED_HEADING)]
    pub log_flush_frequency: Option<Duration>,

    /// Ignored: everything goes to stderr (upstream's alpha option,
    /// refused there without the LoggingAlphaOptions gate).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, help_heading = IGNORED_HEADING)]
    pub log_text_split_stream: Option<bool>,

    /// Ignored, with --log-text-split-stream.
    #[arg(long, help_heading = IGNORED_HEADING)]
    pub log_text_info_buffer_size: Option<String>,

    /// Ignored: everything goes to stderr (alpha upstream, as above).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, help_heading = IGNORED_HEADING)]
    pub log_json_split_stream: Option<bool>,

    /// Ignored, with --log-json-split-stream.
    #[arg(long, help_heading = IGNORED_HEADING)]
    pub log_json_info_buffer_size: Option<String>,

    /// Ignored: sets Go's GOMAXPROCS; our roles run on one thread.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, help_heading = IGNORED_HEADING)]
    pub automaxprocs: Option<bool>,

    /// Ignored: deprecated upstream (the registrar says "no effect"; others
    /// dropped it); the driver is waited for without limit.
    #[arg(long, value_parser = parse_duration, help_heading = IGNORED_HEADING)]
    pub connection_timeout: Option<Duration>,

    /// Ignored: Go's pprof profiler has no counterpart here.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, help_heading = IGNORED_HEADING)]
    pub enable_pprof: Option<bool>,
}
