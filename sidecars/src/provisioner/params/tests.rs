use super::*;

fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn ctx(annotations: Option<&BTreeMap<String, String>>) -> TemplateContext<'_> {
    TemplateContext {
        pv_name: "pvc-1234",
        pvc_name: "data-web-0",
        pvc_namespace: "team-a",
        pvc_annotations: annotations,
    }
}

fn sref(name: &str, namespace: &str) -> SecretRef {
    SecretRef {
        name: name.into(),
        namespace: namespace.into(),
    }
}

#[test]
fn create_volume_parameters_strip_reserved_keys() {
    let extra = ExtraCreateMetadata {
        pvc_name: "data-web-0",
        pvc_namespace: "team-a",
        pv_name: "pvc-1234",
    };
    type Case<'a> = (
        &'a str,
        Vec<(&'a str, &'a str)>,
        bool,
        Result<Vec<(&'a str, &'a str)>, ParamsError>,
    );
    let cases: Vec<Case> = vec![
        ("empty", vec![], false, Ok(vec![])),
        (
            // design.md: "StorageClass parameters with the
            // `csi.storage.k8s.io/` prefixed keys stripped".
            "reserved keys stripped, others passed",
            vec![
                ("type", "ssd"),
                (FS_TYPE_KEY, "xfs"),
                ("csi.storage.k8s.io/provisioner-secret-name", "s"),
                ("csi.storage.k8s.io/provisioner-secret-namespace", "ns"),
                ("csi.storage.k8s.io/node-expand-secret-name", "s"),
                ("csi.storage.k8s.io/node-expand-secret-namespace", "ns"),
                // Upstream v6 knows the ControllerModify keys too.
                ("csi.storage.k8s.io/controller-modify-secret-name", "s"),
                (
                    "csi.storage.k8s.io/controller-modify-secret-namespace",
                    "ns",
                ),
                (DEFAULT_SECRET_NAME_KEY, "s"),
                (DEFAULT_SECRET_NAMESPACE_KEY, "ns"),
            ],
            false,
            Ok(vec![("type", "ssd")]),
        ),
        (
            // Upstream keeps the deprecated keys for backwards compatibility.
            "deprecated keys are passed through",
            vec![
                ("csiProvisionerSecretName", "s"),
                ("csiProvisionerSecretNamespace", "ns"),
                ("fsType", "ext4"),
            ],
            false,
            Ok(vec![
                ("csiProvisionerSecretName", "s"),
                ("csiProvisionerSecretNamespace", "ns"),
                ("fsType", "ext4"),
            ]),
        ),
        (
            "unknown reserved key is an error",
            vec![
                ("type", "ssd"),
                ("csi.storage.k8s.io/provisoner-secret-name", "s"),
            ],
            false,
            Err(ParamsError::UnknownReservedKey(
                "csi.storage.k8s.io/provisoner-secret-name".into(),
            )),
        ),
        (
            "a class cannot forge the extra metadata",
            vec![(PVC_NAME_KEY, "forged")],
            true,
            Err(ParamsError::UnknownReservedKey(PVC_NAME_KEY.into())),
        ),
        (
            // README: "--extra-create-metadata: Enables the injection of
            // extra PVC and PV metadata as parameters when calling
            // `CreateVolume` on the driver (keys: "csi.storage.k8s.io/pvc/name",
            // "csi.storage.k8s.io/pvc/namespace", "csi.storage.k8s.io/pv/name")"
            "extra metadata",
            vec![("type", "ssd"), (FS_TYPE_KEY, "xfs")],
            true,
            Ok(vec![
                ("type", "ssd"),
                (PVC_NAME_KEY, "data-web-0"),
                (PVC_NAMESPACE_KEY, "team-a"),
                (PV_NAME_KEY, "pvc-1234"),
            ]),
        ),
    ];
    for (name, input, with_extra, want) in cases {
        let got = create_volume_parameters(&params(&input), with_extra.then_some(&extra));
        let want = want.map(|w| {
            w.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>()
        });
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn fs_types() {
    type Case<'a> = (
        &'a str,
        &'a [(&'a str, &'a str)],
        Option<&'a str>,
        Result<Option<&'a str>, ParamsError>,
    );
    let cases: &[Case] = &[
        ("none", &[], None, Ok(None)),
        ("default flag", &[], Some("ext4"), Ok(Some("ext4"))),
        (
            "prefixed",
            &[(FS_TYPE_KEY, "xfs")],
            Some("ext4"),
            Ok(Some("xfs")),
        ),
        ("deprecated", &[("fsType", "xfs")], None, Ok(Some("xfs"))),
        (
            "deprecated any case",
            &[("FSTYPE", "xfs")],
            None,
            Ok(Some("xfs")),
        ),
        (
            "empty value falls back",
            &[(FS_TYPE_KEY, "")],
            Some("ext4"),
            Ok(Some("ext4")),
        ),
        ("empty everywhere", &[(FS_TYPE_KEY, "")], Some(""), Ok(None)),
        (
            "both keys",
            &[(FS_TYPE_KEY, "xfs"), ("fsType", "ext4")],
            None,
            Err(ParamsError::FsTypeConflict(vec![
                FS_TYPE_KEY.into(),
                "fsType".into(),
            ])),
        ),
        (
            "two deprecated spellings",
            &[("fstype", "xfs"), ("fsType", "ext4")],
            None,
            Err(ParamsError::FsTypeConflict(vec![
                "fsType".into(),
                "fstype".into(),
            ])),
        ),
    ];
    for (name, input, default, want) in cases {
        let got = fs_type(&params(input), *default);
        assert_eq!(got, want.clone().map(|o| o.map(str::to_string)), "{name}");
    }
}

