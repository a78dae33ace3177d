//! The data of `csi-test-driver`'s volumes and snapshots under
//! `--data-dir`: created, copied (snapshots and clones, see [`super::copy`]),
//! mounted at publish (see [`super::mounts`]) and removed. Without
//! `--data-dir` none of this runs: volumes are only recorded.

use std::path::{Path, PathBuf};

use csiops_proto::csi::v1::NodePublishVolumeRequest;
use tonic::Status;

use super::copy;
use super::mounts;
use super::node_local;
use super::state::{Capability, ContentSource, Volume};

/// The data of a new volume under `--data-dir`: a directory, or for a
/// block-only volume a sparse file of its capacity.
///
/// With `source` (a snapshot's or a volume's data, see [`source_data`]),
/// the new volume starts as a copy of it: an image is copied with its holes
/// and grown to the volume's capacity, a directory tree copied into the new
/// directory; a source of the other kind, or none on disk, leaves it empty.
///
/// `node_local`: a block volume's loop device is set up now too, and stays
/// until DeleteVolume ([`node_local::attach_at_create`]); otherwise the node
/// service sets it up at publish.
pub(super) fn create_data(
    dir: &Path,
    v: &Volume,
    source: Option<&Path>,
    node_local: bool,
) -> Result<(), Status> {
    let block = v
        .volume_capabilities
        .iter()
        .all(|c| c.access_type == "block");
    let image = dir.join(format!("{}.img", v.id));
    let size = u64::try_from(v.capacity_bytes).unwrap_or(0);
    let source_image = source
        .map(|p| p.with_extension("img"))
        .filter(|p| p.is_file());
    let source_dir = source.filter(|p| p.is_dir());
    let result = if block {
        match source_image {
            Some(src) => copy::copy_sparse(&src, &image).and_then(|()| {
                let f = std::fs::OpenOptions::new().write(true).open(&image)?;
                f.set_len(size.max(f.metadata()?.len()))
            }),
            None => std::fs::File::create(&image).and_then(|f| f.set_len(size)),
        }
    } else {
        let vol = dir.join(&v.id);
        std::fs::create_dir_all(&vol).and_then(|()| match source_dir {
            Some(src) => copy::copy_tree(src, &vol),
            None => Ok(()),
        })
    };
    result.map_err(|e| Status::internal(format!("creating the data of {}: {e}", v.id)))?;
    if block && node_local {
        let dev = node_local::attach_at_create(&image)?;
        tracing::info!(volume = %v.id, device = %dev.display(), "loop device set up");
    }
    Ok(())
}

/// Where a content source's data is: `<dir>/snapshots/<id>` for a
/// snapshot, `<dir>/<id>` for a volume, each with `.img` for a block one.
pub(super) fn source_data(dir: &Path, c: &ContentSource) -> PathBuf {
    match c {
        ContentSource::Snapshot(id) => dir.join(SNAPSHOTS).join(id),
        ContentSource::Volume(id) => dir.join(id),
    }
}

/// The snapshots' data dir inside `--data-dir` (volume IDs are UUIDs).
pub(super) const SNAPSHOTS: &str = "snapshots";

/// A snapshot's data: a copy of its source volume's image or directory as
/// it is now (point in time), kept until DeleteSnapshot.
pub(super) fn snapshot_data(dir: &Path, volume_id: &str, snapshot_id: &str) -> Result<(), Status> {
    let snaps = dir.join(SNAPSHOTS);
    let err = |e: std::io::Error| {
        Status::internal(format!(
            "copying the data of {volume_id} into snapshot {snapshot_id}: {e}"
        ))
    };
    std::fs::create_dir_all(&snaps).map_err(err)?;
    remove_snapshot_data(dir, snapshot_id)?;
    let image = dir.join(format!("{volume_id}.img"));
    if image.is_file() {
        copy::copy_sparse(&image, &snaps.join(format!("{snapshot_id}.img"))).map_err(err)
    } else {
        let to = snaps.join(snapshot_id);
        std::fs::create_dir(&to)
            .and_then(|()| copy::copy_tree(&dir.join(volume_id), &to))
            .map_err(err)
    }
}

/// Removes a snapshot's data (either form; absent is fine).
pub(super) fn remove_snapshot_data(dir: &Path, id: &str) -> Result<(), Status> {
    let snaps = dir.join(SNAPSHOTS);
    let what = format!("snapshot {id}");
    gone(std::fs::remove_file(snaps.join(format!("{id}.img"))), &what)?;
    gone(std::fs::remove_dir_all(snaps.join(id)), &what)
}

/// Removes a deleted volume's data (either form; absent is fine).
pub(super) fn remove_data(dir: &Path, id: &str) -> Result<(), Status> {
    let image = dir.join(format!("{id}.img"));
    if image.exists() {
        gone(mounts::detach_loop(&image), id)?;
    }
    gone(std::fs::remove_file(image), id)?;
    gone(std::fs::remove_dir_all(dir.join(id)), id)
}

/// The real mount of NodePublishVolume under `--data-dir`: the staging path
/// (or the volume's directory) on a target directory, or the loop device of
/// a block volume on a target file.
pub(super) fn publish_data(
    dir: &Path,
    v: &Volume,
    req: &NodePublishVolumeRequest,
    cap: &Capability,
) -> Result<(), Status> {
    let target = Path::new(&req.target_path);
    let result = if cap.access_type == "block" {
        mounts::publish_block(&dir.join(format!("{}.img", v.id)), target, req.readonly)
    } else {
        let source = if req.staging_target_path.is_empty() {
            dir.join(&v.id)
        } else {
            PathBuf::from(&req.staging_target_path)
        };
        std::fs::create_dir_all(target).and_then(|()| mounts::bind(&source, target, req.readonly))
    };
    result.map_err(|e| Status::internal(format!("publishing at {}: {e}", req.target_path)))
}

/// A removal of `what`'s data: already absent is fine (the removals are
/// retried after a crash), any other error INTERNAL.
fn gone(r: std::io::Result<()>, what: &str) -> Result<(), Status> {
    match r {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Status::internal(format!(
            "removing the data of {what}: {e}"
        ))),
        _ => Ok(()),
    }
}
