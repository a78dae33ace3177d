# csiops — build, test and demo entry points. Every target installs what it
# needs on a fresh machine (Rust components, the Go-built test bed).

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo

.PHONY: all build test test-binaries test-matrix test-upgrade unit e2e lint fmt crds api-docs manifests cluster-bins e2e-suite node-prereqs images demo conformance toolchain clean-cache bench-attacher bench-fleet bench-scale

all: build

## Rust components the checks need (no-op when present).
toolchain:
	@command -v rustup >/dev/null && rustup component add rustfmt clippy >/dev/null 2>&1 || true
	@command -v go >/dev/null || { echo "Go is required to build the e2e test bed (see e2e/README.md)"; exit 1; }
	@command -v kubectl >/dev/null || { echo "kubectl is required by the e2e tests and the demo"; exit 1; }

build: toolchain
	$(CARGO) build --workspace --bins

## Regenerate the checked-in CRD YAML from crds/src.
crds:
	$(CARGO) run -q -p csiops-crds --bin crdgen > crds/csidriverdeployments.csiops.dev.yaml

## Regenerate docs/api-reference.md from the same Rust types (a test fails when it is stale).
api-docs:
	$(CARGO) run -q -p csiops-crds --bin apidoc > docs/api-reference.md

## Regenerate manifests/install.yaml and the Helm chart (manifests/helm/csiops)
## from operator/src/install.rs and operator/src/helm.rs.
manifests:
	$(CARGO) run -q -p csiops-operator --bin csiops-manifests > manifests/install.yaml
	rm -rf manifests/helm/csiops
	$(CARGO) run -q -p csiops-operator --bin csiops-manifests -- --helm-chart manifests/helm/csiops

## Build (or reuse from the cache) etcd, kube-*, kubelet, kube-proxy, kwok and csi-mock-driver.
cluster-bins:
	@e2e/cluster-bins/build.sh >/dev/null

## Build (or reuse from the cache) Kubernetes' e2e.test (External Storage),
## ginkgo and the suite's images (e2e/cluster-bins/e2e-suite.sh).
e2e-suite:
	@e2e/cluster-bins/e2e-suite.sh >/dev/null

## Debian packages the real node of the e2e needs (no-op when present).
NODE_PACKAGES := containerd runc containernetworking-plugins iptables
node-prereqs:
	@if ! command -v containerd >/dev/null || ! command -v runc >/dev/null || \
	    ! command -v iptables >/dev/null || [ ! -x /usr/lib/cni/bridge ]; then \
	  echo "installing $(NODE_PACKAGES)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(NODE_PACKAGES) >/dev/null; \
	fi

## Build (or reuse from the cache) the OCI image archives: csiops-operator,
## csiops-sidecar, csi-test-driver and the e2e pause image, with buildah and
## static musl binaries, no daemon. Prints the output dir (archives + refs.env).
images:
	@e2e/images/build.sh

lint: toolchain
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## Every test: lint, unit and golden tests, then the e2e suite on a real local control plane.
## What the e2e tests need (the control plane, the image archives, the
## workspace's binaries and integration-test binaries) is built side by
## side, each one's output shown whole when it ends; then csiops-test-run
## (run as built: `cargo run` would resolve other features and rebuild)
## runs the binaries in two lanes, real-node binaries one at a time beside
## the rest, and at idle priority beside them builds what only some
## binaries wait for (the e2e suite, helm, csi-sanity, the published
## protos) and the unit-test binaries, then runs the lint and the doc tests
## (e2e/src/testrun.rs). CSIOPS_TEST_JOBS: shared-lane binaries at once.
test: toolchain node-prereqs
	$(MAKE) --no-print-directory -j3 --output-sync=target cluster-bins images test-binaries
	CSIOPS_BIN_DIR="$$(e2e/cluster-bins/build.sh)" \
	CSIOPS_IMAGES_DIR="$$(e2e/images/build.sh)" \
	"$${CARGO_TARGET_DIR:-target}/debug/csiops-test-run"

## The workspace's binaries and integration-test binaries (they share the
## cargo target dir: one after the other, while the images and the control
## plane build beside them); csiops-test-run then finds them built.
test-binaries:
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace --no-run --test '*'

