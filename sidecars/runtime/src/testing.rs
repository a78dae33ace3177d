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

    /// The calls that change something (not GET), as `METHOD path`.
    pub fn writes(&self) -> Vec<String> {
        self.calls()
            .iter()
            .filter(|c| c.method != "GET")
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
        assert_eq!(
            merge(
                &json!({"a": 1, "b": {"c": 2}}),
                &json!({"b": {"c": null, "d": 3}})
            ),
            json!({"a": 1, "b": {"d": 3}})
        );
    }
}
