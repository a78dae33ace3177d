#!/usr/bin/env bash
# Builds upstream's csi-attacher (github.com/kubernetes-csi/external-attacher)
# at the version pinned in e2e/versions.env into the cache, once; prints its
# path. Used by the attacher benchmark only (`make bench-attacher`).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC1091
source "$here/../versions.env"
: "${EXTERNAL_ATTACHER_VERSION:?EXTERNAL_ATTACHER_VERSION missing from e2e/versions.env}"
dir="${CSIOPS_CACHE_DIR:-$HOME/.cache/csiops}/tools/external-attacher-$EXTERNAL_ATTACHER_VERSION"
bin="$dir/csi-attacher"
if [[ ! -x "$bin" ]]; then
  echo "building external-attacher $EXTERNAL_ATTACHER_VERSION (once, ~2 min)" >&2
  mkdir -p "${dir%/*}"
  tmp="$(mktemp -d "${dir%/*}/.tmp.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  # Its go.mod carries replace directives, so `go install pkg@version`
  # refuses it: build inside a copy of the downloaded module instead.
  mod="github.com/kubernetes-csi/external-attacher/v4@$EXTERNAL_ATTACHER_VERSION"
  src="$(GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json "$mod" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  [[ -d "$src" ]] || { echo "go mod download $mod gave no directory" >&2; exit 1; }
  cp -r "$src" "$tmp/src"
  chmod -R u+w "$tmp/src"
  mode=mod
  [[ -d "$tmp/src/vendor" ]] && mode=vendor
  (cd "$tmp/src" && GOTOOLCHAIN=local CGO_ENABLED=0 go build -mod="$mode" \
    -ldflags "-X main.version=$EXTERNAL_ATTACHER_VERSION" -o "$tmp/csi-attacher" ./cmd/csi-attacher) >&2
  rm -rf "$tmp/src"
  rm -rf "$dir"
  mv "$tmp" "$dir"
  trap - EXIT
fi
echo "$bin"
