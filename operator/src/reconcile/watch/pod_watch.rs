//! The watch of the operator's pods: kube's list-then-watch, in protobuf.
//!
//! kube's `watcher` reads JSON only; this is the same protocol (a paged
//! list, then a watch from its resource version with bookmarks, a relist
//! when the API server says the version is gone) over kube's raw client,
//! asking for protobuf. Why protobuf, and what is read of a pod, is in
//! [`crate::pods::wire`]. Its events and errors are kube's
//! (`watcher::Event`, `watcher::Error`), so the pod cache and the back-off
//! around it are the ones every other watch uses.

use std::collections::VecDeque;
use std::io;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use http_body_util::BodyExt;
use kube::api::{ListParams, WatchParams};
use kube::client::Body;
use kube::core::Status;
use kube::runtime::watcher::{self, Event};
use kube::Client;

use crate::pods::wire::{self, Watched, WireError};
use crate::pods::PodView;

/// Pods per page of a list: the watches' page.
const PAGE: u32 = super::paging::LIST_PAGE;

/// How long the API server keeps one watch request open (kube's default);
/// the watch resumes from the last resource version after it.
const WATCH_SECONDS: u32 = 290;

/// Where the watch is.
enum Phase {
    /// (Re)start with a full list.
    Relist,
    /// Listing; the next page's continue token.
    Listing(Option<String>),
    /// Watching from a resource version; the open response body, if any.
    Watching {
        version: String,
        body: Option<http_body_util::BodyDataStream<Body>>,
    },
}

struct PodWatch {
    client: Client,
    selector: String,
    phase: Phase,
    frames: wire::Frames,
    queued: VecDeque<Event<PodView>>,
}

/// The pods matching the label `selector`, cluster-wide, as kube's
/// `watcher` would yield them. Never ends; errors are yielded and the watch
/// goes on (put a back-off around it).
pub fn watch(
    client: Client,
    selector: String,
) -> impl Stream<Item = Result<Event<PodView>, watcher::Error>> + Send + 'static {
    let state = PodWatch {
        client,
        selector,
        phase: Phase::Relist,
        frames: wire::Frames::default(),
        queued: VecDeque::new(),
    };
    futures::stream::unfold(state, |mut w| async move {
        let item = w.next().await;
        Some((item, w))
    })
}

/// A decoding failure as kube's error type.
fn unreadable(e: WireError) -> kube::Error {
    kube::Error::ReadEvents(io::Error::new(io::ErrorKind::InvalidData, e))
}

/// A protobuf Status as kube's.
fn status_of(s: wire::Status) -> Status {
    let code = s.code.and_then(|c| u16::try_from(c).ok()).unwrap_or(0);
    Status::failure(
        s.message.as_deref().unwrap_or_default(),
        s.reason.as_deref().unwrap_or_default(),
    )
    .with_code(code)
}

/// What an error response says: a protobuf Status, else its text.
fn error_status(code: http::StatusCode, body: &Bytes) -> Status {
    match wire::decode_object::<wire::Status>(body, "Status") {
        Ok(s) => status_of(s),
        Err(_) => {
            Status::failure(String::from_utf8_lossy(body).trim(), "").with_code(code.as_u16())
        }
    }
}

