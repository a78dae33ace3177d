//! CreateVolume and DeleteVolume through the instrumented driver connection,
//! and which of their errors are final.

use std::collections::HashMap;
use std::time::Duration;

use csiops_proto::client::with_timeout;
use csiops_proto::csi::v1::{
    CreateVolumeRequest, DeleteVolumeRequest, GetCapacityRequest, GetCapacityResponse, Volume,
};
use tonic::{Code, Status};

use crate::common::driver::Driver;

/// CreateVolume with `--timeout`; the created (or already existing) volume.
pub async fn create_volume(
    driver: &Driver,
    request: CreateVolumeRequest,
    timeout: Duration,
) -> Result<Volume, Status> {
    let mut c = driver.client().controller();
    let resp = driver
        .timed(
            "/csi.v1.Controller/CreateVolume",
            c.create_volume(with_timeout(request, timeout)),
        )
        .await?;
    resp.volume
        .ok_or_else(|| Status::internal("CreateVolume answered without a volume"))
}

/// DeleteVolume with `--timeout`. NotFound counts as deleted (CSI: the
/// call is idempotent and a plugin may answer NotFound for a gone volume).
pub async fn delete_volume(
    driver: &Driver,
    volume_id: &str,
    secrets: HashMap<String, String>,
    timeout: Duration,
) -> Result<(), Status> {
    let mut c = driver.client().controller();
    let request = DeleteVolumeRequest {
        volume_id: volume_id.to_string(),
        secrets,
    };
    match driver
        .timed(
            "/csi.v1.Controller/DeleteVolume",
            c.delete_volume(with_timeout(request, timeout)),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(s) if s.code() == Code::NotFound => Ok(()),
        Err(s) => Err(s),
    }
}

/// GetCapacity with `--timeout` (node deployment asks it before claiming a
/// claim with immediate binding).
pub async fn get_capacity(
    driver: &Driver,
    request: GetCapacityRequest,
    timeout: Duration,
) -> Result<GetCapacityResponse, Status> {
    let mut c = driver.client().controller();
    driver
        .timed(
            "/csi.v1.Controller/GetCapacity",
            c.get_capacity(with_timeout(request, timeout)),
        )
        .await
}

/// Whether the driver has decided: a final error means CreateVolume did
/// not and will not create the volume for this request. The others (the
/// call timed out, the driver is busy or restarting) mean the volume may
/// still be created, as upstream treats them.
pub fn is_final(status: &Status) -> bool {
    !matches!(
        status.code(),
        Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Unavailable
            | Code::ResourceExhausted
            | Code::Aborted
    )
}

/// Whether the driver rejected the request itself, so that this call made
/// no volume. Narrower than [`is_final`]: `Internal`, `Unknown`,
/// `Unauthenticated`… may come from a transport or a backend that never got
/// as far as looking the name up, and `AlreadyExists` says the name *is*
/// taken.
///
/// It says nothing about a volume an *earlier* call of the same name made:
/// a driver rejects a request before it looks the name up, and the same
/// request may be rejected today and have been served yesterday (a driver
/// upgrade that no longer accepts a parameter). So it lets a claim's sync
/// forget its intent only when no earlier attempt of unknown outcome stood
/// (`journal::Recorded::Fresh`), and never lets a clean-up conclude that
/// there is nothing to delete.
pub fn rejects_request(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::InvalidArgument | Code::OutOfRange | Code::Unimplemented
    )
}

/// An RPC error in upstream's words, which admins grep for.
pub fn rpc(status: &Status) -> String {
    format!(
        "rpc error: code = {:?} desc = {}",
        status.code(),
        status.message()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_and_busy_drivers_are_not_final() {
        for code in [
            Code::Cancelled,
            Code::DeadlineExceeded,
            Code::Unavailable,
            Code::ResourceExhausted,
            Code::Aborted,
        ] {
            assert!(!is_final(&Status::new(code, "x")), "{code:?}");
        }
        for code in [
            Code::InvalidArgument,
            Code::AlreadyExists,
            Code::OutOfRange,
            Code::Internal,
            Code::Unimplemented,
        ] {
            assert!(is_final(&Status::new(code, "x")), "{code:?}");
        }
    }

    #[test]
    fn only_a_rejected_request_made_nothing() {
        for code in [Code::InvalidArgument, Code::OutOfRange, Code::Unimplemented] {
            assert!(rejects_request(&Status::new(code, "x")), "{code:?}");
        }
        for code in [
            Code::Internal,
            Code::Unknown,
            Code::Unauthenticated,
            Code::PermissionDenied,
            Code::AlreadyExists,
            Code::DeadlineExceeded,
            Code::Unavailable,
        ] {
            assert!(!rejects_request(&Status::new(code, "x")), "{code:?}");
        }
    }
}
