#!/usr/bin/env bash
# Fetches the published protos that proto/csi.proto and
# proto/pluginregistration.proto must match — the CSI spec module at
# CSI_SPEC_VERSION and k8s.io/kubelet at the staging version of K8S_VERSION
# (v1.X.Y -> v0.X.Y), both pinned in e2e/versions.env — through the Go module
# proxy, into the cache, once; prints the directory holding csi.proto and
# pluginregistration.proto (what `make test` hands to proto/tests/upstream.rs).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC1091
source "$here/../versions.env"
: "${CSI_SPEC_VERSION:?CSI_SPEC_VERSION missing from e2e/versions.env}"
: "${K8S_VERSION:?K8S_VERSION missing from e2e/versions.env}"
kubelet_version="v0.${K8S_VERSION#v1.}"
dir="${CSIOPS_CACHE_DIR:-$HOME/.cache/csiops}/tools/upstream-protos-csi-$CSI_SPEC_VERSION-kubelet-$kubelet_version"

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

if [[ ! -f "$dir/csi.proto" || ! -f "$dir/pluginregistration.proto" ]]; then
  command -v go >/dev/null || { echo "Go is required to fetch the upstream protos (see e2e/README.md)" >&2; exit 1; }
  echo "fetching the CSI spec $CSI_SPEC_VERSION and k8s.io/kubelet $kubelet_version protos (once)" >&2
  csi="$(module_dir "github.com/container-storage-interface/spec@$CSI_SPEC_VERSION")"
  kubelet="$(module_dir "k8s.io/kubelet@$kubelet_version")"
  mkdir -p "${dir%/*}"
  tmp="$(mktemp -d "${dir%/*}/.tmp.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  # The module cache is read-only: copy, then make the copies writable so
  # `make clean-cache` can remove them.
  cp "$csi/csi.proto" "$tmp/csi.proto"
  cp "$kubelet/pkg/apis/pluginregistration/v1/api.proto" "$tmp/pluginregistration.proto"
  chmod u+w "$tmp"/*.proto
  chmod 755 "$tmp"
  rm -rf "$dir"
  mv "$tmp" "$dir"
  trap - EXIT
fi
echo "$dir"
