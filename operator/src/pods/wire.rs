//! Pods as kube-apiserver sends them in protobuf, read as far as
//! [`PodView`](super::PodView) needs.
//!
//! Why protobuf: kube-controller-manager and kwok (client-go 0.36) watch
//! pods in protobuf, and the API server encodes each watch event once per
//! wire format and shares it between watchers. A JSON watch of the
//! operator's pods made the API server encode every pod change of a node
//! roll a second time, for the operator alone, and the operator parse
//! every byte of it (a pod is 7–10 KB, most of it `managedFields` and the
//! spec, which are never read). In protobuf the unread fields are skipped
//! by their length without being looked at.
//!
//! The messages are generated from `proto/kubernetes/*.proto` (the
//! `csiops-proto` crate): Kubernetes' own `generated.proto` messages with
//! only the fields read, under their field numbers. Every other field is
//! skipped by prost.
//!
//! The wire (checked against kube-apiserver v1.34.4): a list or a single
//! object is `k8s\0` followed by an [`Unknown`] whose `raw` is the object;
//! a watch is a sequence of frames, a 4-byte big-endian length and a bare
//! [`WatchEvent`], whose `object.raw` is again `k8s\0` and an [`Unknown`].

use bytes::Bytes;
use prost::Message;

pub use csiops_proto::kubernetes::k8s::io::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, Pod,
    PodCondition, PodList, PodSpec, PodStatus,
};
pub use csiops_proto::kubernetes::k8s::io::apimachinery::pkg::apis::meta::v1::{
    ListMeta, ObjectMeta, Status, Time, WatchEvent,
};
pub use csiops_proto::kubernetes::k8s::io::apimachinery::pkg::runtime::{
    RawExtension, TypeMeta, Unknown,
};

/// What starts every protobuf-encoded object.
pub const MAGIC: &[u8] = b"k8s\0";

/// The media type to ask for.
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("not a protobuf-encoded Kubernetes object (no k8s\\0 prefix)")]
    NoMagic,
    #[error("a {got} where a {want} was expected")]
    Kind { want: &'static str, got: String },
    #[error("undecodable protobuf: {0}")]
    Decode(String),
    #[error("a watch frame of {0} bytes is larger than the 64 MiB allowed")]
    FrameTooLarge(usize),
}

impl From<prost::DecodeError> for WireError {
    fn from(e: prost::DecodeError) -> Self {
        WireError::Decode(e.to_string())
    }
}

/// The object of kind `want` in an enveloped encoding (`k8s\0` + Unknown).
pub fn decode_object<T: Message + Default>(
    bytes: &Bytes,
    want: &'static str,
) -> Result<T, WireError> {
    let rest = bytes.strip_prefix(MAGIC).ok_or(WireError::NoMagic)?;
    let envelope = Unknown::decode(bytes.slice(bytes.len() - rest.len()..))?;
    let kind = envelope.type_meta.and_then(|t| t.kind).unwrap_or_default();
    if kind != want {
        return Err(WireError::Kind { want, got: kind });
    }
    Ok(T::decode(envelope.raw.unwrap_or_default())?)
}

/// The largest watch frame taken: a pod is some kilobytes, and the API
/// server's own request limit is far below this.
const MAX_FRAME: usize = 64 << 20;

/// Splits a watch body into its frames as the bytes arrive.
#[derive(Debug, Default)]
pub struct Frames {
    buf: bytes::BytesMut,
}

impl Frames {
    /// Adds bytes read from the body.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next whole frame, if one is in.
    pub fn next_frame(&mut self) -> Result<Option<Bytes>, WireError> {
        let Some(head) = self.buf.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if len > MAX_FRAME {
            return Err(WireError::FrameTooLarge(len));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let mut frame = self.buf.split_to(4 + len);
        Ok(Some(frame.split_off(4).freeze()))
    }

    /// Whether bytes of an unfinished frame are left.
    pub fn is_partial(&self) -> bool {
        !self.buf.is_empty()
    }
}

/// One watch event, decoded.
#[derive(Debug)]
pub enum Watched {
    Added(Pod),
    Modified(Pod),
    Deleted(Pod),
    /// Only the resource version to resume from.
    Bookmark(Option<String>),
    Error(Status),
}

/// Decodes one frame of a pod watch.
pub fn decode_event(frame: Bytes) -> Result<Watched, WireError> {
    let event = WatchEvent::decode(frame)?;
    let raw = event.object.and_then(|o| o.raw).unwrap_or_default();
    let kind = event.r#type.unwrap_or_default();
    Ok(match kind.as_str() {
        "ADDED" => Watched::Added(decode_object(&raw, "Pod")?),
        "MODIFIED" => Watched::Modified(decode_object(&raw, "Pod")?),
        "DELETED" => Watched::Deleted(decode_object(&raw, "Pod")?),
        "BOOKMARK" => {
            let pod: Pod = decode_object(&raw, "Pod")?;
            Watched::Bookmark(pod.metadata.and_then(|m| m.resource_version))
        }
        "ERROR" => Watched::Error(decode_object(&raw, "Status")?),
        other => {
            return Err(WireError::Decode(format!(
                "a watch event of unknown type {other:?}"
            )))
        }
    })
}

/// Encodes `message` as the API server does an object of `kind` (for the
/// tests).
#[cfg(test)]
pub(crate) fn enveloped(kind: &str, message: &impl Message) -> Bytes {
    let envelope = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some("v1".into()),
            kind: Some(kind.into()),
        }),
        raw: Some(message.encode_to_vec().into()),
    };
    let mut out = MAGIC.to_vec();
    out.extend(envelope.encode_to_vec());
    out.into()
}

