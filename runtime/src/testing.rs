//! A fake API server for tests of imperative code, in the style of kube-rs'
//! controller-rs `fixtures.rs`: a [`kube::Client`] over a `tower-test` mock
//! service, whose requests are answered by a test's own function and
//! recorded in order, so a test can assert the exact sequence of requests
//! (and interleave other calls, such as a fake CSI driver's, in the same
//! [`Log`]).

use std::sync::{Arc, Mutex, PoisonError};

use http::{Request, Response};
use kube::client::Body;
use serde_json::{json, Value};

/// One request the code under test sent (or another call a test logs).
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// `GET`, `PATCH`, … (or what the test logs, e.g. `CSI`).
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The query string, if any.
    pub query: String,
    /// The JSON body (`Null` for none).
    pub body: Value,
}

impl Call {
    /// `"METHOD path"`, for compact assertions.
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }

    /// A server-side dry run (`dryRun=All`): answered, never stored.
    pub fn is_dry_run(&self) -> bool {
        self.query.split('&').any(|q| q == "dryRun=All")
    }
}

/// The calls so far, shared between the fake server and the test.
#[derive(Clone, Debug, Default)]
pub struct Log(Arc<Mutex<Vec<Call>>>);

impl Log {
    /// Appends a call (the fake server does; tests may for other calls).
    pub fn push(&self, call: Call) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(call);
    }

    /// Appends `METHOD path` with no body.
    pub fn note(&self, method: &str, path: &str) {
        self.push(Call {
            method: method.to_string(),
            path: path.to_string(),
            query: String::new(),
            body: Value::Null,
        });
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Every call so far as `METHOD path`.
    pub fn lines(&self) -> Vec<String> {
        self.calls().iter().map(Call::line).collect()
    }

    /// The calls that change something (not GET, not a dry run), as
    /// `METHOD path`.
    pub fn writes(&self) -> Vec<String> {
        self.calls()
            .iter()
            .filter(|c| c.method != "GET" && !c.is_dry_run())
            .map(Call::line)
            .collect()
    }

    /// Forgets the calls so far.
    pub fn clear(&self) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// An answer of the fake server: status code and JSON body.
pub type Reply = (u16, Value);

/// A `404 NotFound` Status, as the API server sends it.
pub fn not_found() -> Reply {
    status(404, "NotFound", "not found")
}

/// A failure Status with `code`, `reason` and `message`.
pub fn status(code: u16, reason: &str, message: &str) -> Reply {
    (
        code,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": message, "reason": reason, "code": code,
        }),
    )
}

/// A client whose every request is logged in `log` and answered by
/// `answer`. The server runs on the current tokio runtime until the client
/// is dropped.
pub fn client(log: &Log, answer: impl Fn(&Call) -> Reply + Send + Sync + 'static) -> kube::Client {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server_log = log.clone();
    tokio::spawn(async move {
        while let Some((request, send)) = handle.next_request().await {
            let (parts, body) = request.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let body = if bytes.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&bytes)
                    .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
            };
            let call = Call {
                method: parts.method.to_string(),
                path: parts.uri.path().to_string(),
                query: parts.uri.query().unwrap_or_default().to_string(),
                body,
            };
            server_log.push(call.clone());
            let (code, reply) = answer(&call);
            let response = Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&reply).unwrap_or_default()))
                .expect("a valid response");
            send.send_response(response);
        }
    });
    kube::Client::new(service, "default")
}

/// An API server that keeps what is written, for [`client`]:
/// - `GET` of an object answers it (or 404), of a collection lists what is
///   stored under it;
/// - `PATCH` (of an object or its `/status`) applies a JSON patch (an array
///   body) or merges the body (merge, strategic and apply patches alike)
///   into the stored object; an apply of a whole object (with `kind`)
///   creates it; anything else is 404;
/// - `POST` stores a new object (409 if it exists), an Event is accepted
///   and not stored; a dry run (`dryRun=All`) is answered as its write
///   would be, and not stored; `PUT` replaces an object, refused with a 409
///   `Conflict` when the body's resourceVersion is not the stored one (the
///   API server's optimistic lock); `DELETE` removes.
///
/// Every write gets a new resourceVersion (and a uid when it has none) and
/// is handed to the [`on_write`](Objects::on_write) hook, as a watch would.
#[derive(Clone, Default)]
pub struct Objects(Arc<Mutex<ObjectsState>>);

