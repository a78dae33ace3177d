//! The shipped admission policies' CEL, evaluated offline (issue 37): each
//! policy of install.yaml is run here against admission requests, as the API
//! server runs it: the resource rules and match conditions select the
//! request, the variables are bound in order, and every validation must
//! hold, else the request is refused with the validation's message.
//! `e2e/tests/security.rs` puts the same policies to a real API server; these
//! tests reach the corners (every operation, every refusal) in milliseconds.
//!
//! The evaluator is the `cel` crate (kube's own CRD-rule evaluator), given
//! the Kubernetes extensions the policies call: `indexOf`, `substring`,
//! `join` and the authorizer (`authorizer.group(g).resource(r).check(v).allowed()`,
//! answered from the grants a test gives the requester).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cel::extractors::This;
use cel::{Context, Program, Value};
use csiops_operator::install;
use csiops_operator::policy;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use serde_json::{json, Value as Json};

/// One admission request.
struct Request {
    operation: &'static str,
    group: &'static str,
    resource: &'static str,
    name: String,
    namespace: String,
    user: String,
    extra: BTreeMap<String, Vec<String>>,
    object: Json,
    old_object: Json,
    namespace_object: Json,
    /// What the authorizer allows the requester: `group/resource/verb`.
    grants: Vec<String>,
}

impl Request {
    fn new(
        operation: &'static str,
        group: &'static str,
        resource: &'static str,
        name: &str,
    ) -> Request {
        Request {
            operation,
            group,
            resource,
            name: name.to_string(),
            namespace: String::new(),
            user: "system:serviceaccount:csi:drv-node".into(),
            extra: BTreeMap::new(),
            object: Json::Null,
            old_object: Json::Null,
            namespace_object: Json::Null,
            grants: Vec::new(),
        }
    }

    fn on_node(mut self, node: &str) -> Request {
        self.extra
            .insert(policy::NODE_NAME_EXTRA.into(), vec![node.to_string()]);
        self
    }

    fn by_user(mut self, user: &str) -> Request {
        self.user = user.into();
        self
    }

    fn in_namespace(mut self, ns: &str) -> Request {
        self.namespace = ns.into();
        self
    }

    fn granted(mut self, group: &str, resource: &str, verb: &str) -> Request {
        self.grants.push(format!("{group}/{resource}/{verb}"));
        self
    }

    fn objects(mut self, old: Json, new: Json) -> Request {
        self.old_object = old;
        self.object = new;
        self
    }
}

/// What the policy says of the request.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// Its rules or match conditions do not select the request.
    NotSelected,
    Admitted,
    Refused(String),
}

fn shipped(name: &str) -> ValidatingAdmissionPolicy {
    install::objects()
        .policies
        .into_iter()
        .map(|(p, _)| p)
        .find(|p| p.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("install.yaml ships no policy {name}"))
}

fn value(json: &Json) -> Value {
    cel::to_value(json).expect("JSON converts to a CEL value")
}

fn string_of(v: &Value) -> Arc<String> {
    match v {
        Value::String(s) => s.clone(),
        _ => Arc::new(String::new()),
    }
}

