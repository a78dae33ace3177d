//! The image references agree everywhere they are written: the operator
//! Deployment in `manifests/install.yaml`, the operator's `--sidecar-image`
//! default, the tags `make images` builds (`e2e/images/build.sh
//! --print-refs`) and the pause image of `e2e/versions.env`. Nothing here
//! hard-codes a ref: only the crate version is taken as given.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use csiops_operator::cli::Args;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("operator/ has a parent")
        .to_path_buf()
}

fn read(rel: &str) -> String {
    let path = workspace().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// `KEY=value` lines (comments and blank lines skipped).
fn parse_env(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// What `make images` tags, with the defaults (no registry/tag override).
fn built_refs() -> BTreeMap<String, String> {
    let script = workspace().join("e2e/images/build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("--print-refs")
        .env_remove("CSIOPS_IMAGE_REGISTRY")
        .env_remove("CSIOPS_IMAGE_TAG")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} --print-refs failed: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let refs = parse_env(&String::from_utf8_lossy(&out.stdout));
    for key in [
        "OPERATOR_IMAGE",
        "SIDECAR_IMAGE",
        "TEST_DRIVER_IMAGE",
        "PAUSE_IMAGE",
    ] {
        assert!(
            refs.contains_key(key),
            "--print-refs has no {key}: {refs:?}"
        );
    }
    refs
}

/// The image of the operator Deployment's only container in install.yaml.
fn install_operator_image() -> String {
    let text = read("manifests/install.yaml");
    let mut images = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v: serde_yaml::Value = serde::Deserialize::deserialize(doc).expect("install.yaml");
        if v["kind"].as_str() != Some("Deployment") {
            continue;
        }
        for c in v["spec"]["template"]["spec"]["containers"]
            .as_sequence()
            .expect("Deployment containers")
        {
            images.push(c["image"].as_str().expect("container image").to_string());
        }
    }
    assert_eq!(
        images.len(),
        1,
        "one Deployment container in install.yaml: {images:?}"
    );
    images.remove(0)
}

fn repo_and_tag(image: &str) -> (&str, &str) {
    let (repo, tag) = image.rsplit_once(':').expect("image has a tag");
    assert!(!tag.contains('/'), "{image} has no tag");
    repo.rsplit_once('/').expect("image has a repository path");
    (repo, tag)
}

#[test]
fn install_manifest_runs_the_operator_image_make_images_builds() {
    assert_eq!(install_operator_image(), built_refs()["OPERATOR_IMAGE"]);
}

#[test]
fn sidecar_image_default_is_the_sidecar_image_make_images_builds() {
    let args = Args::try_parse_from(["csiops-operator"]).expect("defaults parse");
    assert_eq!(args.sidecar_image, built_refs()["SIDECAR_IMAGE"]);
}

#[test]
fn csiops_images_share_registry_and_carry_the_crate_version() {
    let refs = built_refs();
    let expected_tag = format!("v{VERSION}");
    let mut registries = Vec::new();
    for (key, name) in [
        ("OPERATOR_IMAGE", "csiops-operator"),
        ("SIDECAR_IMAGE", "csiops-sidecar"),
        ("TEST_DRIVER_IMAGE", "csi-test-driver"),
    ] {
        let (repo, tag) = repo_and_tag(&refs[key]);
        assert_eq!(tag, expected_tag, "{key}={}", refs[key]);
        let (registry, last) = repo.rsplit_once('/').expect("repository path");
        assert_eq!(last, name, "{key}={}", refs[key]);
        registries.push(registry.to_string());
    }
    registries.dedup();
    assert_eq!(registries.len(), 1, "one registry for all images: {refs:?}");
}

#[test]
fn pause_image_is_the_one_in_versions_env() {
    let versions = parse_env(&read("e2e/versions.env"));
    let pause = versions
        .get("PAUSE_IMAGE")
        .expect("e2e/versions.env has PAUSE_IMAGE");
    assert_eq!(&built_refs()["PAUSE_IMAGE"], pause);
    // Never pulled: a local name that no registry answers for.
    assert!(pause.starts_with("localhost/"), "{pause}");
    repo_and_tag(pause);
}

/// The Makefile builds the images with the script whose refs are checked
/// above, and hands its output dir to `test` and `demo`.
#[test]
fn makefile_builds_images_with_the_checked_script() {
    let makefile = read("Makefile");
    let mut targets: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in makefile.lines() {
        if let Some(recipe) = line.strip_prefix('\t') {
            if let Some(t) = &current {
                targets
                    .get_mut(t)
                    .expect("target")
                    .1
                    .push(recipe.to_string());
            }
            continue;
        }
        current = None;
        if line.starts_with(['#', ' ', '.']) || line.contains(":=") || line.contains("?=") {
            continue;
        }
        if let Some((name, deps)) = line.split_once(':') {
            if !name.contains(['=', '$']) {
                targets.insert(name.trim().to_string(), (deps.to_string(), Vec::new()));
                current = Some(name.trim().to_string());
            }
        }
    }
    let phony = makefile
        .lines()
        .find_map(|l| l.strip_prefix(".PHONY:"))
        .expect(".PHONY line");
    assert!(
        phony.split_whitespace().any(|t| t == "images"),
        "images is .PHONY"
    );

    let (_, recipe) = targets.get("images").expect("an `images` target");
    assert!(
        recipe.iter().any(|l| l.contains("e2e/images/build.sh")),
        "`make images` runs e2e/images/build.sh: {recipe:?}"
    );
    let (deps, recipe) = targets.get("test").expect("a `test` target");
    // Either as a prerequisite or among the targets its recipe builds side
    // by side (`$(MAKE) -j3 … images …`).
    let builds_images = deps.split_whitespace().any(|d| d == "images")
        || recipe
            .iter()
            .any(|l| l.contains("$(MAKE)") && l.split_whitespace().any(|w| w == "images"));
    assert!(
        builds_images,
        "`make test` builds the images: {deps} {recipe:?}"
    );
    assert!(
        recipe
            .iter()
            .any(|l| l.contains("CSIOPS_IMAGES_DIR=\"$$(e2e/images/build.sh)\"")),
        "`make test` exports CSIOPS_IMAGES_DIR from e2e/images/build.sh: {recipe:?}"
    );
    // `make demo` builds its phases itself (e2e/demo.sh, timing each): the
    // images through the same script (its `--demo` images, without the
    // size-optimised node binary), whose output dir it exports.
    let (_, recipe) = targets.get("demo").expect("a `demo` target");
    assert!(
        recipe.iter().any(|l| l.contains("e2e/demo.sh")),
        "`make demo` runs e2e/demo.sh: {recipe:?}"
    );
    let demo = read("e2e/demo.sh");
    assert!(
        demo.contains("IMAGES_DIR=\"$(\"$HERE/images/build.sh\" --demo)\"")
            && demo.contains("CSIOPS_IMAGES_DIR=\"$IMAGES_DIR\""),
        "e2e/demo.sh builds the images with e2e/images/build.sh --demo and exports CSIOPS_IMAGES_DIR"
    );
}
