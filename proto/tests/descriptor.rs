//! Wire-compatibility facts about our .proto files, checked on the
//! descriptor set embedded at build time. The numbers below are those of the
//! published CSI v1.12.0 and kubelet pluginregistration v1 definitions.

use csiops_proto::descriptor_pool;
use prost_reflect::{Cardinality, Kind, MessageDescriptor};

fn message(name: &str) -> MessageDescriptor {
    descriptor_pool()
        .get_message_by_name(name)
        .unwrap_or_else(|| panic!("message {name} missing"))
}

/// (message, field, number, "type") where type is a scalar name, "map",
/// "repeated <type>", or a message/enum full name.
const FIELDS: &[(&str, &str, u32, &str)] = &[
    // Identity
    ("csi.v1.GetPluginInfoResponse", "name", 1, "string"),
    (
        "csi.v1.GetPluginInfoResponse",
        "vendor_version",
        2,
        "string",
    ),
    ("csi.v1.GetPluginInfoResponse", "manifest", 3, "map"),
    (
        "csi.v1.GetPluginCapabilitiesResponse",
        "capabilities",
        1,
        "repeated csi.v1.PluginCapability",
    ),
    (
        "csi.v1.PluginCapability",
        "service",
        1,
        "csi.v1.PluginCapability.Service",
    ),
    (
        "csi.v1.PluginCapability",
        "volume_expansion",
        2,
        "csi.v1.PluginCapability.VolumeExpansion",
    ),
    (
        "csi.v1.PluginCapability.Service",
        "type",
        1,
        "csi.v1.PluginCapability.Service.Type",
    ),
    (
        "csi.v1.ProbeResponse",
        "ready",
        1,
        "google.protobuf.BoolValue",
    ),
    // CreateVolume
    ("csi.v1.CreateVolumeRequest", "name", 1, "string"),
    (
        "csi.v1.CreateVolumeRequest",
        "capacity_range",
        2,
        "csi.v1.CapacityRange",
    ),
    (
        "csi.v1.CreateVolumeRequest",
        "volume_capabilities",
        3,
        "repeated csi.v1.VolumeCapability",
    ),
    ("csi.v1.CreateVolumeRequest", "parameters", 4, "map"),
    ("csi.v1.CreateVolumeRequest", "secrets", 5, "map"),
    (
        "csi.v1.CreateVolumeRequest",
        "volume_content_source",
        6,
        "csi.v1.VolumeContentSource",
    ),
    (
        "csi.v1.CreateVolumeRequest",
        "accessibility_requirements",
        7,
        "csi.v1.TopologyRequirement",
    ),
    ("csi.v1.CreateVolumeRequest", "mutable_parameters", 8, "map"),
    ("csi.v1.CreateVolumeResponse", "volume", 1, "csi.v1.Volume"),
    ("csi.v1.Volume", "capacity_bytes", 1, "int64"),
    ("csi.v1.Volume", "volume_id", 2, "string"),
    ("csi.v1.Volume", "volume_context", 3, "map"),
    (
        "csi.v1.Volume",
        "content_source",
        4,
        "csi.v1.VolumeContentSource",
    ),
    (
        "csi.v1.Volume",
        "accessible_topology",
        5,
        "repeated csi.v1.Topology",
    ),
    (
        "csi.v1.VolumeContentSource",
        "snapshot",
        1,
        "csi.v1.VolumeContentSource.SnapshotSource",
    ),
    (
        "csi.v1.VolumeContentSource",
        "volume",
        2,
        "csi.v1.VolumeContentSource.VolumeSource",
    ),
    ("csi.v1.CapacityRange", "required_bytes", 1, "int64"),
    ("csi.v1.CapacityRange", "limit_bytes", 2, "int64"),
    (
        "csi.v1.TopologyRequirement",
        "requisite",
        1,
        "repeated csi.v1.Topology",
    ),
    (
        "csi.v1.TopologyRequirement",
        "preferred",
        2,
        "repeated csi.v1.Topology",
    ),
    ("csi.v1.Topology", "segments", 1, "map"),
    (
        "csi.v1.VolumeCapability",
        "block",
        1,
        "csi.v1.VolumeCapability.BlockVolume",
    ),
    (
        "csi.v1.VolumeCapability",
        "mount",
        2,
        "csi.v1.VolumeCapability.MountVolume",
    ),
    (
        "csi.v1.VolumeCapability",
        "access_mode",
        3,
        "csi.v1.VolumeCapability.AccessMode",
    ),
    (
        "csi.v1.VolumeCapability.MountVolume",
        "fs_type",
        1,
        "string",
    ),
    (
        "csi.v1.VolumeCapability.MountVolume",
        "mount_flags",
        2,
        "repeated string",
    ),
    (
        "csi.v1.VolumeCapability.MountVolume",
        "volume_mount_group",
        3,
        "string",
    ),
    (
        "csi.v1.VolumeCapability.AccessMode",
        "mode",
        1,
        "csi.v1.VolumeCapability.AccessMode.Mode",
    ),
    ("csi.v1.DeleteVolumeRequest", "volume_id", 1, "string"),
    ("csi.v1.DeleteVolumeRequest", "secrets", 2, "map"),
    // Attach
    (
        "csi.v1.ControllerPublishVolumeRequest",
        "volume_id",
        1,
        "string",
    ),
    (
        "csi.v1.ControllerPublishVolumeRequest",
        "node_id",
        2,
        "string",
    ),
    (
        "csi.v1.ControllerPublishVolumeRequest",
        "volume_capability",
        3,
        "csi.v1.VolumeCapability",
    ),
    (
        "csi.v1.ControllerPublishVolumeRequest",
        "readonly",
        4,
        "bool",
    ),
    ("csi.v1.ControllerPublishVolumeRequest", "secrets", 5, "map"),
    (
        "csi.v1.ControllerPublishVolumeRequest",
        "volume_context",
        6,
        "map",
    ),
    (
        "csi.v1.ControllerPublishVolumeResponse",
        "publish_context",
        1,
        "map",
    ),
    (
        "csi.v1.ControllerUnpublishVolumeRequest",
        "volume_id",
        1,
        "string",
    ),
    (
        "csi.v1.ControllerUnpublishVolumeRequest",
        "node_id",
        2,
        "string",
    ),
    (
        "csi.v1.ControllerUnpublishVolumeRequest",
        "secrets",
        3,
        "map",
    ),
    // Capabilities, capacity, listing
    (
        "csi.v1.ControllerGetCapabilitiesResponse",
        "capabilities",
        1,
        "repeated csi.v1.ControllerServiceCapability",
    ),
    (
        "csi.v1.ControllerServiceCapability",
        "rpc",
        1,
        "csi.v1.ControllerServiceCapability.RPC",
    ),
    (
        "csi.v1.ControllerServiceCapability.RPC",
        "type",
        1,
        "csi.v1.ControllerServiceCapability.RPC.Type",
    ),
    (
        "csi.v1.GetCapacityRequest",
        "volume_capabilities",
        1,
        "repeated csi.v1.VolumeCapability",
    ),
    ("csi.v1.GetCapacityRequest", "parameters", 2, "map"),
    (
        "csi.v1.GetCapacityRequest",
        "accessible_topology",
        3,
        "csi.v1.Topology",
    ),
    (
        "csi.v1.GetCapacityResponse",
        "available_capacity",
        1,
        "int64",
    ),
    (
        "csi.v1.GetCapacityResponse",
        "maximum_volume_size",
        2,
        "google.protobuf.Int64Value",
    ),
    (
        "csi.v1.GetCapacityResponse",
        "minimum_volume_size",
        3,
        "google.protobuf.Int64Value",
    ),
    ("csi.v1.ListVolumesRequest", "max_entries", 1, "int32"),
    ("csi.v1.ListVolumesRequest", "starting_token", 2, "string"),
    (
        "csi.v1.ListVolumesResponse",
        "entries",
        1,
        "repeated csi.v1.ListVolumesResponse.Entry",
    ),
    ("csi.v1.ListVolumesResponse", "next_token", 2, "string"),
    (
        "csi.v1.ListVolumesResponse.VolumeStatus",
        "published_node_ids",
        1,
        "repeated string",
    ),
    (
        "csi.v1.ListVolumesResponse.VolumeStatus",
        "volume_condition",
        2,
        "csi.v1.VolumeCondition",
    ),
    (
        "csi.v1.ValidateVolumeCapabilitiesResponse",
        "confirmed",
        1,
        "csi.v1.ValidateVolumeCapabilitiesResponse.Confirmed",
    ),
    (
        "csi.v1.ValidateVolumeCapabilitiesResponse",
        "message",
        2,
        "string",
    ),
    (
        "csi.v1.ControllerExpandVolumeResponse",
        "node_expansion_required",
        2,
        "bool",
    ),
    (
        "csi.v1.ControllerModifyVolumeRequest",
        "mutable_parameters",
        3,
        "map",
    ),
    // Snapshots
    (
        "csi.v1.CreateSnapshotRequest",
        "source_volume_id",
        1,
        "string",
    ),
    ("csi.v1.CreateSnapshotRequest", "name", 2, "string"),
    ("csi.v1.CreateSnapshotRequest", "secrets", 3, "map"),
    ("csi.v1.CreateSnapshotRequest", "parameters", 4, "map"),
    ("csi.v1.Snapshot", "size_bytes", 1, "int64"),
    ("csi.v1.Snapshot", "snapshot_id", 2, "string"),
    ("csi.v1.Snapshot", "source_volume_id", 3, "string"),
    (
        "csi.v1.Snapshot",
        "creation_time",
        4,
        "google.protobuf.Timestamp",
    ),
    ("csi.v1.Snapshot", "ready_to_use", 5, "bool"),
    ("csi.v1.Snapshot", "group_snapshot_id", 6, "string"),
    // Node
    ("csi.v1.NodeStageVolumeRequest", "volume_id", 1, "string"),
    ("csi.v1.NodeStageVolumeRequest", "publish_context", 2, "map"),
    (
        "csi.v1.NodeStageVolumeRequest",
        "staging_target_path",
        3,
        "string",
    ),
    (
        "csi.v1.NodeStageVolumeRequest",
        "volume_capability",
        4,
        "csi.v1.VolumeCapability",
    ),
    ("csi.v1.NodeStageVolumeRequest", "secrets", 5, "map"),
    ("csi.v1.NodeStageVolumeRequest", "volume_context", 6, "map"),
    (
        "csi.v1.NodePublishVolumeRequest",
        "target_path",
        4,
        "string",
    ),
    (
        "csi.v1.NodePublishVolumeRequest",
        "volume_capability",
        5,
        "csi.v1.VolumeCapability",
    ),
    ("csi.v1.NodePublishVolumeRequest", "readonly", 6, "bool"),
    ("csi.v1.NodePublishVolumeRequest", "secrets", 7, "map"),
    (
        "csi.v1.NodePublishVolumeRequest",
        "volume_context",
        8,
        "map",
    ),
    ("csi.v1.NodeGetInfoResponse", "node_id", 1, "string"),
    (
        "csi.v1.NodeGetInfoResponse",
        "max_volumes_per_node",
        2,
        "int64",
    ),
    (
        "csi.v1.NodeGetInfoResponse",
        "accessible_topology",
        3,
        "csi.v1.Topology",
    ),
    (
        "csi.v1.NodeGetVolumeStatsResponse",
        "usage",
        1,
        "repeated csi.v1.VolumeUsage",
    ),
    ("csi.v1.VolumeUsage", "unit", 4, "csi.v1.VolumeUsage.Unit"),
    ("csi.v1.NodeExpandVolumeRequest", "secrets", 6, "map"),
    (
        "csi.v1.NodeServiceCapability",
        "rpc",
        1,
        "csi.v1.NodeServiceCapability.RPC",
    ),
    // Group snapshots, snapshot metadata
    (
        "csi.v1.VolumeGroupSnapshot",
        "group_snapshot_id",
        1,
        "string",
    ),
    (
        "csi.v1.VolumeGroupSnapshot",
        "snapshots",
        2,
        "repeated csi.v1.Snapshot",
    ),
    (
        "csi.v1.VolumeGroupSnapshot",
        "creation_time",
        3,
        "google.protobuf.Timestamp",
    ),
    ("csi.v1.VolumeGroupSnapshot", "ready_to_use", 4, "bool"),
    ("csi.v1.GetMetadataDeltaRequest", "secrets", 5, "map"),
    (
        "csi.v1.GetMetadataAllocatedResponse",
        "block_metadata_type",
        1,
        "csi.v1.BlockMetadataType",
    ),
    // Kubelet plugin registration
    ("pluginregistration.PluginInfo", "type", 1, "string"),
    ("pluginregistration.PluginInfo", "name", 2, "string"),
    ("pluginregistration.PluginInfo", "endpoint", 3, "string"),
    (
        "pluginregistration.PluginInfo",
        "supported_versions",
        4,
        "repeated string",
    ),
    (
        "pluginregistration.RegistrationStatus",
        "plugin_registered",
        1,
        "bool",
    ),
    (
        "pluginregistration.RegistrationStatus",
        "error",
        2,
        "string",
    ),
];