/// A context with the request bound, the Kubernetes extensions and the
/// authorizer answering from `grants`.
fn context(req: &Request) -> Context<'static> {
    let mut ctx = Context::default();
    ctx.add_function(
        "indexOf",
        |This(s): This<Arc<String>>, sub: Arc<String>| -> i64 {
            s.find(sub.as_str()).map(|i| i as i64).unwrap_or(-1)
        },
    );
    ctx.add_function(
        "substring",
        |This(s): This<Arc<String>>, start: i64, end: i64| -> String {
            s.get(start.max(0) as usize..end.max(0) as usize)
                .unwrap_or_default()
                .to_string()
        },
    );
    ctx.add_function(
        "join",
        |This(list): This<Arc<Vec<Value>>>, sep: Arc<String>| -> String {
            list.iter()
                .map(|v| string_of(v).to_string())
                .collect::<Vec<_>>()
                .join(sep.as_str())
        },
    );
    // The authorizer chain builds `group/resource/verb` in a string.
    ctx.add_function("group", |This(_a): This<Value>, g: Arc<String>| -> String {
        format!("{g}")
    });
    ctx.add_function(
        "resource",
        |This(g): This<Arc<String>>, r: Arc<String>| -> String { format!("{g}/{r}") },
    );
    ctx.add_function(
        "check",
        |This(gr): This<Arc<String>>, v: Arc<String>| -> String { format!("{gr}/{v}") },
    );
    let grants = req.grants.clone();
    ctx.add_function("allowed", move |This(grv): This<Arc<String>>| -> bool {
        grants.iter().any(|g| g == grv.as_str())
    });
    let request = json!({
        "operation": req.operation,
        "name": req.name,
        "namespace": req.namespace,
        "resource": {"group": req.group, "resource": req.resource},
        "userInfo": {"username": req.user, "extra": req.extra},
    });
    ctx.add_variable_from_value("request", value(&request));
    ctx.add_variable_from_value("object", value(&req.object));
    ctx.add_variable_from_value("oldObject", value(&req.old_object));
    ctx.add_variable_from_value("namespaceObject", value(&req.namespace_object));
    ctx.add_variable_from_value("authorizer", Value::String(Arc::new(String::new())));
    ctx.add_variable_from_value("variables", Value::from(HashMap::<String, Value>::new()));
    ctx
}

fn eval(ctx: &Context<'_>, expression: &str) -> Value {
    let program = Program::compile(expression)
        .unwrap_or_else(|e| panic!("does not compile: {expression}\n{e:?}"));
    program
        .execute(ctx)
        .unwrap_or_else(|e| panic!("does not evaluate: {expression}\n{e:?}"))
}

fn is_true(ctx: &Context<'_>, expression: &str) -> bool {
    match eval(ctx, expression) {
        Value::Bool(b) => b,
        other => panic!("not a boolean: {expression} = {other:?}"),
    }
}

/// Runs `policy` on `req` as the API server would.
fn admit(policy: &ValidatingAdmissionPolicy, req: &Request) -> Verdict {
    let spec = policy.spec.as_ref().expect("a policy spec");
    let rules = spec
        .match_constraints
        .as_ref()
        .and_then(|m| m.resource_rules.as_ref())
        .expect("resource rules");
    let any = |list: &Option<Vec<String>>, want: &str| {
        list.iter().flatten().any(|x| x == "*" || x == want)
    };
    let selected = rules.iter().any(|r| {
        any(&r.api_groups, req.group)
            && any(&r.resources, req.resource)
            && any(&r.operations, req.operation)
    });
    if !selected {
        return Verdict::NotSelected;
    }
    let mut ctx = context(req);
    for condition in spec.match_conditions.iter().flatten() {
        if !is_true(&ctx, &condition.expression) {
            return Verdict::NotSelected;
        }
    }
    let mut variables: HashMap<String, Value> = HashMap::new();
    for variable in spec.variables.iter().flatten() {
        let v = eval(&ctx, &variable.expression);
        variables.insert(variable.name.clone(), v);
        ctx.add_variable_from_value("variables", Value::from(variables.clone()));
    }
    for validation in spec.validations.iter().flatten() {
        if !is_true(&ctx, &validation.expression) {
            let message = match &validation.message_expression {
                Some(m) => string_of(&eval(&ctx, m)).to_string(),
                None => validation.message.clone().unwrap_or_default(),
            };
            return Verdict::Refused(message);
        }
    }
    Verdict::Admitted
}

fn refused(verdict: Verdict, why: &str) {
    match verdict {
        Verdict::Refused(m) => assert!(m.contains(why), "refused, but not for {why:?}: {m}"),
        other => panic!("not refused ({why}): {other:?}"),
    }
}

// --- the registrar's own node -------------------------------------------

fn node(labels: Json, annotations: Json, taints: Json) -> Json {
    json!({
        "metadata": {"name": "n1", "labels": labels, "annotations": annotations},
        "spec": {"taints": taints},
    })
}

fn registrar(req: Request) -> Request {
    req.granted(
        policy::MARKER_GROUP,
        policy::MARKER_RESOURCE,
        policy::OWN_NODE_VERB,
    )
}

