//! Request counters for benchmarks: kube-apiserver's own
//! (`apiserver_request_total{verb,resource,…}`, every client), and a
//! client's own count of what it sent ([`own_requests`]).

use crate::{Error, Result};

/// One request kind: which resource and verb.
pub type Kind<'a> = (&'a str, &'a str);

/// kube-apiserver's `/metrics` text.
pub async fn text(client: &kube::Client) -> Result<String> {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| Error::Other(format!("metrics request: {e}")))?;
    client
        .request_text(req)
        .await
        .map_err(|e| Error::Other(format!("reading kube-apiserver metrics: {e}")))
}

/// The sum of `apiserver_request_total` over the `(resource, verb)` pairs of
/// `kinds` (all response codes, all subresources).
pub async fn requests(client: &kube::Client, kinds: &[Kind<'_>]) -> Result<f64> {
    Ok(sum(&text(client).await?, kinds))
}

/// [`requests`] over a metrics text.
pub fn sum(text: &str, kinds: &[Kind<'_>]) -> f64 {
    sum_where(text, "apiserver_request_total", |l| {
        let (verb, resource) = (l.get("verb"), l.get("resource"));
        kinds.iter().any(|&(r, v)| r == resource && v == verb)
    })
}

/// The labels of one sample line.
pub struct Labels<'a>(&'a str);

impl<'a> Labels<'a> {
    /// A label's value, `""` when absent.
    pub fn get(&self, k: &str) -> &'a str {
        self.0
            .split(&format!("{k}=\""))
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or("")
    }
}

/// The sum of the samples of metric `name` whose labels `keep` accepts.
pub fn sum_where(text: &str, name: &str, keep: impl Fn(&Labels<'_>) -> bool) -> f64 {
    let prefix = format!("{name}{{");
    let mut total = 0.0;
    for line in text.lines().filter(|l| l.starts_with(&prefix)) {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        if keep(&Labels(labels)) {
            total += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    total
}

/// [`own_requests`] of a sidecar serving metrics on `127.0.0.1:port`.
pub fn scrape_own_requests(port: u16) -> std::result::Result<Option<(f64, f64)>, String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    match crate::testkit::http_get(addr, "/metrics") {
        Some((200, body)) => Ok(own_requests(&body)),
        other => Err(format!("GET {addr}/metrics: {other:?}")),
    }
}

/// A client's own API requests so far, `(writes, all)`, from its metrics
/// text: ours count every request by verb
/// (`csiops_kube_api_requests_total{verb}`), upstream's by client-go
/// (`rest_client_requests_total{method}`). Writes are every verb but GET
/// (lists and watches are GETs). This splits the API server's count by
/// client. `None` when the metrics have neither family.
pub fn own_requests(metrics: &str) -> Option<(f64, f64)> {
    let mut writes = 0.0;
    let mut all = 0.0;
    let mut seen = false;
    for line in metrics.lines() {
        let Some(labels) = line
            .strip_prefix("csiops_kube_api_requests_total{")
            .or_else(|| line.strip_prefix("rest_client_requests_total{"))
        else {
            continue;
        };
        let Some((labels, value)) = labels.rsplit_once('}') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let verb = labels
            .split(',')
            .find_map(|l| {
                l.strip_prefix("verb=")
                    .or_else(|| l.strip_prefix("method="))
            })
            .map(|v| v.trim_matches('"'));
        seen = true;
        all += value;
        if verb.is_some_and(|v| v != "GET") {
            writes += value;
        }
    }
    seen.then_some((writes, all))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_the_chosen_kinds() {
        let text = r#"# HELP apiserver_request_total x
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="persistentvolumes",scope="resource",subresource="",verb="POST",version="v1"} 7
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="persistentvolumeclaims",scope="resource",subresource="",verb="PATCH",version="v1"} 10
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="persistentvolumeclaims",scope="resource",subresource="",verb="PATCH",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="persistentvolumeclaims",scope="resource",subresource="",verb="GET",version="v1"} 99
"#;
        assert_eq!(
            sum(
                text,
                &[
                    ("persistentvolumes", "POST"),
                    ("persistentvolumeclaims", "PATCH")
                ]
            ),
            19.0
        );
        assert_eq!(sum(text, &[("events", "POST")]), 0.0);
    }

    #[test]
    fn own_requests_reads_both_metric_families() {
        let ours = "# TYPE csiops_kube_api_requests counter\n\
            csiops_kube_api_requests_total{verb=\"GET\"} 7\n\
            csiops_kube_api_requests_total{verb=\"POST\"} 100\n\
            csiops_kube_api_requests_total{verb=\"PATCH\"} 4\n\
            csiops_kube_api_throttled_total{priority=\"critical\"} 90\n";
        assert_eq!(own_requests(ours), Some((104.0, 111.0)));
        let upstream = "# TYPE rest_client_requests_total counter\n\
            rest_client_requests_total{code=\"200\",host=\"127.0.0.1:6443\",method=\"GET\"} 12\n\
            rest_client_requests_total{code=\"201\",host=\"127.0.0.1:6443\",method=\"POST\"} 200\n\
            rest_client_requests_total{code=\"409\",host=\"127.0.0.1:6443\",method=\"PUT\"} 3\n\
            rest_client_request_duration_seconds_count{verb=\"POST\"} 200\n";
        assert_eq!(own_requests(upstream), Some((203.0, 215.0)));
        assert_eq!(own_requests("# no client metrics\n"), None);
    }
}