impl PodWatch {
    async fn next(&mut self) -> Result<Event<PodView>, watcher::Error> {
        loop {
            if let Some(event) = self.queued.pop_front() {
                return Ok(event);
            }
            match &mut self.phase {
                Phase::Relist => self.phase = Phase::Listing(None),
                Phase::Listing(token) => {
                    let token = token.clone();
                    match self.page(token).await {
                        Ok(next) => self.phase = next,
                        Err(e) => {
                            // A failed page starts the list over, as kube.
                            self.queued.clear();
                            self.phase = Phase::Relist;
                            return Err(watcher::Error::InitialListFailed(e));
                        }
                    }
                }
                Phase::Watching { version, body } => {
                    let Some(stream) = body else {
                        let version = version.clone();
                        let opened = match open(&self.client, &self.selector, &version).await {
                            Ok(opened) => opened,
                            Err(e) => {
                                // A version the API server no longer has
                                // can also be refused at the start (410).
                                if matches!(&e, kube::Error::Api(s) if s.code == 410) {
                                    self.phase = Phase::Relist;
                                }
                                return Err(watcher::Error::WatchStartFailed(e));
                            }
                        };
                        self.frames = wire::Frames::default();
                        self.phase = Phase::Watching {
                            version,
                            body: Some(opened),
                        };
                        continue;
                    };
                    match self.frames.next_frame() {
                        Ok(Some(frame)) => self.on_frame(frame)?,
                        Ok(None) => match stream.next().await {
                            Some(Ok(chunk)) => self.frames.push(&chunk),
                            Some(Err(e)) => {
                                *body = None;
                                return Err(watcher::Error::WatchFailed(e));
                            }
                            // The API server ended the request (its timeout):
                            // watch again from the last version.
                            None => *body = None,
                        },
                        Err(e) => {
                            self.phase = Phase::Relist;
                            return Err(watcher::Error::WatchFailed(unreadable(e)));
                        }
                    }
                }
            }
        }
    }
}

/// Sends a GET asking for protobuf; the body of a successful answer.
/// (Free functions, not methods: the response body is not `Sync`, so a
/// `&PodWatch` held over an await would make the stream not `Send`.)
async fn get(client: &Client, request: http::Request<Vec<u8>>) -> Result<Body, kube::Error> {
    let (mut parts, body) = request.into_parts();
    parts.headers.insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static(wire::PROTOBUF),
    );
    let response = client
        .send(http::Request::from_parts(parts, Body::from(body)))
        .await?;
    let code = response.status();
    if code.is_success() {
        return Ok(response.into_body());
    }
    let bytes = response.into_body().collect().await?.to_bytes();
    Err(kube::Error::Api(error_status(code, &bytes).boxed()))
}

/// Opens a watch from `version`.
async fn open(
    client: &Client,
    selector: &str,
    version: &str,
) -> Result<http_body_util::BodyDataStream<Body>, kube::Error> {
    let params = WatchParams::default()
        .labels(selector)
        .timeout(WATCH_SECONDS);
    let request = kube::core::Request::new("/api/v1/pods")
        .watch(&params, version)
        .map_err(kube::Error::BuildRequest)?;
    Ok(get(client, request).await?.into_data_stream())
}