#[test]
fn a_registrar_changes_only_its_own_node_and_only_what_it_needs() {
    let p = shipped(policy::REGISTRAR_POLICY);
    let readiness = format!("{}d.example.com", csiops_crds::READINESS_TAINT_PREFIX);
    let before = node(
        json!({"kubernetes.io/hostname": "n1"}),
        json!({}),
        json!([{"key": readiness, "effect": "NoSchedule"}, {"key": "dedicated", "effect": "NoSchedule"}]),
    );
    let update = |new: Json| {
        registrar(Request::new("UPDATE", "", "nodes", "n1").on_node("n1"))
            .objects(before.clone(), new)
    };

    // What it needs: a topology label, the node-ID annotation, its readiness taint gone.
    let ok = node(
        json!({"kubernetes.io/hostname": "n1", "topology.d.example.com/zone": "a"}),
        json!({policy::NODE_ID_ANNOTATION: "{\"d.example.com\":\"n1\"}"}),
        json!([{"key": "dedicated", "effect": "NoSchedule"}]),
    );
    assert_eq!(admit(&p, &update(ok)), Verdict::Admitted);

    // Another node, or a token that names none.
    let other = registrar(Request::new("UPDATE", "", "nodes", "n2").on_node("n1"))
        .objects(before.clone(), before.clone());
    refused(admit(&p, &other), "may write only that node");
    let unbound = registrar(Request::new("UPDATE", "", "nodes", "n1"))
        .objects(before.clone(), before.clone());
    refused(admit(&p, &unbound), "its token names none");

    // A node-role label, another taint removed, unschedulable, a delete.
    let role = node(
        json!({"kubernetes.io/hostname": "n1", "node-role.kubernetes.io/control-plane": ""}),
        json!({}),
        before["spec"]["taints"].clone(),
    );
    refused(admit(&p, &update(role)), "add a label under kubernetes.io");
    let untainted = node(
        json!({"kubernetes.io/hostname": "n1"}),
        json!({}),
        json!([]),
    );
    refused(admit(&p, &update(untainted)), "remove a taint");
    let mut cordoned = before.clone();
    cordoned["spec"]["unschedulable"] = json!(true);
    refused(admit(&p, &update(cordoned)), "change the spec");
    let delete = registrar(Request::new("DELETE", "", "nodes", "n1").on_node("n1"))
        .objects(before.clone(), Json::Null);
    refused(admit(&p, &delete), "may not delete Node");

    // Not a registrar (no marker), or exempted: not the policy's business.
    let admin = Request::new("UPDATE", "", "nodes", "n2").objects(before.clone(), before.clone());
    assert_eq!(admit(&p, &admin), Verdict::NotSelected);
    let exempt = registrar(Request::new("UPDATE", "", "nodes", "n2"))
        .granted(
            policy::MARKER_GROUP,
            policy::MARKER_RESOURCE,
            policy::ANY_NODE_VERB,
        )
        .objects(before.clone(), before);
    assert_eq!(admit(&p, &exempt), Verdict::NotSelected);

    // Its own CSINode, not another's.
    let csinode = |name: &str| {
        registrar(Request::new("CREATE", "storage.k8s.io", "csinodes", name).on_node("n1"))
            .objects(Json::Null, json!({"metadata": {"name": name}}))
    };
    assert_eq!(admit(&p, &csinode("n1")), Verdict::Admitted);
    refused(admit(&p, &csinode("n2")), "may write only that node");
}

// --- host access ---------------------------------------------------------

fn cr(spec: Json) -> Json {
    json!({"metadata": {"name": "drv", "namespace": "team"}, "spec": spec})
}