/// One watch frame of an event of `kind` about `object` (enveloped), for
/// the tests.
#[cfg(test)]
pub(crate) fn frame(kind: &str, object: Bytes) -> Vec<u8> {
    let event = WatchEvent {
        r#type: Some(kind.into()),
        object: Some(RawExtension { raw: Some(object) }),
    }
    .encode_to_vec();
    let mut out = (event.len() as u32).to_be_bytes().to_vec();
    out.extend(event);
    out
}

/// Captured from kube-apiserver v1.34.4 (the demo cluster, 2026-11-28):
/// a list of the operator's pods with `limit=2`, three frames of a watch
/// of them (a node pod ADDED, one DELETED, a BOOKMARK) and the Status of a
/// 404. For the tests of this module and of the pod watch.
#[cfg(test)]
pub(crate) mod captured {
    pub const LIST: &[u8] = include_bytes!("testdata/pod-list.bin");
    pub const WATCH: &[u8] = include_bytes!("testdata/pod-watch.bin");
    pub const NOT_FOUND: &[u8] = include_bytes!("testdata/status-not-found.bin");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::PodView;
    use crate::render::labels::INSTANCE;

    use captured::{LIST, NOT_FOUND, WATCH};

    #[test]
    fn reads_a_list_as_kube_apiserver_sends_it() {
        let list: PodList = decode_object(&Bytes::from_static(LIST), "PodList").expect("a list");
        let meta = list.metadata.expect("list metadata");
        assert_eq!(meta.resource_version.as_deref(), Some("580"));
        assert!(
            meta.r#continue.is_some_and(|c| !c.is_empty()),
            "limit=2 leaves more"
        );
        let pods: Vec<PodView> = list.items.into_iter().map(PodView::from).collect();
        assert_eq!(pods.len(), 2);
        for pod in &pods {
            assert_eq!(&*pod.namespace, "csi-walkthrough");
            assert_eq!(pod.label(INSTANCE), Some("hostpath"));
            assert_eq!(pod.phase.as_deref(), Some("Running"));
            assert!(pod.is_ready(), "{pod:?}");
            assert!(pod.ready.as_ref().and_then(|c| c.since).is_some());
            assert!(pod.node.is_some());
            assert!(pod.containers >= 3, "{pod:?}");
            assert!(!pod.deleting());
            // Go writes every string field, empty or not; JSON leaves the
            // empty ones out, and so must the view.
            assert_eq!(pod.message, None);
            let ready = pod.ready.as_ref().expect("Ready");
            assert_eq!((&ready.reason, &ready.message), (&None, &None));
        }
    }

    #[test]
    fn reads_watch_frames_however_the_bytes_are_cut() {
        for chunk in [1, 7, 4096, WATCH.len()] {
            let mut frames = Frames::default();
            let mut events = Vec::new();
            for piece in WATCH.chunks(chunk) {
                frames.push(piece);
                while let Some(frame) = frames.next_frame().expect("a frame") {
                    events.push(decode_event(frame).expect("an event"));
                }
            }
            assert!(!frames.is_partial());
            let [Watched::Added(added), Watched::Deleted(deleted), Watched::Bookmark(at)] =
                &events[..]
            else {
                panic!("cut at {chunk}: {events:?}");
            };
            let added = PodView::from(added.clone());
            assert!(added.name().starts_with("hostpath-node-"), "{added:?}");
            assert_eq!(added.label(INSTANCE), Some("hostpath"));
            let deleted = PodView::from(deleted.clone());
            assert!(
                deleted.deleting(),
                "a deleted pod was terminating: {deleted:?}"
            );
            assert!(
                at.as_deref().is_some_and(|v| v.parse::<u64>().is_ok()),
                "{at:?}"
            );
        }
    }

