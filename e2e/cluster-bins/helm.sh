#!/usr/bin/env bash
# Builds Helm (helm.sh/helm/v3, through the Go module proxy) at the version
# pinned in e2e/versions.env into the cache, once; prints its path. The
# chart tests (`e2e/tests/helm.rs`) run `helm lint`, `helm template` and
# install/upgrade/uninstall with it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC1091
source "$here/../versions.env"
: "${HELM_VERSION:?HELM_VERSION missing from e2e/versions.env}"
dir="${CSIOPS_CACHE_DIR:-$HOME/.cache/csiops}/tools/helm-$HELM_VERSION"
bin="$dir/helm"
if [[ ! -x "$bin" ]]; then
  echo "building helm $HELM_VERSION (once, a few minutes)" >&2
  mkdir -p "${dir%/*}"
  tmp="$(mktemp -d "${dir%/*}/.tmp.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  GOTOOLCHAIN=local GOFLAGS=-mod=mod GOBIN="$tmp" CGO_ENABLED=0 \
    go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
  rm -rf "$dir"
  mv "$tmp" "$dir"
  trap - EXIT
fi
echo "$bin"
