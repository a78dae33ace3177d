#!/usr/bin/env bash
# Build (or reuse from cache) the local Kubernetes test bed used by the e2e
# tests: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok,
# csi-mock-driver (Kubernetes' own CSI mock driver, kube/csi-mock-driver),
# regclient (ours, kube/regclient: calls a unix-socket gRPC server the way
# kubelet's plugin registration does), and the real node's kubelet and
# kube-proxy; and external-snapshotter's snapshot-controller and
# csi-snapshotter with the VolumeSnapshot CRDs (crds/snapshot/*.yaml).
#
#   BIN=$(e2e/cluster-bins/build.sh)   # prints ONLY the bin dir on stdout
#   e2e/cluster-bins/build.sh --sync   # regenerate wrapper go.mod/go.sum
#                                      # after editing e2e/versions.env
#   e2e/cluster-bins/build.sh --print-dir  # print the bin dir, never build
#   e2e/cluster-bins/build.sh --core   # all but external-snapshotter (what
#                                      # `make demo` runs; a later full run
#                                      # adds the rest to the same dir)
#   CSIOPS_K8S_MINOR=1.35 e2e/cluster-bins/build.sh [--sync|--core|...]
#                                      # an older supported minor for
#                                      # `make test-matrix` (matrix/<minor>/)
#
# Versions live in e2e/versions.env (the only place they are pinned). Each
# upstream project is built from a small wrapper Go module in this folder
# (kube/, etcd/, kwok/) so that the upstream replace directives do not get
# in the way; kube/ also holds csi-mock-driver's main package. See
# e2e/README.md. An older minor of the support matrix has its own
# versions.env (K8S_VERSION, ETCD_VERSION over the default ones) and its own
# kube/ and etcd/ go.mod/go.sum under matrix/<minor>/; its kube module is
# assembled in the cache from kube/'s sources with matrix/<minor>/kube/ laid
# over them (the go.mod/go.sum, and any source that differs for that
# release); see matrix.sh.
#
# Environment:
#   CSIOPS_CACHE_DIR  cache root (default: $HOME/.cache/csiops)
#   CSIOPS_REBUILD=1  ignore an existing cache entry and rebuild it
#   GOMODCACHE/GOCACHE are honoured as usual (defaults keep re-runs fast).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
E2E_DIR="$(dirname "$HERE")"
VERSIONS_ENV="$E2E_DIR/versions.env"

log() { printf '[cluster-bins %s] %s\n' "$(date +%T)" "$*" >&2; }
# shellcheck source=k8s-ldflags.sh
source "$HERE/k8s-ldflags.sh"
die() { log "ERROR: $*"; exit 1; }

[[ -f "$VERSIONS_ENV" ]] || die "missing $VERSIONS_ENV"
# shellcheck source=/dev/null
source "$VERSIONS_ENV"
# shellcheck source=matrix.sh
source "$HERE/matrix.sh"
matrix_select # CSIOPS_K8S_MINOR: that entry's versions over the default ones
: "${K8S_VERSION:?K8S_VERSION not set in versions.env}"
: "${ETCD_VERSION:?ETCD_VERSION not set in versions.env}"
: "${KWOK_VERSION:?KWOK_VERSION not set in versions.env}"
: "${EXTERNAL_SNAPSHOTTER_VERSION:?EXTERNAL_SNAPSHOTTER_VERSION not set in versions.env}"

command -v go >/dev/null 2>&1 || die "go is not on PATH (Go >= 1.26 is required)"

# Never let `go` silently fetch a different toolchain, never stamp VCS info
# from the surrounding csiops checkout.
export GOTOOLCHAIN=local
export GOFLAGS="-mod=readonly -buildvcs=false"

# k8s.io/kubernetes vX.Y.Z publishes its staging modules as v0.Y.Z.
K8S_STAGING_VERSION="v0.${K8S_VERSION#v1.}"