    #[test]
    fn reads_an_error_status() {
        let status: Status =
            decode_object(&Bytes::from_static(NOT_FOUND), "Status").expect("a status");
        assert_eq!(status.code, Some(404));
        assert_eq!(status.reason.as_deref(), Some("NotFound"));
        assert_eq!(status.message.as_deref(), Some("pods \"x\" not found"));
    }

    #[test]
    fn refuses_what_is_not_the_object_asked_for() {
        assert_eq!(
            decode_object::<Pod>(&Bytes::from_static(b"{\"kind\":\"Pod\"}"), "Pod"),
            Err(WireError::NoMagic)
        );
        assert_eq!(
            decode_object::<Pod>(&Bytes::from_static(NOT_FOUND), "Pod"),
            Err(WireError::Kind {
                want: "Pod",
                got: "Status".into()
            })
        );
        let mut frames = Frames::default();
        frames.push(&u32::MAX.to_be_bytes());
        assert_eq!(
            frames.next_frame(),
            Err(WireError::FrameTooLarge(u32::MAX as usize))
        );
        let odd = frame("RESYNC", enveloped("Pod", &Pod::default()));
        assert!(matches!(
            decode_event(Bytes::from(odd[4..].to_vec())),
            Err(WireError::Decode(m)) if m.contains("RESYNC")
        ));
    }

    #[test]
    fn a_protobuf_pod_reads_as_the_same_pod_in_json() {
        let time = |seconds| {
            Some(Time {
                seconds: Some(seconds),
            })
        };
        let waiting = |reason: &str, message: &str| ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.into()),
                message: Some(message.into()),
            }),
            terminated: None,
        };
        let pod = Pod {
            metadata: Some(ObjectMeta {
                name: Some("d-node-x".into()),
                namespace: Some("ns".into()),
                resource_version: Some("9".into()),
                deletion_timestamp: time(1_795_251_600),
                labels: [
                    (INSTANCE.to_string(), "d".to_string()),
                    ("other".into(), "o".into()),
                ]
                .into(),
            }),
            spec: Some(PodSpec {
                node_name: Some("n1".into()),
            }),
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                message: Some("m".into()),
                conditions: vec![
                    PodCondition {
                        r#type: Some("Ready".into()),
                        status: Some("False".into()),
                        last_transition_time: time(1_795_251_000),
                        reason: Some("ContainersNotReady".into()),
                        message: Some("not yet".into()),
                    },
                    PodCondition {
                        r#type: Some("PodScheduled".into()),
                        status: Some("True".into()),
                        last_transition_time: time(1_795_250_000),
                        // As Go sends them: empty strings, not absent.
                        reason: Some(String::new()),
                        message: Some(String::new()),
                    },
                ],
                container_statuses: vec![
                    ContainerStatus {
                        name: Some("driver".into()),
                        state: Some(waiting("CrashLoopBackOff", "back-off 20s")),
                        last_state: Some(ContainerState {
                            waiting: None,
                            terminated: Some(ContainerStateTerminated {
                                message: Some("no socket\n".into()),
                            }),
                        }),
                    },
                    ContainerStatus {
                        name: Some("registrar".into()),
                        state: Some(waiting("ContainerCreating", "")),
                        last_state: None,
                    },
                ],
            }),
        };
        let json: PodView = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "d-node-x", "namespace": "ns", "resourceVersion": "9",
                "deletionTimestamp": "2026-11-21T09:00:00Z",
                "labels": {INSTANCE: "d", "other": "o"}},
            "spec": {"nodeName": "n1"},
            "status": {"phase": "Pending", "message": "m", "conditions": [
                {"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-21T08:50:00Z",
                 "reason": "ContainersNotReady", "message": "not yet"},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-21T08:33:20Z"}],
              "containerStatuses": [
                {"name": "driver", "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}},
                 "lastState": {"terminated": {"message": "no socket\n"}}},
                {"name": "registrar", "state": {"waiting": {"reason": "ContainerCreating", "message": ""}}}]}
        }))
        .expect("a pod");
        // Through the wire, as the watch reads it.
        let decoded: Pod = decode_object(&enveloped("Pod", &pod), "Pod").expect("a pod");
        assert_eq!(PodView::from(decoded), json);
        assert_eq!(
            json.waiting[0].message.as_deref(),
            Some("no socket (back-off 20s)")
        );
        assert_eq!((json.containers, json.creating), (2, 1));
    }
}