## The cross-version subset on each older supported minor (not part of
## `test`; run it before landing a change to version-dependent code): per
## minor its own control plane, kubelet and kube-proxy (built once from
## e2e/cluster-bins/matrix/<minor>/), then the named e2e tests. See
## docs/kubernetes-versions.md. MATRIX_MINORS, MATRIX_TESTS.
MATRIX_MINORS ?= 1.35 1.36
MATRIX_TESTS ?= cluster csidriver_fields real_node walkthrough node_local fleet_upgrade security conformance
test-matrix: toolchain node-prereqs images build
	for minor in $(MATRIX_MINORS); do \
	  echo "=== Kubernetes $$minor: $(MATRIX_TESTS)"; \
	  CSIOPS_K8S_MINOR=$$minor \
	  CSIOPS_BIN_DIR="$$(CSIOPS_K8S_MINOR=$$minor e2e/cluster-bins/build.sh)" \
	  CSIOPS_E2E_SUITE="$$(CSIOPS_K8S_MINOR=$$minor e2e/cluster-bins/e2e-suite.sh)" \
	  CSIOPS_IMAGES_DIR="$$(e2e/images/build.sh)" \
	  $(CARGO) test -p csiops-e2e $(addprefix --test ,$(MATRIX_TESTS)) || exit 1; \
	done

## A Kubernetes upgrade under csiops (not part of `test`: it needs a second
## minor's binaries; run it before landing a change to version-dependent
## code or to what a drain touches): two real nodes start on UPGRADE_FROM,
## the operator deploys a central driver with two controller replicas and a
## writer uses a volume, then the control plane and each node's kubelet
## (drain, restart, uncordon) move to the pinned release. Prints a timeline.
## See e2e/tests/cluster_upgrade.rs and docs/kubernetes-versions.md.
UPGRADE_FROM ?= 1.36
test-upgrade: toolchain cluster-bins node-prereqs images
	CSIOPS_UPGRADE_FROM_BIN_DIR="$$(CSIOPS_K8S_MINOR=$(UPGRADE_FROM) e2e/cluster-bins/build.sh --core)" \
	CSIOPS_BIN_DIR="$$(e2e/cluster-bins/build.sh)" \
	CSIOPS_IMAGES_DIR="$$(e2e/images/build.sh)" \
	$(CARGO) test -p csiops-e2e --test cluster_upgrade -- --ignored --nocapture

## Unit tests only (no control plane; Go fetches the published protos once).
unit:
	CSIOPS_UPSTREAM_PROTOS="$$(e2e/cluster-bins/upstream-protos.sh)" \
	$(CARGO) test --workspace --exclude csiops-e2e

## The main job: a local control plane, the operator, the hostpath example,
## and `kubectl get csidriverdeployments -o wide`. Builds only what the demo
## runs (e2e/demo.sh prints each phase with its elapsed time).
demo: toolchain node-prereqs
	@e2e/demo.sh

## Kubernetes' own storage e2e suite ("External Storage") against the drivers
## csiops deploys (e2e/conformance/), on a local control plane with two real
## nodes, as kubernetes-csi's prow jobs run it: parallel, parallel feature
## (snapshot) tests, serial. Prints passed/failed/skipped per driver
## definition; JUnit and JSON reports in CONFORMANCE_OUT. See e2e/README.md.
CONFORMANCE_PROCS ?= 4
CONFORMANCE_OUT ?= $(CURDIR)/target/conformance
conformance: toolchain cluster-bins e2e-suite node-prereqs images
	CSIOPS_BIN_DIR="$$(e2e/cluster-bins/build.sh)" \
	CSIOPS_IMAGES_DIR="$$(e2e/images/build.sh)" \
	CSIOPS_E2E_SUITE="$$(e2e/cluster-bins/e2e-suite.sh)" \
	$(CARGO) run -q -p csiops-e2e --bin csiops-conformance -- \
	  --procs $(CONFORMANCE_PROCS) --out "$(CONFORMANCE_OUT)"

## Benchmark (not part of `test`): our attacher vs upstream csi-attacher
## (built once from the Go module proxy). BENCH_VAS=N, BENCH_QPS, BENCH_BURST.
BENCH_VAS ?= 300
BENCH_QPS ?= 5
BENCH_BURST ?= 10
bench-attacher: toolchain cluster-bins
	$(CARGO) build --release -p csiops-sidecars --bin csiops-sidecar -p csiops-e2e --bin csi-test-driver --bin csiops-bench-attach
	CSIOPS_BIN_DIR="$$(e2e/cluster-bins/build.sh)" \
	CSIOPS_EXTERNAL_ATTACHER="$$(e2e/cluster-bins/external-attacher.sh)" \
	CSIOPS_SIDECAR_BIN="$${CARGO_TARGET_DIR:-target}/release/csiops-sidecar" \
	CSIOPS_TEST_DRIVER_BIN="$${CARGO_TARGET_DIR:-target}/release/csi-test-driver" \
	"$${CARGO_TARGET_DIR:-target}/release/csiops-bench-attach" --vas $(BENCH_VAS) --qps $(BENCH_QPS) --burst $(BENCH_BURST)

