//! CreateSnapshot, DeleteSnapshot and ListSnapshots of `csi-test-driver`'s
//! Controller service. A snapshot is ready at once; with `--data-dir` it
//! holds a copy of its source's data ([`super::super::volume_data`]).

use std::collections::BTreeMap;

use csiops_proto::csi::v1::{
    list_snapshots_response, CreateSnapshotRequest, CreateSnapshotResponse, DeleteSnapshotRequest,
    DeleteSnapshotResponse, ListSnapshotsRequest, ListSnapshotsResponse,
};
use tonic::Status;

use super::super::service::{require, Driver};
use super::super::state::Snapshot;
use super::super::volume_data::{remove_snapshot_data, snapshot_data};
use super::{cut_page, new_volume_id, page_start};

impl Driver {
    pub(super) fn create_snapshot(
        &self,
        req: CreateSnapshotRequest,
    ) -> Result<CreateSnapshotResponse, Status> {
        require(&req.name, "name")?;
        require(&req.source_volume_id, "source_volume_id")?;
        let parameters: BTreeMap<String, String> = req.parameters.clone().into_iter().collect();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or_default();
        let snapshot = self.tx(|s| {
            if let Some(existing) = s.snapshots.values().find(|x| x.name == req.name) {
                if existing.source_volume_id != req.source_volume_id {
                    return Err(Status::already_exists(format!(
                        "snapshot {:?} ({}) exists for another source volume {}",
                        req.name, existing.id, existing.source_volume_id
                    )));
                }
                return Ok(existing.clone());
            }
            let source = s.volumes.get(&req.source_volume_id).ok_or_else(|| {
                Status::not_found(format!("volume {} does not exist", req.source_volume_id))
            })?;
            let snap = Snapshot {
                id: new_volume_id()?,
                name: req.name.clone(),
                source_volume_id: req.source_volume_id.clone(),
                size_bytes: source.capacity_bytes,
                seq: s.next_seq,
                creation_seconds: now,
                parameters: parameters.clone(),
            };
            s.next_seq += 1;
            if let Some(dir) = &self.data_dir {
                snapshot_data(dir, &req.source_volume_id, &snap.id)?;
            }
            s.snapshots.insert(snap.id.clone(), snap.clone());
            Ok(snap)
        })?;
        Ok(CreateSnapshotResponse {
            snapshot: Some(csi_snapshot(&snapshot)),
        })
    }

    pub(super) fn delete_snapshot(
        &self,
        req: DeleteSnapshotRequest,
    ) -> Result<DeleteSnapshotResponse, Status> {
        require(&req.snapshot_id, "snapshot_id")?;
        // Gone already is success (CSI spec).
        self.tx(|s| {
            if let Some(dir) = &self.data_dir {
                remove_snapshot_data(dir, &req.snapshot_id)?;
            }
            s.snapshots.remove(&req.snapshot_id);
            Ok(())
        })?;
        Ok(DeleteSnapshotResponse {})
    }

    pub(super) fn list_snapshots(
        &self,
        req: ListSnapshotsRequest,
    ) -> Result<ListSnapshotsResponse, Status> {
        let state = self.tx(|s| Ok(s.clone()))?;
        let start = page_start(req.max_entries, &req.starting_token, state.next_seq)?;
        let mut snaps: Vec<&Snapshot> = state
            .snapshots
            .values()
            .filter(|x| req.snapshot_id.is_empty() || x.id == req.snapshot_id)
            .filter(|x| {
                req.source_volume_id.is_empty() || x.source_volume_id == req.source_volume_id
            })
            .filter(|x| x.seq >= start)
            .collect();
        snaps.sort_by_key(|x| x.seq);
        let next_token = cut_page(&mut snaps, req.max_entries, |x| x.seq);
        Ok(ListSnapshotsResponse {
            entries: snaps
                .into_iter()
                .map(|x| list_snapshots_response::Entry {
                    snapshot: Some(csi_snapshot(x)),
                })
                .collect(),
            next_token,
        })
    }
}

/// A snapshot as CSI has it; it is ready at once (nothing is copied).
fn csi_snapshot(x: &Snapshot) -> csiops_proto::csi::v1::Snapshot {
    csiops_proto::csi::v1::Snapshot {
        size_bytes: x.size_bytes,
        snapshot_id: x.id.clone(),
        source_volume_id: x.source_volume_id.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: x.creation_seconds,
            nanos: 0,
        }),
        ready_to_use: true,
        group_snapshot_id: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use csiops_proto::csi::v1::volume_content_source;

    use super::super::super::config::Config;
    use super::super::super::service::fixtures::{block_cap, create_from, mount_cap};
    use super::super::super::volume_data::SNAPSHOTS;
    use super::*;

    fn snapshot_of(d: &Driver, name: &str, volume: &str) -> String {
        d.create_snapshot(CreateSnapshotRequest {
            name: name.into(),
            source_volume_id: volume.into(),
            ..Default::default()
        })
        .unwrap()
        .snapshot
        .unwrap()
        .snapshot_id
    }

    #[test]
    fn with_a_data_dir_snapshots_and_clones_carry_the_data() {
        use volume_content_source::{SnapshotSource, Type, VolumeSource};
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let mut cfg = Config::new("/unused.sock", "n1", &dir.path().join("state"));
        cfg.data_dir = Some(data.clone());
        let d = Driver::new(&cfg).unwrap();

        // A filesystem volume: the snapshot is a copy as of its creation.
        let fs = create_from(&d, "fs", mount_cap(), 1 << 20, None);
        std::fs::write(data.join(&fs.id).join("f"), "before").unwrap();
        let snap = snapshot_of(&d, "s1", &fs.id);
        std::fs::write(data.join(&fs.id).join("f"), "after").unwrap();
        let restored = create_from(
            &d,
            "restored",
            mount_cap(),
            1 << 20,
            Some(Type::Snapshot(SnapshotSource {
                snapshot_id: snap.clone(),
            })),
        );
        let read = |id: &str| std::fs::read_to_string(data.join(id).join("f")).unwrap();
        assert_eq!(read(&restored.id), "before");
        let clone = create_from(
            &d,
            "clone",
            mount_cap(),
            1 << 20,
            Some(Type::Volume(VolumeSource {
                volume_id: fs.id.clone(),
            })),
        );
        assert_eq!(read(&clone.id), "after");

        // A block volume: its image is copied, holes kept, grown to the
        // new volume's size.
        let blk = create_from(&d, "blk", block_cap(), 4 << 20, None);
        let image = |id: &str| data.join(format!("{id}.img"));
        {
            use std::io::{Seek, Write};
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(image(&blk.id))
                .unwrap();
            f.seek(std::io::SeekFrom::Start(1 << 20)).unwrap();
            f.write_all(b"block data").unwrap();
        }
        let bsnap = snapshot_of(&d, "s2", &blk.id);
        let bigger = create_from(
            &d,
            "bigger",
            block_cap(),
            8 << 20,
            Some(Type::Snapshot(SnapshotSource {
                snapshot_id: bsnap.clone(),
            })),
        );
        let bytes = std::fs::read(image(&bigger.id)).unwrap();
        assert_eq!(bytes.len(), 8 << 20);
        assert_eq!(&bytes[1 << 20..(1 << 20) + 10], b"block data");

        // DeleteSnapshot removes its data.
        for id in [&snap, &bsnap] {
            d.delete_snapshot(DeleteSnapshotRequest {
                snapshot_id: id.to_string(),
                ..Default::default()
            })
            .unwrap();
        }
        let left: Vec<_> = std::fs::read_dir(data.join(SNAPSHOTS))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
