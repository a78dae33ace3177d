#!/usr/bin/env bash
# Fetches the published protos that proto/csi.proto,
# proto/pluginregistration.proto and proto/kubernetes/*.proto must match —
# the CSI spec module at CSI_SPEC_VERSION, and k8s.io/kubelet, k8s.io/api and
# k8s.io/apimachinery at the staging version of K8S_VERSION (v1.X.Y ->
# v0.X.Y), all pinned in e2e/versions.env — through the Go module proxy, into
# the cache, once; prints the directory holding csi.proto,
# pluginregistration.proto and the Kubernetes generated.proto files under
# their import paths (k8s.io/...; what `make test` hands to
# proto/tests/upstream.rs).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC1091
source "$here/../versions.env"
: "${CSI_SPEC_VERSION:?CSI_SPEC_VERSION missing from e2e/versions.env}"
: "${K8S_VERSION:?K8S_VERSION missing from e2e/versions.env}"
kubelet_version="v0.${K8S_VERSION#v1.}"
dir="${CSIOPS_CACHE_DIR:-$HOME/.cache/csiops}/tools/upstream-protos-csi-$CSI_SPEC_VERSION-k8s-$kubelet_version"
# The Kubernetes generated.proto files the pod messages come from, with
# everything they import.
K8S_PROTOS=(
  api/core/v1
  apimachinery/pkg/api/resource
  apimachinery/pkg/apis/meta/v1
  apimachinery/pkg/runtime
  apimachinery/pkg/runtime/schema
  apimachinery/pkg/util/intstr
)

# The module's directory in the Go module cache, downloading it if needed.
module_dir() {
  local json moddir
  json="$(GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json "$1")"
  if grep -q '"Error"' <<<"$json"; then
    echo "go mod download $1 failed:" >&2
    echo "$json" >&2
    return 1
  fi
  moddir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")"
  [[ -n "$moddir" && -d "$moddir" ]] || { echo "go mod download $1: no module directory in: $json" >&2; return 1; }
  echo "$moddir"
}

if [[ ! -f "$dir/csi.proto" || ! -f "$dir/pluginregistration.proto" || ! -f "$dir/k8s.io/api/core/v1/generated.proto" ]]; then
  command -v go >/dev/null || { echo "Go is required to fetch the upstream protos (see e2e/README.md)" >&2; exit 1; }
  echo "fetching the CSI spec $CSI_SPEC_VERSION and k8s.io/kubelet, api and apimachinery $kubelet_version protos (once)" >&2
  csi="$(module_dir "github.com/container-storage-interface/spec@$CSI_SPEC_VERSION")"
  kubelet="$(module_dir "k8s.io/kubelet@$kubelet_version")"
  api="$(module_dir "k8s.io/api@$kubelet_version")"
  apimachinery="$(module_dir "k8s.io/apimachinery@$kubelet_version")"
  mkdir -p "${dir%/*}"
  tmp="$(mktemp -d "${dir%/*}/.tmp.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  # The module cache is read-only: copy, then make the copies writable so
  # `make clean-cache` can remove them.
  cp "$csi/csi.proto" "$tmp/csi.proto"
  cp "$kubelet/pkg/apis/pluginregistration/v1/api.proto" "$tmp/pluginregistration.proto"
  for p in "${K8S_PROTOS[@]}"; do
    case "$p" in
      api/*) src="$api/${p#api/}" ;;
      *) src="$apimachinery/${p#apimachinery/}" ;;
    esac
    mkdir -p "$tmp/k8s.io/$p"
    cp "$src/generated.proto" "$tmp/k8s.io/$p/generated.proto"
  done
  chmod -R u+w "$tmp"
  find "$tmp" -type d -exec chmod 755 {} +
  rm -rf "$dir"
  mv "$tmp" "$dir"
  trap - EXIT
fi
echo "$dir"
