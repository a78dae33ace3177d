//! CEL rules that keep a CSIDriverDeployment from redirecting what the
//! operator's sidecars may touch. The operator checks the same again
//! (`render::validate`) in case the schema was bypassed.

use kube::core::Rule;

/// Message of [`registrar_node_rule`].
pub const REGISTRAR_NODE_MESSAGE: &str = "sidecars.registrar.env may not set NODE_NAME or KUBE_NODE_NAME: the operator sets the registrar's node from the pod's spec.nodeName, the only Node and CSINode it may write";

/// The registrar's node is its pod's: no `NODE_NAME`/`KUBE_NODE_NAME` in
/// its `env`. (`--node-name` in its `extraArgs` is refused by the operator,
/// as every managed flag is: a CEL rule over the unbounded `extraArgs` list
/// of strings exceeds the API server's cost budget.)
pub fn registrar_env_rule() -> Rule {
    let r = "self.sidecars.registrar";
    Rule::new(format!(
        "!has(self.sidecars) || !has({r}) || !has({r}.env) || \
         {r}.env.all(e, e.name != 'NODE_NAME' && e.name != 'KUBE_NODE_NAME')"
    ))
    .message(REGISTRAR_NODE_MESSAGE)
}