#[test]
fn host_access_is_needed_to_create_or_change_what_runs() {
    let p = shipped(policy::HOST_ACCESS_POLICY);
    let spec = json!({"driverName": "d.example.com", "version": "v1", "driver": {"image": "d:v1"}});
    let plain_ns = json!({"metadata": {"name": "team", "labels": {}}});
    let allowed_ns = json!({"metadata": {"name": "team", "labels": {policy::HOST_ACCESS_LABEL: policy::HOST_ACCESS_LABEL_VALUE}}});
    let create = |ns: &Json| {
        let mut r = Request::new(
            "CREATE",
            policy::MARKER_GROUP,
            "csidriverdeployments",
            "drv",
        )
        .by_user("alice")
        .in_namespace("team")
        .objects(Json::Null, cr(spec.clone()));
        r.namespace_object = ns.clone();
        r
    };
    refused(
        admit(&p, &create(&plain_ns)),
        "may not create CSIDriverDeployment team/drv",
    );
    assert_eq!(admit(&p, &create(&allowed_ns)), Verdict::Admitted);
    let holder = create(&plain_ns).granted(
        policy::MARKER_GROUP,
        "csidriverdeployments",
        policy::HOST_ACCESS_VERB,
    );
    assert_eq!(admit(&p, &holder), Verdict::Admitted);

    // Updates: the harmless fields pass, a guarded one is refused naming it.
    let update = |new: Json| {
        let mut r = Request::new(
            "UPDATE",
            policy::MARKER_GROUP,
            "csidriverdeployments",
            "drv",
        )
        .by_user("alice")
        .in_namespace("team")
        .objects(cr(spec.clone()), cr(new));
        r.namespace_object = plain_ns.clone();
        r
    };
    let mut harmless = spec.clone();
    harmless["paused"] = json!(true);
    harmless["version"] = json!("v2");
    assert_eq!(admit(&p, &update(harmless)), Verdict::Admitted);
    let mut secrets = spec.clone();
    secrets["secretAccess"] = json!({"clusterWide": true});
    refused(
        admit(&p, &update(secrets)),
        "may not change spec.secretAccess",
    );
    let mut image = spec.clone();
    image["driver"] = json!({"image": "evil:1"});
    refused(admit(&p, &update(image)), "may not change spec.driver");
}

#[test]
fn only_a_host_access_holder_labels_a_namespace_for_it() {
    let p = shipped(policy::HOST_ACCESS_LABEL_POLICY);
    let ns = |labels: Json| json!({"metadata": {"name": "team", "labels": labels}});
    let label = json!({policy::HOST_ACCESS_LABEL: policy::HOST_ACCESS_LABEL_VALUE});
    let create = Request::new("CREATE", "", "namespaces", "team")
        .by_user("mallory")
        .objects(Json::Null, ns(label.clone()));
    refused(admit(&p, &create), policy::HOST_ACCESS_LABEL);
    let holder = Request::new("CREATE", "", "namespaces", "team")
        .by_user("admin")
        .granted(
            policy::MARKER_GROUP,
            "csidriverdeployments",
            policy::HOST_ACCESS_VERB,
        )
        .objects(Json::Null, ns(label.clone()));
    assert_eq!(admit(&p, &holder), Verdict::Admitted);
    // Removing it stays open; an unlabelled namespace is anyone's.
    let removal = Request::new("UPDATE", "", "namespaces", "team")
        .by_user("mallory")
        .objects(ns(label), ns(json!({})));
    assert_eq!(admit(&p, &removal), Verdict::Admitted);
    let plain = Request::new("CREATE", "", "namespaces", "team")
        .by_user("mallory")
        .objects(Json::Null, ns(json!({"team": "a"})));
    assert_eq!(admit(&p, &plain), Verdict::Admitted);
}

// --- the operator's fence ----------------------------------------------

const OPERATOR: &str = "system:serviceaccount:csiops-system:csiops-operator";

fn owner_labels() -> Json {
    json!({
        "app.kubernetes.io/managed-by": "csiops-operator",
        "csiops.dev/owner-name": "drv",
        "csiops.dev/owner-namespace": "storage",
        "csiops.dev/owner-uid": "0000-1111",
    })
}

fn owner_reference() -> Json {
    json!([{"apiVersion": "csiops.dev/v1alpha1", "kind": "CSIDriverDeployment", "name": "drv", "uid": "0000-1111", "controller": true}])
}

fn binding(
    kind: &str,
    ns: Option<&str>,
    metadata: Json,
    role: &str,
    subject_ns: &str,
    subject: &str,
) -> Json {
    let mut b = json!({
        "kind": kind,
        "metadata": metadata,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": subject, "namespace": subject_ns}],
    });
    if let Some(ns) = ns {
        b["metadata"]["namespace"] = json!(ns);
    }
    b
}

fn operator_writes(resource: &'static str, group: &'static str, ns: &str, object: Json) -> Request {
    Request::new("CREATE", group, resource, "x")
        .by_user(OPERATOR)
        .in_namespace(ns)
        .objects(Json::Null, object)
}

