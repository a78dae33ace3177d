//! `kubectl csiops`: the user's side of csiops, as a kubectl plugin.
//!
//! - `import` ([`import`]): a driver's manifests (files, a directory,
//!   stdin or the live objects) → one CSIDriverDeployment and a [`report`]
//!   of every element of the input;
//! - `render` ([`render_cmd`]): what the operator would create for a CR,
//!   offline, with the operator's own rendering;
//! - `diff` ([`diff`]): the differences that matter between manifests and
//!   what a CR renders.
//!
//! Everything but [`input`] and [`cluster`] is pure.

pub mod cluster;
pub mod diff;
pub mod import;
pub mod input;
pub mod render_cmd;
pub mod report;