# ---------------------------------------------------------------------------
# --sync: regenerate the wrapper modules from versions.env (needs the proxy).
# ---------------------------------------------------------------------------
sync_modules() {
  export GOFLAGS="-mod=mod -buildvcs=false"
  local d

  # kube: require k8s.io/kubernetes and replace every staging module (the
  # `v0.0.0` requirements in its go.mod, which upstream replaces with
  # ./staging/src/...) by the published v0.Y.Z release.
  d="$(kube_module_dir)"
  log "sync kube -> k8s.io/kubernetes@$K8S_VERSION (staging $K8S_STAGING_VERSION)"
  local kmod staging godebug
  kmod="$(cd "$d" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
  [[ -f "$kmod" ]] || die "could not download k8s.io/kubernetes@$K8S_VERSION"
  staging="$(awk '$2=="v0.0.0" && $1 ~ /^k8s\.io\// {print $1}' "$kmod" | sort -u)"
  [[ -n "$staging" ]] || die "no staging modules found in $kmod"
  godebug="$(awk '$1=="godebug" && NF==2 {print $2}' "$kmod")"
  rm -f "$d/go.mod" "$d/go.sum"
  printf 'module csiops.local/e2e/cluster-bins/kube\n\ngo 1.24.0\n' >"$d/go.mod"
  (
    cd "$d"
    # Mirror upstream's GODEBUG defaults (our wrapper's go line is newer).
    [[ -n "$godebug" ]] && go mod edit "-godebug=$godebug"
    go mod edit "-require=k8s.io/kubernetes@$K8S_VERSION"
    local m
    for m in $staging; do
      go mod edit "-replace=$m=$m@$K8S_STAGING_VERSION"
    done
    go get -tool \
      "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kubelet@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kube-proxy@$K8S_VERSION" \
      "k8s.io/kubernetes/test/images/agnhost@$K8S_VERSION"
    # The Ginkgo CLI of the storage e2e suite (e2e-suite.sh), at the version
    # k8s.io/kubernetes itself requires (a bare `go get` would take the newest).
    local ginkgo
    ginkgo="$(awk '$1=="github.com/onsi/ginkgo/v2" {print $2; exit}' "$kmod")"
    [[ -n "$ginkgo" ]] || die "no github.com/onsi/ginkgo/v2 requirement in $kmod"
    go get -tool "github.com/onsi/ginkgo/v2/ginkgo@$ginkgo"
    go mod tidy
  ) >&2
  matrix_keep_modules "$d"

  d="$(etcd_module_dir)"
  log "sync etcd -> go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  mkdir -p "$d"
  rm -f "$d/go.mod" "$d/go.sum"
  printf 'module csiops.local/e2e/cluster-bins/etcd\n\ngo 1.24.0\n' >"$d/go.mod"
  (cd "$d" && go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION" && go mod tidy) >&2
  # kwok and external-snapshotter are the same on every minor.
  if [[ -n "$MATRIX_MINOR" ]]; then
    log "sync done; commit $MATRIX_DIR"
    return
  fi

  d="$HERE/kwok"
  log "sync kwok -> sigs.k8s.io/kwok@$KWOK_VERSION"
  rm -f "$d/go.mod" "$d/go.sum"
  printf 'module csiops.local/e2e/cluster-bins/kwok\n\ngo 1.24.0\n' >"$d/go.mod"
  (cd "$d" && go get -tool "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" && go mod tidy) >&2

  # external-snapshotter replaces its client module with ./client, which
  # the module zip leaves out (a nested module): the wrapper requires the
  # published client module at the same tag instead.
  d="$HERE/snapshotter"
  log "sync snapshotter -> github.com/kubernetes-csi/external-snapshotter/v8@$EXTERNAL_SNAPSHOTTER_VERSION"
  rm -f "$d/go.mod" "$d/go.sum"
  mkdir -p "$d"
  printf 'module csiops.local/e2e/cluster-bins/snapshotter\n\ngo 1.26.0\n' >"$d/go.mod"
  (
    cd "$d"
    go mod edit "-require=github.com/kubernetes-csi/external-snapshotter/client/v8@$EXTERNAL_SNAPSHOTTER_VERSION"
    go get -tool \
      "github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller@$EXTERNAL_SNAPSHOTTER_VERSION" \
      "github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter@$EXTERNAL_SNAPSHOTTER_VERSION"
    go mod tidy
  ) >&2

  log "sync done; commit e2e/versions.env and e2e/cluster-bins/*/go.{mod,sum}"
}

# The wrapper go.mod files must agree with versions.env.
check_pins() {
  local kube etcd
  kube="$(kube_mod_file_dir)" etcd="$(etcd_module_dir)"
  grep -Eq "^[[:space:]]*(require )?k8s\.io/kubernetes $K8S_VERSION( |$)" "$kube/go.mod" ||
    die "kube/go.mod does not pin k8s.io/kubernetes $K8S_VERSION; run: $0 --sync"
  grep -Eq "=> k8s\.io/api $K8S_STAGING_VERSION$" "$kube/go.mod" ||
    die "kube/go.mod staging replaces are not $K8S_STAGING_VERSION; run: $0 --sync"
  grep -Eq "^[[:space:]]*(require )?go\.etcd\.io/etcd/server/v3 $ETCD_VERSION( |$)" "$etcd/go.mod" ||
    die "etcd/go.mod does not pin go.etcd.io/etcd/server/v3 $ETCD_VERSION; run: $0 --sync"
  grep -Eq "^[[:space:]]*(require )?sigs\.k8s\.io/kwok $KWOK_VERSION( |$)" "$HERE/kwok/go.mod" ||
    die "kwok/go.mod does not pin sigs.k8s.io/kwok $KWOK_VERSION; run: $0 --sync"
  grep -Eq "^[[:space:]]*(require )?github\.com/kubernetes-csi/external-snapshotter/v8 $EXTERNAL_SNAPSHOTTER_VERSION( |$)" "$HERE/snapshotter/go.mod" ||
    die "snapshotter/go.mod does not pin external-snapshotter/v8 $EXTERNAL_SNAPSHOTTER_VERSION; run: $0 --sync"
  grep -Eq "^[[:space:]]*(require )?github\.com/kubernetes-csi/external-snapshotter/client/v8 $EXTERNAL_SNAPSHOTTER_VERSION( |$)" "$HERE/snapshotter/go.mod" ||
    die "snapshotter/go.mod does not pin external-snapshotter/client/v8 $EXTERNAL_SNAPSHOTTER_VERSION; run: $0 --sync"
}

# ---------------------------------------------------------------------------
# Cache location. The key encodes every pinned version, the Go toolchain, the
# platform, and a hash of the wrapper modules, csi-mock-driver's source and
# the build recipe below.
# ---------------------------------------------------------------------------
RECIPE=9 # bump when the build flags/ldflags or the set of binaries change
# Two parts, each with its own completion marker in the one bin dir: the
# core (control plane, kubelet, kwok, csi-mock-driver, regclient), which is
# all `make demo` runs, and external-snapshotter (snapshot-controller,
# csi-snapshotter, the VolumeSnapshot CRDs), which only the tests use: two
# minutes of a cold demo saved. A dir made before the split has `.complete`
# for both.
CORE_BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kwok csi-mock-driver regclient)
SNAPSHOTTER_BINARIES=(snapshot-controller csi-snapshotter)