#[test]
fn secret_references() {
    let annotations = BTreeMap::from([(
        "example.com/secret".to_string(),
        "from-annotation".to_string(),
    )]);
    let prov = SecretKind::Provisioner.keys();
    let stage = SecretKind::NodeStage.keys();
    let expand = SecretKind::ControllerExpand.keys();
    let modify = SecretKind::ControllerModify.keys();
    type Case<'a> = (
        &'a str,
        SecretKind,
        Vec<(&'a str, &'a str)>,
        Result<Option<SecretRef>, ParamsError>,
    );
    let cases: Vec<Case> = vec![
        (
            "nothing",
            SecretKind::Provisioner,
            vec![("type", "x")],
            Ok(None),
        ),
        (
            "literal",
            SecretKind::Provisioner,
            vec![(prov.0, "creds"), (prov.1, "kube-system")],
            Ok(Some(sref("creds", "kube-system"))),
        ),
        (
            // CSI design doc: "The CSI external-provisioner will reserve
            // the parameter keys `csiProvisionerSecretName` and
            // `csiProvisionerSecretNamespace`."
            "deprecated keys",
            SecretKind::Provisioner,
            vec![
                ("csiProvisionerSecretName", "mysecret"),
                ("csiProvisionerSecretNamespace", "mynamespace"),
            ],
            Ok(Some(sref("mysecret", "mynamespace"))),
        ),
        (
            "deprecated name with new namespace",
            SecretKind::NodePublish,
            vec![
                ("csiNodePublishSecretName", "s"),
                (SecretKind::NodePublish.keys().1, "ns"),
            ],
            Ok(Some(sref("s", "ns"))),
        ),
        (
            "both deprecated and new name",
            SecretKind::Provisioner,
            vec![
                ("csiProvisionerSecretName", "a"),
                (prov.0, "b"),
                (prov.1, "ns"),
            ],
            Err(ParamsError::SecretConflict {
                secret: SecretKind::Provisioner,
                deprecated: "csiProvisionerSecretName",
                key: prov.0,
            }),
        ),
        (
            "name without namespace",
            SecretKind::NodeStage,
            vec![(stage.0, "s")],
            Err(ParamsError::SecretIncomplete {
                secret: SecretKind::NodeStage,
                present: stage.0,
                missing: stage.1,
            }),
        ),
        (
            "namespace without name",
            SecretKind::ControllerExpand,
            vec![(expand.1, "ns")],
            Err(ParamsError::SecretIncomplete {
                secret: SecretKind::ControllerExpand,
                present: expand.1,
                missing: expand.0,
            }),
        ),
        (
            "empty value",
            SecretKind::Provisioner,
            vec![(prov.0, ""), (prov.1, "ns")],
            Err(ParamsError::SecretEmpty {
                secret: SecretKind::Provisioner,
                key: prov.0,
            }),
        ),
        (
            "default secret applies when the operation has none",
            SecretKind::ControllerPublish,
            vec![
                (DEFAULT_SECRET_NAME_KEY, "all"),
                (DEFAULT_SECRET_NAMESPACE_KEY, "ns"),
            ],
            Ok(Some(sref("all", "ns"))),
        ),
        (
            "operation's own keys win over the default",
            SecretKind::NodeStage,
            vec![
                (DEFAULT_SECRET_NAME_KEY, "all"),
                (DEFAULT_SECRET_NAMESPACE_KEY, "ns"),
                (stage.0, "stage"),
                (stage.1, "ns2"),
            ],
            Ok(Some(sref("stage", "ns2"))),
        ),
        (
            "incomplete default",
            SecretKind::NodeExpand,
            vec![(DEFAULT_SECRET_NAME_KEY, "all")],
            Err(ParamsError::SecretIncomplete {
                secret: SecretKind::NodeExpand,
                present: DEFAULT_SECRET_NAME_KEY,
                missing: DEFAULT_SECRET_NAMESPACE_KEY,
            }),
        ),
        (
            "templates in name and namespace",
            SecretKind::Provisioner,
            vec![
                (prov.0, "${pvc.name}-${pv.name}"),
                (prov.1, "${pvc.namespace}"),
            ],
            Ok(Some(sref("data-web-0-pvc-1234", "team-a"))),
        ),
        (
            "pv name as namespace",
            SecretKind::NodePublish,
            vec![
                (SecretKind::NodePublish.keys().0, "s"),
                (SecretKind::NodePublish.keys().1, "${pv.name}"),
            ],
            Ok(Some(sref("s", "pvc-1234"))),
        ),
        (
            "annotation in a node secret name",
            SecretKind::NodeStage,
            vec![
                (stage.0, "${pvc.annotations['example.com/secret']}"),
                (stage.1, "${pvc.namespace}"),
            ],
            Ok(Some(sref("from-annotation", "team-a"))),
        ),
        (
            // Upstream resolves the ControllerModify secret against the
            // whole claim, as the node secrets.
            "annotation in the controller-modify secret name",
            SecretKind::ControllerModify,
            vec![
                (modify.0, "${pvc.annotations['example.com/secret']}"),
                (modify.1, "${pvc.namespace}"),
            ],
            Ok(Some(sref("from-annotation", "team-a"))),
        ),
        (
            "controller-modify falls back to the default secret",
            SecretKind::ControllerModify,
            vec![
                (DEFAULT_SECRET_NAME_KEY, "all"),
                (DEFAULT_SECRET_NAMESPACE_KEY, "ns"),
            ],
            Ok(Some(sref("all", "ns"))),
        ),
        (
            "controller-modify name without namespace",
            SecretKind::ControllerModify,
            vec![(modify.0, "s")],
            Err(ParamsError::SecretIncomplete {
                secret: SecretKind::ControllerModify,
                present: modify.0,
                missing: modify.1,
            }),
        ),
        (
            "annotation not allowed for the provisioner secret",
            SecretKind::Provisioner,
            vec![
                (prov.0, "${pvc.annotations['example.com/secret']}"),
                (prov.1, "ns"),
            ],
            Err(ParamsError::TokenNotAllowed {
                key: prov.0,
                token: "pvc.annotations['example.com/secret']".into(),
                allowed: "${pv.name}, ${pvc.namespace}, ${pvc.name}",
            }),
        ),
        (
            "claim name not allowed in a namespace",
            SecretKind::NodeStage,
            vec![(stage.0, "s"), (stage.1, "${pvc.name}")],
            Err(ParamsError::TokenNotAllowed {
                key: stage.1,
                token: "pvc.name".into(),
                allowed: "${pv.name}, ${pvc.namespace}",
            }),
        ),
        (
            "annotation not allowed in a namespace",
            SecretKind::NodeStage,
            vec![
                (stage.0, "s"),
                (stage.1, "${pvc.annotations['example.com/secret']}"),
            ],
            Err(ParamsError::TokenNotAllowed {
                key: stage.1,
                token: "pvc.annotations['example.com/secret']".into(),
                allowed: "${pv.name}, ${pvc.namespace}",
            }),
        ),
        (
            "unknown token",
            SecretKind::NodeStage,
            vec![(stage.0, "${pvc.uid}"), (stage.1, "ns")],
            Err(ParamsError::UnknownToken {
                key: stage.0,
                token: "pvc.uid".into(),
                template: "${pvc.uid}".into(),
            }),
        ),
        (
            "missing annotation",
            SecretKind::NodeStage,
            vec![(stage.0, "${pvc.annotations['other']}"), (stage.1, "ns")],
            Err(ParamsError::MissingAnnotation {
                key: stage.0,
                annotation: "other".into(),
                template: "${pvc.annotations['other']}".into(),
            }),
        ),
        (
            "bare dollar",
            SecretKind::NodeStage,
            vec![(stage.0, "$pv"), (stage.1, "ns")],
            Err(ParamsError::TemplateSyntax {
                key: stage.0,
                template: "$pv".into(),
            }),
        ),
        (
            "unterminated token",
            SecretKind::NodeStage,
            vec![(stage.0, "${pv.name"), (stage.1, "ns")],
            Err(ParamsError::TemplateSyntax {
                key: stage.0,
                template: "${pv.name".into(),
            }),
        ),
        (
            "empty token",
            SecretKind::NodeStage,
            vec![(stage.0, "a${}"), (stage.1, "ns")],
            Err(ParamsError::TemplateSyntax {
                key: stage.0,
                template: "a${}".into(),
            }),
        ),
        (
            "invalid resolved name",
            SecretKind::Provisioner,
            vec![(prov.0, "My_Secret"), (prov.1, "ns")],
            Err(ParamsError::InvalidSecretName {
                key: prov.0,
                template: "My_Secret".into(),
                resolved: "My_Secret".into(),
            }),
        ),
        (
            "namespace must be a label",
            SecretKind::Provisioner,
            vec![(prov.0, "s"), (prov.1, "a.b")],
            Err(ParamsError::InvalidSecretNamespace {
                key: prov.1,
                template: "a.b".into(),
                resolved: "a.b".into(),
            }),
        ),
    ];
    for (name, kind, input, want) in cases {
        let got = secret_ref(kind, &params(&input), &ctx(Some(&annotations)));
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn annotation_with_bad_value_is_an_invalid_name() {
    let stage = SecretKind::NodeStage.keys();
    let annotations = BTreeMap::from([("k".to_string(), "Not Valid".to_string())]);
    let got = secret_ref(
        SecretKind::NodeStage,
        &params(&[(stage.0, "${pvc.annotations['k']}"), (stage.1, "ns")]),
        &ctx(Some(&annotations)),
    );
    assert_eq!(
        got,
        Err(ParamsError::InvalidSecretName {
            key: stage.0,
            template: "${pvc.annotations['k']}".into(),
            resolved: "Not Valid".into(),
        })
    );
    // At deletion there are no annotations to resolve against.
    let got = secret_ref(
        SecretKind::NodeStage,
        &params(&[(stage.0, "${pvc.annotations['k']}"), (stage.1, "ns")]),
        &ctx(None),
    );
    assert!(matches!(got, Err(ParamsError::MissingAnnotation { .. })));
}

#[test]
fn pv_secrets_cover_every_operation_but_the_provisioner() {
    let mut input = vec![];
    for kind in SecretKind::ALL {
        let (n, ns) = kind.keys();
        input.push((
            n.to_string(),
            format!("{}-secret", kind.to_string().to_lowercase()),
        ));
        input.push((ns.to_string(), "ns".to_string()));
    }
    let p: BTreeMap<String, String> = input.into_iter().collect();
    let refs = pv_secret_refs(&p, &ctx(None)).expect("valid");
    assert_eq!(
        refs,
        PvSecretRefs {
            controller_publish: Some(sref("controllerpublish-secret", "ns")),
            node_stage: Some(sref("nodestage-secret", "ns")),
            node_publish: Some(sref("nodepublish-secret", "ns")),
            controller_expand: Some(sref("controllerexpand-secret", "ns")),
            node_expand: Some(sref("nodeexpand-secret", "ns")),
            controller_modify: Some(sref("controllermodify-secret", "ns")),
        }
    );
    assert_eq!(
        secret_ref(SecretKind::Provisioner, &p, &ctx(None)),
        Ok(Some(sref("provisioner-secret", "ns")))
    );
    assert_eq!(
        SecretReference::from(&sref("a", "b")),
        SecretReference {
            name: Some("a".into()),
            namespace: Some("b".into())
        }
    );
}