fn describe(kind: &Kind) -> String {
    match kind {
        Kind::Message(m) => m.full_name().to_owned(),
        Kind::Enum(e) => e.full_name().to_owned(),
        other => format!("{other:?}").to_lowercase(),
    }
}

#[test]
fn field_names_numbers_and_types() {
    let mut wrong = Vec::new();
    for &(msg, field, number, ty) in FIELDS {
        let Some(f) = message(msg).get_field_by_name(field) else {
            wrong.push(format!("{msg}.{field}: missing"));
            continue;
        };
        let actual_type = if f.is_map() {
            "map".to_owned()
        } else if f.cardinality() == Cardinality::Repeated {
            format!("repeated {}", describe(&f.kind()))
        } else {
            describe(&f.kind())
        };
        if f.number() != number || actual_type != ty {
            wrong.push(format!(
                "{msg}.{field}: want {number} {ty}, have {} {actual_type}",
                f.number()
            ));
        }
    }
    assert!(wrong.is_empty(), "mismatches:\n{}", wrong.join("\n"));
}

#[test]
fn maps_are_string_to_string() {
    for &(msg, field, _, ty) in FIELDS {
        if ty != "map" {
            continue;
        }
        let Kind::Message(entry) = message(msg).get_field_by_name(field).unwrap().kind() else {
            panic!("{msg}.{field} is not a map");
        };
        assert_eq!(entry.map_entry_key_field().kind(), Kind::String);
        assert_eq!(entry.map_entry_value_field().kind(), Kind::String);
    }
}