impl PodWatch {
    /// Lists one page; the phase after it.
    async fn page(&mut self, token: Option<String>) -> Result<Phase, kube::Error> {
        let mut params = ListParams::default().labels(&self.selector).limit(PAGE);
        params.continue_token = token;
        let request = kube::core::Request::new("/api/v1/pods")
            .list(&params)
            .map_err(kube::Error::BuildRequest)?;
        let body = get(&self.client, request)
            .await?
            .collect()
            .await?
            .to_bytes();
        let list: wire::PodList = wire::decode_object(&body, "PodList").map_err(unreadable)?;
        // A list begins with its first page in: one that fails to come
        // begins nothing.
        if params.continue_token.is_none() {
            self.queued.push_back(Event::Init);
        }
        self.queued.extend(
            list.items
                .into_iter()
                .map(|pod| Event::InitApply(PodView::from(pod))),
        );
        let meta = list.metadata.unwrap_or_default();
        match meta.r#continue.filter(|c| !c.is_empty()) {
            Some(next) => Ok(Phase::Listing(Some(next))),
            None => {
                self.queued.push_back(Event::InitDone);
                let version = meta.resource_version.unwrap_or_default();
                Ok(Phase::Watching {
                    version,
                    body: None,
                })
            }
        }
    }

    /// Takes one frame of the watch.
    fn on_frame(&mut self, frame: Bytes) -> Result<(), watcher::Error> {
        let event = match wire::decode_event(frame) {
            Ok(e) => e,
            Err(e) => {
                // Not knowing what changed, start over from a list.
                self.phase = Phase::Relist;
                return Err(watcher::Error::WatchFailed(unreadable(e)));
            }
        };
        let Phase::Watching { version, body } = &mut self.phase else {
            return Ok(());
        };
        let mut resume = |pod: &wire::Pod| {
            if let Some(v) = pod
                .metadata
                .as_ref()
                .and_then(|m| m.resource_version.clone())
            {
                *version = v;
            }
        };
        match event {
            Watched::Added(pod) | Watched::Modified(pod) => {
                resume(&pod);
                self.queued.push_back(Event::Apply(pod.into()));
            }
            Watched::Deleted(pod) => {
                resume(&pod);
                self.queued.push_back(Event::Delete(pod.into()));
            }
            Watched::Bookmark(v) => {
                if let Some(v) = v {
                    *version = v;
                }
            }
            Watched::Error(status) => {
                *body = None;
                let status = status_of(status);
                // 410 Gone: the version is no longer kept; list again.
                if status.code == 410 {
                    self.phase = Phase::Relist;
                }
                return Err(watcher::Error::WatchError(status.boxed()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::wire::captured::{LIST, NOT_FOUND, WATCH};
    use crate::pods::wire::{enveloped, frame};
    use http::{Request, Response};
    use std::sync::{Arc, Mutex};

    fn pod(name: &str, version: &str) -> wire::Pod {
        wire::Pod {
            metadata: Some(wire::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(version.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn list(pods: Vec<wire::Pod>, version: &str) -> Bytes {
        enveloped(
            "PodList",
            &wire::PodList {
                metadata: Some(wire::ListMeta {
                    resource_version: Some(version.into()),
                    r#continue: None,
                }),
                items: pods,
            },
        )
    }

    fn gone() -> Vec<u8> {
        let status = wire::Status {
            status: Some("Failure".into()),
            message: Some("too old resource version: 1 (700)".into()),
            reason: Some("Expired".into()),
            code: Some(410),
        };
        frame("ERROR", enveloped("Status", &status))
    }

    /// A client whose API server answers the n-th request with the n-th
    /// reply (after the last, 500) and logs each request's query and
    /// Accept header.
    fn client(replies: Vec<(u16, Vec<u8>)>) -> (Client, Arc<Mutex<Vec<String>>>) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let log = Arc::new(Mutex::new(Vec::new()));
        let seen = log.clone();
        tokio::spawn(async move {
            let mut replies = replies.into_iter();
            while let Some((request, send)) = handle.next_request().await {
                let accept = request
                    .headers()
                    .get(http::header::ACCEPT)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                seen.lock().expect("log").push(format!(
                    "{} {}?{} [{accept}]",
                    request.method(),
                    request.uri().path(),
                    request.uri().query().unwrap_or_default()
                ));
                let (code, body) = replies.next().unwrap_or((500, Vec::new()));
                let response = Response::builder()
                    .status(code)
                    .header("content-type", wire::PROTOBUF)
                    .body(Body::from(body))
                    .expect("a response");
                send.send_response(response);
            }
        });
        (Client::new(service, "default"), log)
    }

    /// The first `n` items, each as a short line.
    async fn take(client: Client, n: usize) -> Vec<String> {
        watch(client, "app=x".into())
            .take(n)
            .map(|item| match item {
                Ok(Event::Init) => "Init".to_string(),
                Ok(Event::InitApply(p)) => format!("InitApply {}", p.name()),
                Ok(Event::InitDone) => "InitDone".to_string(),
                Ok(Event::Apply(p)) => format!("Apply {}", p.name()),
                Ok(Event::Delete(p)) => format!("Delete {}", p.name()),
                Err(watcher::Error::InitialListFailed(kube::Error::Api(s))) => {
                    format!("ListFailed {} {}", s.code, s.reason)
                }
                Err(watcher::Error::WatchError(s)) => format!("WatchError {}", s.code),
                Err(e) => format!("Err {e}"),
            })
            .collect()
            .await
    }

    #[tokio::test]
    async fn lists_page_by_page_then_watches_and_lists_again_when_the_version_is_gone() {
        // The watch: the captured ADDED, DELETED and BOOKMARK frames, then
        // the answer ends (its timeout); the second watch says 410 Gone.
        let bookmark = {
            let mut frames = wire::Frames::default();
            frames.push(WATCH);
            let mut last = None;
            while let Some(f) = frames.next_frame().expect("a frame") {
                last = Some(wire::decode_event(f).expect("an event"));
            }
            match last {
                Some(Watched::Bookmark(Some(v))) => v,
                other => panic!("the capture ends in a bookmark: {other:?}"),
            }
        };
        let (client, log) = client(vec![
            (200, LIST.to_vec()),
            (200, list(vec![pod("c", "600")], "600").to_vec()),
            (200, WATCH.to_vec()),
            (200, gone()),
            (404, NOT_FOUND.to_vec()),
            (200, list(vec![pod("d", "800")], "800").to_vec()),
        ]);
        let events = take(client, 12).await;
        let names: Vec<&str> = events.iter().map(String::as_str).collect();
        assert_eq!(names[0], "Init");
        assert!(names[1].starts_with("InitApply hostpath-"), "{names:?}");
        assert!(names[2].starts_with("InitApply hostpath-"), "{names:?}");
        assert_eq!(names[3..5], ["InitApply c", "InitDone"]);
        assert!(names[5].starts_with("Apply hostpath-node-"), "{names:?}");
        assert!(names[6].starts_with("Delete hostpath-node-"), "{names:?}");
        assert_eq!(
            names[7..],
            [
                "WatchError 410",
                "ListFailed 404 NotFound",
                "Init",
                "InitApply d",
                "InitDone"
            ]
        );

        let requests = log.lock().expect("log").clone();
        assert_eq!(requests.len(), 6, "{requests:#?}");
        for r in &requests {
            assert!(r.starts_with("GET /api/v1/pods?"), "{r}");
            assert!(r.contains("labelSelector=app%3Dx"), "{r}");
            assert!(r.ends_with(&format!("[{}]", wire::PROTOBUF)), "{r}");
        }
        assert!(
            requests[0].contains(&format!("limit={PAGE}")) && !requests[0].contains("continue=")
        );
        assert!(
            requests[1].contains("continue="),
            "the second page: {}",
            requests[1]
        );
        // The first watch starts at the list's version, the second at the
        // bookmark's; both with bookmarks and the API server's timeout.
        assert!(
            requests[2].contains("watch=true") && requests[2].contains("resourceVersion=600 "),
            "{}",
            requests[2]
        );
        assert!(
            requests[2].contains("allowWatchBookmarks=true"),
            "{}",
            requests[2]
        );
        assert!(
            requests[2].contains("timeoutSeconds=290"),
            "{}",
            requests[2]
        );
        assert!(
            requests[3].contains(&format!("resourceVersion={bookmark} ")),
            "{}",
            requests[3]
        );
        // After 410 a list again (which failed, and was tried again).
        assert!(!requests[4].contains("watch=") && !requests[5].contains("watch="));
    }

    #[tokio::test]
    async fn an_unreadable_frame_or_a_gone_version_at_the_start_lists_again() {
        let mut garbage = 3u32.to_be_bytes().to_vec();
        garbage.extend([0xff, 0xff, 0xff]);
        let expired = wire::Status {
            code: Some(410),
            reason: Some("Expired".into()),
            ..Default::default()
        };
        let (client, log) = client(vec![
            (200, list(vec![], "5").to_vec()),
            (200, garbage),
            (200, list(vec![pod("e", "6")], "6").to_vec()),
            (410, enveloped("Status", &expired).to_vec()),
            (200, list(vec![pod("f", "7")], "7").to_vec()),
        ]);
        let events = take(client, 10).await;
        assert_eq!(events[..2], ["Init", "InitDone"]);
        assert!(
            events[2].starts_with("Err watch stream failed"),
            "{events:?}"
        );
        assert_eq!(events[3..6], ["Init", "InitApply e", "InitDone"]);
        // A watch refused at its start as 410 lists again too.
        assert!(
            events[6].starts_with("Err failed to start watching"),
            "{events:?}"
        );
        assert_eq!(events[7..], ["Init", "InitApply f", "InitDone"]);
        assert_eq!(log.lock().expect("log").len(), 5);
    }
}