## Benchmark (not part of `test`): the operator on 1000 kwok nodes × 20
## CSIDriverDeployments (e2e/bench/README.md): API requests at rest, edit to
## first write, memory, upgrade against a bare DaemonSet rollout. Takes about
## half an hour. BENCH_NODES, BENCH_DRIVERS, BENCH_IDLE (seconds at rest),
## BENCH_MAX_UNAVAILABLE.
BENCH_NODES ?= 1000
BENCH_DRIVERS ?= 20
BENCH_IDLE ?= 600
BENCH_MAX_UNAVAILABLE ?= 10%
bench-fleet: toolchain cluster-bins
	$(CARGO) build --release -p csiops-operator --bin csiops-operator -p csiops-e2e --bin csiops-bench-fleet
	CSIOPS_BIN_DIR="$$(e2e/cluster-bins/build.sh)" \
	CSIOPS_OPERATOR_BIN="$${CARGO_TARGET_DIR:-target}/release/csiops-operator" \
	"$${CARGO_TARGET_DIR:-target}/release/csiops-bench-fleet" --nodes $(BENCH_NODES) --drivers $(BENCH_DRIVERS) \
	  --idle-seconds $(BENCH_IDLE) --max-unavailable "$(BENCH_MAX_UNAVAILABLE)"

## Benchmark (not part of `test`): the sidecars at cluster scale, ours and
## upstream's side by side (issue 39; e2e/bench/README.md): the operator
## beside BENCH_VOLUMES bound volumes, steady state and failover at them, a registrar restart among
## BENCH_CSINODES CSINodes, BENCH_BURST_CLAIMS claims at once. Upstream
## binaries by path (UPSTREAM_PROVISIONER, UPSTREAM_ATTACHER,
## UPSTREAM_REGISTRAR); without one that side runs ours only and says so.
## BENCH_PHASES picks measures (operator,steady,failover,registrar,burst);
## BENCH_SCALE_ARGS passes more flags (e.g. --rest 30 --settle 30).
## Ours is the binary the sidecar image ships (static musl, from `make
## images`): memory is what this measures, and the allocator is part of it.
BENCH_VOLUMES ?= 10000
BENCH_BURST_CLAIMS ?= 50000
BENCH_CSINODES ?= 10000
BENCH_PHASES ?= operator,steady,failover,registrar,burst
bench-scale: toolchain cluster-bins images
	$(CARGO) build --release -p csiops-e2e --bin csi-test-driver --bin csiops-bench-scale \
	  -p csiops-operator --bin csiops-operator
	CSIOPS_BIN_DIR="$$(e2e/cluster-bins/build.sh)" \
	CSIOPS_OPERATOR_BIN="$${CARGO_TARGET_DIR:-target}/release/csiops-operator" \
	CSIOPS_SIDECAR_BIN="$$(e2e/images/build.sh)/sidecar-bin/csiops-sidecar" \
	CSIOPS_TEST_DRIVER_BIN="$${CARGO_TARGET_DIR:-target}/release/csi-test-driver" \
	"$${CARGO_TARGET_DIR:-target}/release/csiops-bench-scale" --volumes $(BENCH_VOLUMES) \
	  --burst-claims $(BENCH_BURST_CLAIMS) --csinodes $(BENCH_CSINODES) --phases $(BENCH_PHASES) \
	  $(if $(UPSTREAM_PROVISIONER),--upstream-provisioner "$(UPSTREAM_PROVISIONER)") \
	  $(if $(UPSTREAM_ATTACHER),--upstream-attacher "$(UPSTREAM_ATTACHER)") \
	  $(if $(UPSTREAM_REGISTRAR),--upstream-registrar "$(UPSTREAM_REGISTRAR)") $(BENCH_SCALE_ARGS)

clean-cache:
	rm -rf "$${CSIOPS_CACHE_DIR:-$$HOME/.cache/csiops}"