/// Exactly these fields carry `csi_secret`: every `secrets` map, and nothing else.
#[test]
fn secret_fields() {
    let pool = descriptor_pool();
    let secret = pool.get_extension_by_name("csi.v1.csi_secret").unwrap();
    assert_eq!(secret.number(), 1059);
    assert_eq!(
        secret.containing_message().full_name(),
        "google.protobuf.FieldOptions"
    );
    let alpha = pool.get_extension_by_name("csi.v1.alpha_field").unwrap();
    assert_eq!(alpha.number(), 1060);

    let mut found: Vec<String> = pool
        .all_messages()
        .flat_map(|m| m.fields().collect::<Vec<_>>())
        .filter(|f| {
            let options = f.options();
            options.has_extension(&secret) && options.get_extension(&secret).as_bool() == Some(true)
        })
        .map(|f| f.full_name().to_owned())
        .collect();
    found.sort();
    let mut want: Vec<String> = [
        "ControllerExpandVolumeRequest",
        "ControllerModifyVolumeRequest",
        "ControllerPublishVolumeRequest",
        "ControllerUnpublishVolumeRequest",
        "CreateSnapshotRequest",
        "CreateVolumeGroupSnapshotRequest",
        "CreateVolumeRequest",
        "DeleteSnapshotRequest",
        "DeleteVolumeGroupSnapshotRequest",
        "DeleteVolumeRequest",
        "GetMetadataAllocatedRequest",
        "GetMetadataDeltaRequest",
        "GetSnapshotRequest",
        "GetVolumeGroupSnapshotRequest",
        "ListSnapshotsRequest",
        "NodeExpandVolumeRequest",
        "NodePublishVolumeRequest",
        "NodeStageVolumeRequest",
        "ValidateVolumeCapabilitiesRequest",
    ]
    .iter()
    .map(|m| format!("csi.v1.{m}.secrets"))
    .collect();
    want.sort();
    assert_eq!(found, want);
}