cache_key() {
  local gover goos goarch h
  { read -r gover; read -r goos; read -r goarch; } < <(go env GOVERSION GOOS GOARCH)
  h="$( { echo "recipe=$RECIPE"; cat "$(kube_mod_file_dir)"/go.{mod,sum} "$(etcd_module_dir)"/go.{mod,sum} \
    "$HERE"/{kwok,snapshotter}/go.{mod,sum} \
    "$HERE"/kube/csi-mock-driver/*.go "$HERE"/kube/regclient/*.go; matrix_overlay_files; } |
    sha256sum | cut -c1-12)"
  printf 'k8s-%s_etcd-%s_kwok-%s_snap-%s_%s_%s-%s_%s' \
    "$K8S_VERSION" "$ETCD_VERSION" "$KWOK_VERSION" "$EXTERNAL_SNAPSHOTTER_VERSION" "$gover" "$goos" "$goarch" "$h"
}

# The core part present, executable, and reporting the pinned versions.
core_ok() {
  local dir="$1"
  [[ -f "$dir/.complete" || -f "$dir/.complete-core" ]] || return 1
  [[ -s "$dir/kwok-stages.yaml" ]] || return 1
  local b
  for b in "${CORE_BINARIES[@]}"; do [[ -x "$dir/$b" ]] || return 1; done
  # Run them concurrently to keep the warm path well under a second.
  local t; t="$(mktemp -d)"
  "$dir/etcd" --version >"$t/etcd" 2>&1 &
  "$dir/kube-apiserver" --version >"$t/kube-apiserver" 2>&1 &
  "$dir/kube-controller-manager" --version >"$t/kube-controller-manager" 2>&1 &
  "$dir/kube-scheduler" --version >"$t/kube-scheduler" 2>&1 &
  "$dir/kubelet" --version >"$t/kubelet" 2>&1 &
  "$dir/kube-proxy" --version >"$t/kube-proxy" 2>&1 &
  "$dir/kwok" --version >"$t/kwok" 2>&1 &
  "$dir/csi-mock-driver" --version >"$t/csi-mock-driver" 2>&1 &
  "$dir/regclient" -version >"$t/regclient" 2>&1 &
  local rc=0
  wait || rc=1
  grep -q "etcd Version: ${ETCD_VERSION#v}" "$t/etcd" || rc=1
  grep -qx "Kubernetes $K8S_VERSION" "$t/kube-apiserver" || rc=1
  grep -qx "Kubernetes $K8S_VERSION" "$t/kube-controller-manager" || rc=1
  grep -qx "Kubernetes $K8S_VERSION" "$t/kube-scheduler" || rc=1
  grep -qx "Kubernetes $K8S_VERSION" "$t/kubelet" || rc=1
  grep -qx "Kubernetes $K8S_VERSION" "$t/kube-proxy" || rc=1
  grep -q "$KWOK_VERSION" "$t/kwok" || rc=1
  grep -q "^csi-mock-driver k8s.io/kubernetes $K8S_VERSION " "$t/csi-mock-driver" || rc=1
  grep -q "^regclient k8s.io/kubelet $K8S_STAGING_VERSION " "$t/regclient" || rc=1
  rm -rf "$t"
  return "$rc"
}

