//! `csiops-sidecar attacher`: the external-attacher behaviour of the CSI
//! design doc and the upstream README.
//!
//! Pure decision logic, each a function of its inputs with table tests:
//! - [`finalizer`]: upstream's finalizer name;
//! - [`node`]: the driver's node ID of a node, from the caches;
//! - [`request`]: ControllerPublish/Unpublish requests from the PV;
//! - [`decide`]: what a VolumeAttachment or PV needs;
//! - [`status`]: the patch bodies.

pub mod decide;
pub mod finalizer;
pub mod node;
pub mod request;
pub mod status;