#[test]
fn enum_values() {
    let pool = descriptor_pool();
    let facts: &[(&str, &str, i32)] = &[
        (
            "csi.v1.PluginCapability.Service.Type",
            "CONTROLLER_SERVICE",
            1,
        ),
        (
            "csi.v1.PluginCapability.Service.Type",
            "VOLUME_ACCESSIBILITY_CONSTRAINTS",
            2,
        ),
        (
            "csi.v1.PluginCapability.Service.Type",
            "GROUP_CONTROLLER_SERVICE",
            3,
        ),
        ("csi.v1.PluginCapability.VolumeExpansion.Type", "OFFLINE", 2),
        (
            "csi.v1.VolumeCapability.AccessMode.Mode",
            "SINGLE_NODE_WRITER",
            1,
        ),
        (
            "csi.v1.VolumeCapability.AccessMode.Mode",
            "MULTI_NODE_MULTI_WRITER",
            5,
        ),
        (
            "csi.v1.VolumeCapability.AccessMode.Mode",
            "SINGLE_NODE_MULTI_WRITER",
            7,
        ),
        (
            "csi.v1.ControllerServiceCapability.RPC.Type",
            "CREATE_DELETE_VOLUME",
            1,
        ),
        (
            "csi.v1.ControllerServiceCapability.RPC.Type",
            "PUBLISH_UNPUBLISH_VOLUME",
            2,
        ),
        (
            "csi.v1.ControllerServiceCapability.RPC.Type",
            "GET_CAPACITY",
            4,
        ),
        (
            "csi.v1.ControllerServiceCapability.RPC.Type",
            "PUBLISH_READONLY",
            8,
        ),
        (
            "csi.v1.ControllerServiceCapability.RPC.Type",
            "LIST_VOLUMES_PUBLISHED_NODES",
            10,
        ),
        (
            "csi.v1.ControllerServiceCapability.RPC.Type",
            "MODIFY_VOLUME",
            14,
        ),
        (
            "csi.v1.ControllerServiceCapability.RPC.Type",
            "GET_SNAPSHOT",
            15,
        ),
        (
            "csi.v1.NodeServiceCapability.RPC.Type",
            "STAGE_UNSTAGE_VOLUME",
            1,
        ),
        (
            "csi.v1.NodeServiceCapability.RPC.Type",
            "VOLUME_MOUNT_GROUP",
            6,
        ),
        ("csi.v1.VolumeUsage.Unit", "INODES", 2),
        ("csi.v1.BlockMetadataType", "VARIABLE_LENGTH", 2),
    ];
    for &(en, value, number) in facts {
        let e = pool.get_enum_by_name(en).unwrap_or_else(|| panic!("{en}"));
        let v = e
            .get_value_by_name(value)
            .unwrap_or_else(|| panic!("{en}.{value} missing"));
        assert_eq!(v.number(), number, "{en}.{value}");
    }
}