#[test]
fn the_operator_binds_and_runs_only_for_what_a_csidriverdeployment_owns() {
    let p = shipped(policy::OPERATOR_FENCE_POLICY);
    let rbac = "rbac.authorization.k8s.io";
    let owned = json!({"name": "csiops:drv:provisioner", "labels": owner_labels()});
    let crb = |metadata: &Json, subject_ns: &str, subject: &str| {
        operator_writes(
            "clusterrolebindings",
            rbac,
            "",
            binding(
                "ClusterRoleBinding",
                None,
                metadata.clone(),
                "csiops:provisioner",
                subject_ns,
                subject,
            ),
        )
    };
    assert_eq!(
        admit(&p, &crb(&owned, "storage", "drv-controller")),
        Verdict::Admitted
    );
    refused(
        admit(&p, &crb(&owned, "csiops-system", "csiops-operator")),
        "binds roles only to the ServiceAccounts",
    );
    let unowned = crb(&json!({"name": "u"}), "storage", "drv-controller");
    refused(admit(&p, &unowned), "names no owner");

    // In its own namespace a RoleBinding is owned by reference.
    let leases = operator_writes(
        "rolebindings",
        rbac,
        "storage",
        binding(
            "RoleBinding",
            Some("storage"),
            json!({"name": "drv-leases", "ownerReferences": owner_reference()}),
            "csiops:leader-election",
            "storage",
            "drv-controller",
        ),
    );
    assert_eq!(admit(&p, &leases), Verdict::Admitted);

    // A Secret reader lives where the Secrets are, owned by the labels; no
    // other role may be bound that way, nor to another account.
    let reader = |role: &str, subject_ns: &str, subject: &str| {
        operator_writes(
            "rolebindings",
            rbac,
            "kube-system",
            binding(
                "RoleBinding",
                Some("kube-system"),
                json!({"name": "csiops:drv:secret-reader", "labels": owner_labels()}),
                role,
                subject_ns,
                subject,
            ),
        )
    };
    assert_eq!(
        admit(&p, &reader("csiops:secret-reader", "storage", "drv-node")),
        Verdict::Admitted
    );
    refused(
        admit(
            &p,
            &reader("csiops:secret-reader", "kube-system", "default"),
        ),
        "binds roles only to the ServiceAccounts",
    );
    refused(
        admit(
            &p,
            &reader("csiops:leader-election", "storage", "drv-controller"),
        ),
        "names no owner",
    );

    // Workloads run only as the owner's accounts.
    let sts = |account: &str| {
        operator_writes(
            "statefulsets",
            "apps",
            "storage",
            json!({
                "metadata": {"name": "drv-controller", "namespace": "storage", "ownerReferences": owner_reference()},
                "spec": {"template": {"spec": {"serviceAccountName": account, "containers": []}}},
            }),
        )
    };
    assert_eq!(admit(&p, &sts("drv-controller")), Verdict::Admitted);
    refused(
        admit(&p, &sts("default")),
        "runs pods only as the ServiceAccounts",
    );

    // Someone else's writes are not the fence's business.
    let admin = Request::new("CREATE", rbac, "clusterrolebindings", "x")
        .by_user("admin")
        .objects(Json::Null, json!({"metadata": {"name": "x"}}));
    assert_eq!(admit(&p, &admin), Verdict::NotSelected);
}

#[test]
fn the_operator_changes_only_takeover_labels_on_a_node() {
    let p = shipped(policy::OPERATOR_NODE_LABELS_POLICY);
    let before = json!({"metadata": {"name": "n1", "labels": {"a": "b"}}, "spec": {}});
    let with = |labels: Json| json!({"metadata": {"name": "n1", "labels": labels}, "spec": {}});
    let update = |new: Json| {
        Request::new("UPDATE", "", "nodes", "n1")
            .by_user(OPERATOR)
            .objects(before.clone(), new)
    };
    assert_eq!(
        admit(
            &p,
            &update(with(
                json!({"a": "b", "adopt.csiops.dev/d.example.com": "waiting"})
            ))
        ),
        Verdict::Admitted
    );
    refused(
        admit(&p, &update(with(json!({"a": "c"})))),
        "the operator changes only the labels",
    );
}
