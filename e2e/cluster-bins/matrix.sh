# Sourced by build.sh: the support matrix. The test bed runs the newest
# supported minor (versions.env, kube/, etcd/); `make test-matrix` runs a
# named subset on each older one, chosen with CSIOPS_K8S_MINOR=1.35. Such an
# entry is matrix/<minor>/: a versions.env whose K8S_VERSION and ETCD_VERSION
# replace the default ones, and the go.mod/go.sum of its kube/ and etcd/
# wrapper modules (written by `CSIOPS_K8S_MINOR=<minor> build.sh --sync`).
# Its kube/ may also hold a source file that replaces kube/'s for that
# release (an import path that moved, say). Needs HERE, VERSIONS_ENV, die.

MATRIX_MINOR="${CSIOPS_K8S_MINOR:-}"
MATRIX_DIR=""

# The entry's versions over the default ones; nothing without CSIOPS_K8S_MINOR.
matrix_select() {
  [[ -n "$MATRIX_MINOR" ]] || return 0
  MATRIX_DIR="$HERE/matrix/$MATRIX_MINOR"
  [[ -f "$MATRIX_DIR/versions.env" ]] ||
    die "CSIOPS_K8S_MINOR=$MATRIX_MINOR: no $MATRIX_DIR/versions.env (entries: $(ls "$HERE/matrix" | tr '\n' ' '))"
  # shellcheck source=/dev/null
  source "$MATRIX_DIR/versions.env"
}

# Where the kube module's go.mod and go.sum live.
kube_mod_file_dir() {
  if [[ -n "$MATRIX_MINOR" ]]; then echo "$MATRIX_DIR/kube"; else echo "$HERE/kube"; fi
}

# The etcd wrapper module (it has no sources of its own).
etcd_module_dir() {
  if [[ -n "$MATRIX_MINOR" ]]; then echo "$MATRIX_DIR/etcd"; else echo "$HERE/etcd"; fi
}

# The kube module to build in: kube/ itself, or, for an entry, a copy of
# kube/'s sources with the entry's kube/ laid over them, made afresh in the
# cache (a few small files) so that the checked-in tree is never written.
kube_module_dir() {
  if [[ -z "$MATRIX_MINOR" ]]; then
    echo "$HERE/kube"
    return
  fi
  local d="${CSIOPS_CACHE_DIR:-$HOME/.cache/csiops}/matrix-src/$MATRIX_MINOR/kube"
  rm -rf "$d"
  mkdir -p "$d"
  cp -R "$HERE/kube/." "$d/"
  rm -f "$d/go.mod" "$d/go.sum"
  if [[ -d "$MATRIX_DIR/kube" ]]; then cp -R "$MATRIX_DIR/kube/." "$d/"; fi
  echo "$d"
}

# After a sync in the assembled module $1: its go.mod/go.sum into the entry.
matrix_keep_modules() {
  [[ -n "$MATRIX_MINOR" ]] || return 0
  mkdir -p "$MATRIX_DIR/kube"
  cp "$1/go.mod" "$1/go.sum" "$MATRIX_DIR/kube/"
}

# The entry's replacement sources, for the cache key.
matrix_overlay_files() {
  [[ -n "$MATRIX_MINOR" && -d "$MATRIX_DIR/kube" ]] || return 0
  find "$MATRIX_DIR/kube" -name '*.go' -type f | sort | xargs -r cat
}

# versions.env as this build sees it (the entry's lines last: they win).
matrix_versions_env() {
  cat "$VERSIONS_ENV"
  if [[ -n "$MATRIX_MINOR" ]]; then
    printf '# matrix entry %s\n' "$MATRIX_MINOR"
    cat "$MATRIX_DIR/versions.env"
  fi
}