#[test]
fn services_and_methods() {
    let pool = descriptor_pool();
    let facts: &[(&str, &[&str])] = &[
        (
            "csi.v1.Identity",
            &["GetPluginInfo", "GetPluginCapabilities", "Probe"],
        ),
        (
            "csi.v1.Controller",
            &[
                "CreateVolume",
                "DeleteVolume",
                "ControllerPublishVolume",
                "ControllerUnpublishVolume",
                "ValidateVolumeCapabilities",
                "ListVolumes",
                "GetCapacity",
                "ControllerGetCapabilities",
                "CreateSnapshot",
                "DeleteSnapshot",
                "ListSnapshots",
                "GetSnapshot",
                "ControllerExpandVolume",
                "ControllerGetVolume",
                "ControllerModifyVolume",
            ],
        ),
        (
            "csi.v1.GroupController",
            &[
                "GroupControllerGetCapabilities",
                "CreateVolumeGroupSnapshot",
                "DeleteVolumeGroupSnapshot",
                "GetVolumeGroupSnapshot",
            ],
        ),
        (
            "csi.v1.SnapshotMetadata",
            &["GetMetadataAllocated", "GetMetadataDelta"],
        ),
        (
            "csi.v1.Node",
            &[
                "NodeStageVolume",
                "NodeUnstageVolume",
                "NodePublishVolume",
                "NodeUnpublishVolume",
                "NodeGetVolumeStats",
                "NodeExpandVolume",
                "NodeGetCapabilities",
                "NodeGetInfo",
            ],
        ),
        (
            "pluginregistration.Registration",
            &["GetInfo", "NotifyRegistrationStatus"],
        ),
    ];
    for &(service, methods) in facts {
        let s = pool
            .get_service_by_name(service)
            .unwrap_or_else(|| panic!("{service} missing"));
        let have: Vec<_> = s.methods().map(|m| m.name().to_owned()).collect();
        assert_eq!(have, methods, "{service}");
        for m in s.methods() {
            // Request/response types follow the <Method>Request/Response pattern,
            // except the registration API's.
            if service.starts_with("csi.v1.") {
                assert_eq!(m.input().name(), format!("{}Request", m.name()));
                assert_eq!(m.output().name(), format!("{}Response", m.name()));
            }
        }
    }
    let reg = pool
        .get_service_by_name("pluginregistration.Registration")
        .unwrap();
    let io: Vec<_> = reg
        .methods()
        .map(|m| {
            (
                m.input().full_name().to_owned(),
                m.output().full_name().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        io,
        [
            (
                "pluginregistration.InfoRequest".to_owned(),
                "pluginregistration.PluginInfo".to_owned()
            ),
            (
                "pluginregistration.RegistrationStatus".to_owned(),
                "pluginregistration.RegistrationStatusResponse".to_owned()
            ),
        ]
    );
    // Streaming only in SnapshotMetadata.
    let snap = pool.get_service_by_name("csi.v1.SnapshotMetadata").unwrap();
    assert!(snap
        .methods()
        .all(|m| m.is_server_streaming() && !m.is_client_streaming()));
}
