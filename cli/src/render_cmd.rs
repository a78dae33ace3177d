//! `kubectl csiops render`: the objects the operator would create for a
//! CR, as one YAML stream in a fixed order, rendered offline by the
//! operator's own `render::render` with the operator's defaults.

use csiops_crds::CSIDriverDeployment;
use csiops_operator::render::{render, ControllerWorkload, RenderConfig, RenderError, Rendered};
use serde::Serialize;
use serde_json::Value;

use crate::input::Object;

/// Stands in for the uid the API server would give the object: the
/// owner references and labels need one.
pub const PLACEHOLDER_UID: &str = "00000000-0000-0000-0000-000000000000";
/// The namespace of a CR that names none.
pub const PLACEHOLDER_NAMESPACE: &str = "default";

#[derive(Debug, thiserror::Error)]
pub enum RenderCmdError {
    #[error("no CSIDriverDeployment (csiops.dev/v1alpha1) in the input")]
    NoCr,
    #[error("more than one CSIDriverDeployment in the input ({0}); give one")]
    Several(String),
    #[error("{object}: not a valid CSIDriverDeployment: {source}")]
    Invalid {
        object: String,
        source: serde_json::Error,
    },
    #[error("the operator would refuse this object (RenderFailed): {0}")]
    Render(#[from] RenderError),
    #[error("cannot write YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
    #[error("cannot serialize: {0}")]
    Json(#[from] serde_json::Error),
}

/// The one CSIDriverDeployment of the input, with a placeholder namespace
/// and uid where it has none.
pub fn find_cr(objects: &[Object]) -> Result<CSIDriverDeployment, RenderCmdError> {
    let crs: Vec<&Object> = objects
        .iter()
        .filter(|o| o.kind == "CSIDriverDeployment" && o.api_version.starts_with("csiops.dev/"))
        .collect();
    let cr = match crs.as_slice() {
        [] => return Err(RenderCmdError::NoCr),
        [one] => *one,
        many => {
            let names: Vec<String> = many.iter().map(|o| o.name.clone()).collect();
            return Err(RenderCmdError::Several(names.join(", ")));
        }
    };
    let mut parsed: CSIDriverDeployment =
        serde_json::from_value(cr.value.clone()).map_err(|source| RenderCmdError::Invalid {
            object: cr.id(),
            source,
        })?;
    with_placeholders(&mut parsed);
    Ok(parsed)
}

/// Sets a namespace and uid where the CR has none, as the API server would.
pub fn with_placeholders(cr: &mut CSIDriverDeployment) {
    if cr.metadata.namespace.as_deref().is_none_or(str::is_empty) {
        cr.metadata.namespace = Some(PLACEHOLDER_NAMESPACE.into());
    }
    if cr.metadata.uid.as_deref().is_none_or(str::is_empty) {
        cr.metadata.uid = Some(PLACEHOLDER_UID.into());
    }
}

fn push<T: Serialize>(out: &mut Vec<Value>, obj: &T) -> Result<(), RenderCmdError> {
    out.push(serde_json::to_value(obj)?);
    Ok(())
}

/// Every rendered object, in the order the operator applies them:
/// ServiceAccounts, bindings, CSIDriver, classes, workloads, budget,
/// monitoring.
pub fn objects(rendered: &Rendered) -> Result<Vec<Value>, RenderCmdError> {
    let mut out = Vec::new();
    if let Some(sa) = &rendered.controller_service_account {
        push(&mut out, sa)?;
    }
    push(&mut out, &rendered.node_service_account)?;
    for b in &rendered.cluster_role_bindings {
        push(&mut out, b)?;
    }
    for b in rendered
        .role_bindings
        .iter()
        .chain(&rendered.secret_reader_bindings)
    {
        push(&mut out, b)?;
    }
    push(&mut out, &rendered.csi_driver)?;
    for c in &rendered.storage_classes {
        push(&mut out, c)?;
    }
    for c in &rendered.attributes_classes {
        push(&mut out, c)?;
    }
    match &rendered.controller {
        Some(ControllerWorkload::StatefulSet(s)) => push(&mut out, s)?,
        Some(ControllerWorkload::Deployment(d)) => push(&mut out, d)?,
        None => {}
    }
    if let Some(pdb) = &rendered.controller_disruption_budget {
        push(&mut out, pdb)?;
    }
    push(&mut out, &rendered.daemonset)?;
    if let Some(s) = &rendered.metrics_service {
        push(&mut out, s)?;
    }
    if let Some(m) = &rendered.pod_monitor {
        push(&mut out, m)?;
    }
    Ok(out)
}

/// Renders the CR into its objects as JSON values.
pub fn render_values(
    cr: &CSIDriverDeployment,
    cfg: &RenderConfig,
) -> Result<Vec<Value>, RenderCmdError> {
    let mut cr = cr.clone();
    with_placeholders(&mut cr);
    objects(&render(&cr, cfg)?)
}

/// The YAML stream of `render`.
pub fn render_yaml(cr: &CSIDriverDeployment, cfg: &RenderConfig) -> Result<String, RenderCmdError> {
    let mut out = String::new();
    for v in render_values(cr, cfg)? {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&v)?);
    }
    Ok(out)
}
