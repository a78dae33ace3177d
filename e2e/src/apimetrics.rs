//! kube-apiserver's own request counter, for benchmarks that count the API
//! writes a sidecar makes (`apiserver_request_total{verb,resource,…}`).

use crate::{Error, Result};

/// One request kind: which resource and verb.
pub type Kind<'a> = (&'a str, &'a str);

/// The sum of `apiserver_request_total` over the `(resource, verb)` pairs of
/// `kinds` (all response codes, all subresources).
pub async fn requests(client: &kube::Client, kinds: &[Kind<'_>]) -> Result<f64> {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| Error::Other(format!("metrics request: {e}")))?;
    let text = client
        .request_text(req)
        .await
        .map_err(|e| Error::Other(format!("reading kube-apiserver metrics: {e}")))?;
    Ok(sum(&text, kinds))
}

/// [`requests`] over a metrics text.
pub fn sum(text: &str, kinds: &[Kind<'_>]) -> f64 {
    let mut total = 0.0;
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let label = |k: &str| {
            labels
                .split(&format!("{k}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
        };
        let (verb, resource) = (label("verb"), label("resource"));
        if kinds.iter().any(|&(r, v)| r == resource && v == verb) {
            total += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    total
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
}
