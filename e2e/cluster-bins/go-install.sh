#!/usr/bin/env bash
# `go install <package>@<version>` of a tool pinned in e2e/versions.env, into
# the cache, once; prints the binary's path.
#   go-install.sh NAME VERSION_VAR PACKAGE
# NAME is the cache dir's prefix and the binary's name (the package's last
# element); VERSION_VAR names the versions.env variable holding the version.
set -euo pipefail
name="$1" var="$2" pkg="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC1091
source "$here/../versions.env"
version="${!var:-}"
[[ -n "$version" ]] || { echo "$var missing from e2e/versions.env" >&2; exit 1; }
dir="${CSIOPS_CACHE_DIR:-$HOME/.cache/csiops}/tools/$name-$version"
bin="$dir/${pkg##*/}"
if [[ ! -x "$bin" ]]; then
  echo "building $name $version (once)" >&2
  mkdir -p "${dir%/*}"
  tmp="$(mktemp -d "${dir%/*}/.tmp.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  GOTOOLCHAIN=local GOFLAGS=-mod=mod GOBIN="$tmp" CGO_ENABLED=0 \
    go install "$pkg@$version" >&2
  rm -rf "$dir"
  mv "$tmp" "$dir"
  trap - EXIT
fi
echo "$bin"