type WriteHook = Arc<dyn Fn(&Value) + Send + Sync>;

#[derive(Default)]
struct ObjectsState {
    objects: std::collections::BTreeMap<String, Value>,
    version: u64,
    on_write: Option<WriteHook>,
}

impl Objects {
    /// A server holding `objects` by path.
    pub fn new<'a>(objects: impl IntoIterator<Item = (&'a str, Value)>) -> Self {
        let this = Objects::default();
        {
            let mut state = this.state();
            state.version = 100;
            state
                .objects
                .extend(objects.into_iter().map(|(p, v)| (p.to_string(), v)));
        }
        this
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ObjectsState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Calls `hook` with every object written.
    pub fn on_write(&self, hook: impl Fn(&Value) + Send + Sync + 'static) {
        self.state().on_write = Some(Arc::new(hook));
    }

    /// The object stored at `path`.
    pub fn get(&self, path: &str) -> Option<Value> {
        self.state().objects.get(path).cloned()
    }

    /// Stores `object` at `path`, as if someone else had written it (a
    /// user's edit between two reconciliations).
    pub fn put(&self, path: &str, object: Value) {
        self.state().objects.insert(path.to_string(), object);
    }

    /// Removes an object, as if deleted by someone else.
    pub fn remove(&self, path: &str) -> Option<Value> {
        self.state().objects.remove(path)
    }

    /// The answer to `call` (pass `move |c| objects.answer(c)` to [`client`]).
    pub fn answer(&self, call: &Call) -> Reply {
        let path = call.path.trim_end_matches("/status");
        let mut state = self.state();
        let written = match call.method.as_str() {
            "GET" if is_collection(path) => {
                let prefix = format!("{path}/");
                let items: Vec<Value> = state
                    .objects
                    .iter()
                    .filter(|(p, _)| p.starts_with(&prefix) || in_all_namespaces(path, p))
                    .map(|(_, o)| o.clone())
                    .collect();
                return (
                    200,
                    json!({"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items}),
                );
            }
            "GET" => {
                return match state.objects.get(path) {
                    Some(o) => (200, o.clone()),
                    None => not_found(),
                }
            }
            "DELETE" => {
                return match state.objects.remove(path) {
                    Some(o) => (200, o),
                    None => not_found(),
                }
            }
            "POST" if path.ends_with("/events") => return (201, call.body.clone()),
            "POST" => {
                let name = call.body["metadata"]["name"].as_str().unwrap_or_default();
                let path = format!("{path}/{name}");
                if state.objects.contains_key(&path) {
                    return status(409, "AlreadyExists", "already exists");
                }
                (path, 201, call.body.clone())
            }
            "PUT" => {
                let Some(current) = state.objects.get(path) else {
                    return not_found();
                };
                let sent = &call.body["metadata"]["resourceVersion"];
                if !sent.is_null() && sent != &current["metadata"]["resourceVersion"] {
                    return status(
                        409,
                        "Conflict",
                        "the object has been modified; please apply your changes to the latest version and try again",
                    );
                }
                (path.to_string(), 200, call.body.clone())
            }
            "PATCH" => {
                let current = match state.objects.get(path) {
                    Some(o) => o.clone(),
                    None if call.body.get("kind").is_some() => json!({}),
                    None => return not_found(),
                };
                let new = match &call.body {
                    Value::Array(_) => {
                        let mut doc = current;
                        let applied =
                            serde_json::from_value::<json_patch::Patch>(call.body.clone())
                                .ok()
                                .is_some_and(|p| json_patch::patch(&mut doc, &p).is_ok());
                        if !applied {
                            return status(422, "Invalid", "the JSON patch does not apply");
                        }
                        doc
                    }
                    body => merge(&current, body),
                };
                (path.to_string(), 200, new)
            }
            _ => return not_found(),
        };
        let (path, code, mut new) = written;
        if call.is_dry_run() {
            return (code, new);
        }
        state.version += 1;
        new["metadata"]["resourceVersion"] = json!(state.version.to_string());
        if new["metadata"]["uid"].is_null() {
            new["metadata"]["uid"] = json!(format!("uid-{}", state.version));
        }
        state.objects.insert(path, new.clone());
        let hook = state.on_write.clone();
        drop(state);
        if let Some(hook) = hook {
            hook(&new);
        }
        (code, new)
    }
}

/// Whether `object` (`…/namespaces/<ns>/<plural>/<name>`) is in the list
/// of all namespaces `collection` (`…/<plural>`, no namespace) asks for.
fn in_all_namespaces(collection: &str, object: &str) -> bool {
    if collection.contains("/namespaces/") {
        return false;
    }
    let Some((base, plural)) = collection.rsplit_once('/') else {
        return false;
    };
    let Some(rest) = object.strip_prefix(&format!("{base}/namespaces/")) else {
        return false;
    };
    let parts: Vec<&str> = rest.split('/').collect();
    parts.len() == 3 && parts[1] == plural
}

/// Whether `path` names a collection: `/api/v1[/namespaces/<ns>]/<plural>`
/// or `/apis/<group>/<version>[/namespaces/<ns>]/<plural>`.
fn is_collection(path: &str) -> bool {
    let segments = path.trim_matches('/').split('/').count();
    if path.starts_with("/apis/") {
        segments.is_multiple_of(2)
    } else {
        !segments.is_multiple_of(2)
    }
}

/// `body` merged over `base` (RFC 7386 merge patch), for fake servers that
/// answer a PATCH with the patched object.
pub fn merge(base: &Value, patch: &Value) -> Value {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            let mut out = b.clone();
            for (k, v) in p {
                if v.is_null() {
                    out.remove(k);
                } else {
                    let merged = merge(out.get(k).unwrap_or(&Value::Null), v);
                    out.insert(k.clone(), merged);
                }
            }
            Value::Object(out)
        }
        (_, p) => p.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::Api;

    #[tokio::test]
    async fn a_put_at_a_stale_version_is_a_conflict() {
        let log = Log::default();
        let path = "/api/v1/namespaces/default/configmaps/a";
        let objects = Objects::new([(
            path,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "a", "namespace": "default", "resourceVersion": "5"}}),
        )]);
        let answer = objects.clone();
        let api: Api<ConfigMap> = Api::default_namespaced(client(&log, move |c| answer.answer(c)));
        let mut cm = api.get("a").await.expect("stored");
        cm.data = Some([("k".to_string(), "v".to_string())].into());
        let written = api
            .replace("a", &Default::default(), &cm)
            .await
            .expect("at the stored version");
        assert_ne!(written.metadata.resource_version.as_deref(), Some("5"));
        assert_eq!(objects.get(path).expect("kept")["data"]["k"], json!("v"));
        // The copy read before that write is stale now.
        match api.replace("a", &Default::default(), &cm).await {
            Err(kube::Error::Api(s)) => assert!(s.is_conflict(), "{s:?}"),
            other => panic!("want a conflict, got {other:?}"),
        }
        objects.remove(path);
        match api.replace("a", &Default::default(), &cm).await {
            Err(kube::Error::Api(s)) => assert!(s.is_not_found(), "{s:?}"),
            other => panic!("want a 404, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn requests_are_answered_and_logged_in_order() {
        let log = Log::default();
        let client = client(&log, |call| match call.method.as_str() {
            "GET" => not_found(),
            _ => (
                201,
                json!({"metadata": {"name": "a", "namespace": "default"}}),
            ),
        });
        let api: Api<ConfigMap> = Api::default_namespaced(client);
        assert!(api.get_opt("a").await.expect("a 404 is None").is_none());
        let cm = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("a".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        api.create(&Default::default(), &cm).await.expect("created");
        assert_eq!(
            log.lines(),
            vec![
                "GET /api/v1/namespaces/default/configmaps/a",
                "POST /api/v1/namespaces/default/configmaps"
            ]
        );
        assert_eq!(log.writes().len(), 1);
        assert!(is_collection("/api/v1/persistentvolumes"));
        assert!(!is_collection("/api/v1/namespaces/ns/pods/p"));
        assert!(is_collection("/apis/apps/v1/namespaces/ns/daemonsets"));
        assert!(!is_collection("/apis/storage.k8s.io/v1/csidrivers/d"));
        assert_eq!(
            merge(
                &json!({"a": 1, "b": {"c": 2}}),
                &json!({"b": {"c": null, "d": 3}})
            ),
            json!({"a": 1, "b": {"d": 3}})
        );
    }
}