# The external-snapshotter part present and reporting the pinned version.
snapshotter_ok() {
  local dir="$1"
  [[ -f "$dir/.complete" || -f "$dir/.complete-snapshotter" ]] || return 1
  local crd b
  for crd in volumesnapshotclasses volumesnapshotcontents volumesnapshots; do
    [[ -s "$dir/crds/snapshot/snapshot.storage.k8s.io_$crd.yaml" ]] || return 1
  done
  for b in "${SNAPSHOTTER_BINARIES[@]}"; do
    [[ -x "$dir/$b" ]] && "$dir/$b" --version 2>&1 | grep -q " $EXTERNAL_SNAPSHOTTER_VERSION$" || return 1
  done
}

# bins_ok DIR PART: PART (core or full) is there.
bins_ok() {
  core_ok "$1" && { [[ "$2" == core ]] || snapshotter_ok "$1"; }
}

# GO_COMPILE_FLAGS (k8s-ldflags.sh) are e2e-suite.sh's too.
build_flags=("${GO_COMPILE_FLAGS[@]}" -buildvcs=false)

# The core part into $1, marked `.complete-core`.
build_core_into() {
  local out="$1"

  # Fetch everything up front (a no-op when GOMODCACHE is warm); go.sum is
  # complete, so this never edits go.mod/go.sum (-mod=readonly).
  local d kube etcd
  kube="$(kube_module_dir)" etcd="$(etcd_module_dir)"
  for d in "$kube" "$etcd" "$HERE/kwok"; do
    log "go mod download (${d#"$HERE"/})"
    (cd "$d" && go mod download) >&2
  done

  # --- Kubernetes control plane -------------------------------------------
  local kld
  kld="$(k8s_version_ldflags "$kube" "$K8S_VERSION")"
  # csi-mock-driver (our main package around k8s.io/kubernetes/test/e2e/
  # storage/drivers/csi-test) shares the pinned module graph and most compiled
  # packages, so it goes in the same invocation. It takes its --version from
  # the embedded build info; the -X flags do not touch it.
  log "building kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, csi-mock-driver $K8S_VERSION (slowest step: ~5-7 min cold on 2 cores)"
  (cd "$kube" && CGO_ENABLED=0 go build "${build_flags[@]}" -ldflags="$kld" -o "$out/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy \
    ./csi-mock-driver ./regclient) >&2

  # --- etcd ------------------------------------------------------------------
  log "building etcd $ETCD_VERSION"
  (cd "$etcd" && CGO_ENABLED=0 go build "${build_flags[@]}" \
    -ldflags="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=gomod-$ETCD_VERSION" \
    -o "$out/etcd" go.etcd.io/etcd/server/v3) >&2

  # --- kwok ------------------------------------------------------------------
  log "building kwok $KWOK_VERSION"
  (cd "$HERE/kwok" && CGO_ENABLED=0 go build "${build_flags[@]}" \
    -ldflags="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" \
    -o "$out/kwok" sigs.k8s.io/kwok/cmd/kwok) >&2

  # kwok's controller refuses to start without Stage objects ("no stages
  # found"). Assemble the same defaults kwokctl uses (node-fast + node
  # heartbeat-with-lease + pod-fast) from the pinned kwok module, so the e2e
  # harness can run: kwok --config=$BIN/kwok-stages.yaml
  #   --manage-all-nodes=true --node-lease-duration-seconds=40 ...
  local kwok_dir f
  kwok_dir="$(cd "$HERE/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
  for f in node/fast/node-initialize.yaml \
    node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
    pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    [[ -f "$kwok_dir/kustomize/stage/$f" ]] || die "kwok stage $f not found in $kwok_dir"
    printf -- '---\n# from sigs.k8s.io/kwok@%s kustomize/stage/%s\n' "$KWOK_VERSION" "$f"
    cat "$kwok_dir/kustomize/stage/$f"
  done >"$out/kwok-stages.yaml"

  matrix_versions_env >"$out/versions.env"
  touch "$out/.complete-core"
}

# The external-snapshotter part into $1, marked `.complete-snapshotter`.
build_snapshotter_into() {
  local out="$1" f
  log "go mod download (snapshotter)"
  (cd "$HERE/snapshotter" && go mod download) >&2
  # Both commands print `main.version` for --version.
  log "building snapshot-controller, csi-snapshotter $EXTERNAL_SNAPSHOTTER_VERSION"
  (cd "$HERE/snapshotter" && CGO_ENABLED=0 go build "${build_flags[@]}" \
    -ldflags="-s -w -X main.version=$EXTERNAL_SNAPSHOTTER_VERSION" -o "$out/" \
    github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller \
    github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter) >&2
  # The VolumeSnapshot CRDs live in the client module (the group snapshot
  # ones are left out: nothing here uses them).
  local client_dir
  client_dir="$(cd "$HERE/snapshotter" && go list -m -f '{{.Dir}}' github.com/kubernetes-csi/external-snapshotter/client/v8)"
  mkdir -p "$out/crds/snapshot"
  for f in volumesnapshotclasses volumesnapshotcontents volumesnapshots; do
    f="snapshot.storage.k8s.io_$f.yaml"
    [[ -f "$client_dir/config/crd/$f" ]] || die "CRD $f not found in $client_dir"
    cp "$client_dir/config/crd/$f" "$out/crds/snapshot/$f"
  done
  chmod -R u+w "$out/crds"
  touch "$out/.complete-snapshotter"
}

main() {
  local mode="build" part="full"
  case "${1:-}" in
    --sync) sync_modules; return ;;
    --print-dir) mode="print" ;;
    --core) part="core" ;;
    -h|--help) sed -n '2,23p' "$0" >&2; return ;;
    "") ;;
    *) die "unknown argument: $1" ;;
  esac

  check_pins
  local root="${CSIOPS_CACHE_DIR:-$HOME/.cache/csiops}/bins"
  local key; key="$(cache_key)"
  local dir="$root/$key"
  if [[ "$mode" == print ]]; then echo "$dir"; return; fi

  if [[ "${CSIOPS_REBUILD:-0}" != 1 ]] && bins_ok "$dir" "$part"; then
    echo "$dir"
    return
  fi

  mkdir -p "$root"
  # Serialise concurrent builders of the same key.
  exec 9>"$root/.$key.lock"
  if command -v flock >/dev/null 2>&1; then
    log "waiting for lock $root/.$key.lock"
    flock 9
    if [[ "${CSIOPS_REBUILD:-0}" != 1 ]] && bins_ok "$dir" "$part"; then
      echo "$dir"
      return
    fi
  fi

  local tmp; tmp="$(mktemp -d "$root/.tmp.$key.XXXXXX")"
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  local start=$SECONDS
  if [[ "${CSIOPS_REBUILD:-0}" != 1 ]] && core_ok "$dir"; then
    # Only external-snapshotter is missing (a `--core` run came first): add
    # it to the published dir. New files only, so whoever runs the core
    # binaries meanwhile is not disturbed.
    log "adding external-snapshotter to $dir (about 2 min cold on 2 cores)"
    build_snapshotter_into "$tmp"
    snapshotter_ok "$tmp" || die "freshly built snapshotter binaries failed their --version check in $tmp"
    mkdir -p "$dir/crds"
    mv -f "$tmp/snapshot-controller" "$tmp/csi-snapshotter" "$dir/"
    rm -rf "$dir/crds/snapshot"
    mv "$tmp/crds/snapshot" "$dir/crds/snapshot"
    touch "$dir/.complete-snapshotter"
    rm -rf "$tmp"
  else
    log "first run for these versions: building the local control plane from source into $dir (about 5 min cold on 2 cores, external-snapshotter 2 more; cached afterwards) ($(go env GOVERSION), GOMODCACHE=$(go env GOMODCACHE))"
    build_core_into "$tmp"
    [[ "$part" == core ]] || build_snapshotter_into "$tmp"
    bins_ok "$tmp" "$part" || die "freshly built binaries failed their --version check in $tmp"
    chmod 755 "$tmp"
    # Atomic publish: rename within the same directory.
    if [[ -e "$dir" ]]; then
      local old; old="$(mktemp -d "$root/.old.$key.XXXXXX")"
      mv -T "$dir" "$old/d" && rm -rf "$old"
    fi
    mv -T "$tmp" "$dir"
  fi
  trap - EXIT
  log "done in $((SECONDS - start))s: $dir"
  echo "$dir"
}

main "$@"
