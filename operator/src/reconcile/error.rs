//! Errors of one reconciliation, each mapped to a metric kind and to whether a
//! user can fix it (reported as Degraded) or it is transient (retried).

use kube::core::Status;

/// Why a reconciliation stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API")]
    Kube(#[from] kube::Error),

    /// A read (get, list, discovery) the API server failed or refused,
    /// naming what was read: retried with backoff, and reported in status
    /// and an Event once it repeats (a 403 on a list is no blip).
    #[error("cannot {op} {what}: {message}")]
    Read {
        op: &'static str,
        what: String,
        message: String,
        #[source]
        source: Box<kube::Error>,
    },

    #[error("{kind} {name} already exists and is not owned by this CSIDriverDeployment{detail}")]
    NotOwned {
        kind: &'static str,
        name: String,
        /// Who owns it, when known (` (owned by ns/name)`), else empty.
        detail: String,
    },

    /// `spec.adoption` cannot take over what runs (the message says why).
    #[error("{0}")]
    AdoptionRefused(String),

    #[error("the API server rejected {kind} {name}: {message}")]
    Rejected {
        kind: &'static str,
        name: String,
        message: String,
        /// 400, 403 or 422.
        code: u16,
    },

    /// A write the API server failed for a reason other than refusing the
    /// object (a 500 from a failing admission webhook or conversion, a 409,
    /// a 503…): retried with backoff, reported once it repeats.
    #[error("the API server failed to apply {kind} {name}: {message}")]
    WriteFailed {
        kind: &'static str,
        name: String,
        message: String,
        #[source]
        source: Box<kube::Error>,
    },

    #[error("cannot serialize {kind} {name}")]
    Serialize {
        kind: &'static str,
        name: String,
        source: serde_json::Error,
    },

    #[error("CSIDriverDeployment has no {0}")]
    MissingMetadata(&'static str),
}

impl Error {
    /// Short label for `csiops_reconcile_errors_total{kind}`.
    pub fn metric_kind(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Read { .. } => "read",
            Error::NotOwned { .. } => "conflict",
            Error::AdoptionRefused(_) => "adoption",
            Error::Rejected { .. } => "rejected",
            Error::WriteFailed { .. } => "write",
            Error::Serialize { .. } => "serialize",
            Error::MissingMetadata(_) => "metadata",
        }
    }

    /// Errors a user must fix: reported as Degraded, not retried in a hot loop.
    pub fn user_facing_reason(&self) -> Option<&'static str> {
        match self {
            Error::NotOwned { .. } => Some("Conflict"),
            Error::AdoptionRefused(_) => Some("AdoptionRefused"),
            Error::Rejected { .. } => Some("ApplyFailed"),
            _ => None,
        }
    }

    /// Errors that may be transient but, once they repeat, are what the user
    /// must see: reported as Degraded with this reason after a few attempts.
    pub fn repeated_failure_reason(&self) -> Option<&'static str> {
        match self {
            Error::WriteFailed { .. } => Some("ApplyFailed"),
            Error::Read { .. } => Some("ReadFailed"),
            _ => None,
        }
    }

    /// Whether this is the API server refusing a change of an immutable
    /// field (422 Invalid, "field is immutable"): the only refusal after
    /// which an object may be deleted and created again. An admission
    /// webhook's 403 or any other 422 is the user's to fix.
    pub fn is_immutable_field_refusal(&self) -> bool {
        matches!(self, Error::Rejected { code: 422, message, .. } if message.contains("field is immutable"))
    }

    /// A failed read of `what` (`StorageClasses with label …`,
    /// `StatefulSet ns/x`).
    pub fn read(op: &'static str, what: impl Into<String>, err: kube::Error) -> Self {
        let message = match &err {
            kube::Error::Api(s) => format!("{} ({} {})", s.message, s.code, s.reason),
            other => other.to_string(),
        };
        Error::Read {
            op,
            what: what.into(),
            message,
            source: Box::new(err),
        }
    }

    /// Classifies an API error of a write: validation and admission refusals are
    /// the user's to fix; anything else is retried with backoff.
    pub fn from_write(kind: &'static str, name: &str, err: kube::Error) -> Self {
        match &err {
            kube::Error::Api(s) if is_rejection(s) => Error::Rejected {
                kind,
                name: name.to_string(),
                message: s.message.clone(),
                code: s.code,
            },
            kube::Error::Api(s) => Error::WriteFailed {
                kind,
                name: name.to_string(),
                message: format!("{} ({} {})", s.message, s.code, s.reason),
                source: Box::new(err),
            },
            _ => Error::Kube(err),
        }
    }
}

/// 400 Bad Request, 403 Forbidden (admission), 422 Invalid.
fn is_rejection(s: &Status) -> bool {
    matches!(s.code, 400 | 403 | 422)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(Status {
            code,
            message: message.into(),
            ..Status::default()
        }))
    }

    #[test]
    fn validation_refusals_are_user_facing_and_outages_are_not() {
        let e = Error::from_write("StatefulSet", "x", api_error(422, "spec.template: invalid"));
        assert_eq!(e.user_facing_reason(), Some("ApplyFailed"));
        assert!(e
            .to_string()
            .contains("StatefulSet x: spec.template: invalid"));
        let e = Error::from_write("StatefulSet", "x", api_error(503, "unavailable"));
        assert_eq!(e.user_facing_reason(), None);
        assert_eq!(e.repeated_failure_reason(), Some("ApplyFailed"));
        assert_eq!(e.metric_kind(), "write");
        assert!(e.to_string().contains("StatefulSet x: unavailable"), "{e}");
        // A 500 (a failing webhook, a conversion error) is reported once it repeats.
        let e = Error::from_write("DaemonSet", "y", api_error(500, "failed calling webhook"));
        assert_eq!(e.repeated_failure_reason(), Some("ApplyFailed"));
        // A broken connection is no message from the API server.
        let e = Error::from_write(
            "DaemonSet",
            "y",
            kube::Error::Discovery(kube::error::DiscoveryError::MissingResource("x".into())),
        );
        assert_eq!(e.repeated_failure_reason(), None);
    }

    #[test]
    fn only_an_immutable_field_refusal_allows_a_re_create() {
        let immutable = Error::from_write(
            "CSIDriver",
            "d",
            api_error(
                422,
                "CSIDriver.storage.k8s.io \"d\" is invalid: spec.attachRequired: Invalid value: false: field is immutable",
            ),
        );
        assert!(immutable.is_immutable_field_refusal());
        let webhook = Error::from_write(
            "CSIDriver",
            "d",
            api_error(
                403,
                "admission webhook \"policy\" denied the request: field is immutable",
            ),
        );
        assert!(!webhook.is_immutable_field_refusal());
        let other_invalid =
            Error::from_write("CSIDriver", "d", api_error(422, "spec.x: Required value"));
        assert!(!other_invalid.is_immutable_field_refusal());
    }

    #[test]
    fn a_failed_read_names_what_was_read_and_is_reported_once_it_repeats() {
        let e = Error::read(
            "list",
            "StorageClasses labelled csiops.dev/owner-uid=u",
            api_error(403, "storageclasses is forbidden"),
        );
        assert_eq!(e.repeated_failure_reason(), Some("ReadFailed"));
        assert_eq!(e.user_facing_reason(), None);
        assert_eq!(e.metric_kind(), "read");
        assert!(
            e.to_string()
                .starts_with("cannot list StorageClasses labelled csiops.dev/owner-uid=u: storageclasses is forbidden (403"),
            "{e}"
        );
    }
}
