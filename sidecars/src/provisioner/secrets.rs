//! Reading the provisioner Secret a StorageClass names. Secrets are read
//! with a GET when needed, never cached or watched (the provisioner would
//! otherwise hold every Secret of the cluster), and their values are only
//! ever handed to the driver: errors name the Secret, never its content.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use super::params::SecretRef;

/// Why a Secret could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("secret {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error("cannot read secret {namespace}/{name}")]
    Read {
        namespace: String,
        name: String,
        source: kube::Error,
    },
}

/// The Secret's data as CSI secrets (values as UTF-8, lossy).
pub async fn fetch(
    client: &kube::Client,
    r: &SecretRef,
) -> Result<HashMap<String, String>, SecretError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &r.namespace);
    match api.get_opt(&r.name).await {
        Ok(Some(secret)) => Ok(to_csi(&secret)),
        Ok(None) => Err(SecretError::NotFound {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
        }),
        Err(source) => Err(SecretError::Read {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            source,
        }),
    }
}

/// `data` decoded, plus `stringData` should a server ever return it.
pub fn to_csi(secret: &Secret) -> HashMap<String, String> {
    let mut out: HashMap<String, String> = secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned()))
        .collect();
    out.extend(
        secret
            .string_data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;

    use super::*;

    #[test]
    fn data_becomes_strings() {
        let secret = Secret {
            data: Some(BTreeMap::from([
                ("user".to_string(), ByteString(b"admin".to_vec())),
                ("key".to_string(), ByteString(vec![0x68, 0x69])),
            ])),
            ..Default::default()
        };
        let got = to_csi(&secret);
        assert_eq!(got.get("user").map(String::as_str), Some("admin"));
        assert_eq!(got.get("key").map(String::as_str), Some("hi"));
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn errors_name_the_secret_only() {
        let e = SecretError::NotFound {
            namespace: "ns".into(),
            name: "creds".into(),
        };
        assert_eq!(e.to_string(), "secret ns/creds not found");
    }
}
