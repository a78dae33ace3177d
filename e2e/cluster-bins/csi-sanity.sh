#!/usr/bin/env bash
# Builds upstream's csi-sanity (github.com/kubernetes-csi/csi-test) at the
# version pinned in e2e/versions.env into the cache, once; prints its path.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC1091
source "$here/../versions.env"
: "${CSI_SANITY_VERSION:?CSI_SANITY_VERSION missing from e2e/versions.env}"
dir="${CSIOPS_CACHE_DIR:-$HOME/.cache/csiops}/tools/csi-sanity-$CSI_SANITY_VERSION"
bin="$dir/csi-sanity"
if [[ ! -x "$bin" ]]; then
  echo "building csi-sanity $CSI_SANITY_VERSION (once, ~1 min)" >&2
  mkdir -p "${dir%/*}"
  tmp="$(mktemp -d "${dir%/*}/.tmp.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  GOTOOLCHAIN=local GOFLAGS=-mod=mod GOBIN="$tmp" CGO_ENABLED=0 \
    go install "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$CSI_SANITY_VERSION" >&2
  rm -rf "$dir"
  mv "$tmp" "$dir"
  trap - EXIT
fi
echo "$bin"
