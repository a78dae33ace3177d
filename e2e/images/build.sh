#!/usr/bin/env bash
# Build (or reuse from the cache) the csiops container images as OCI archives,
# without a container daemon: static musl binaries, `FROM scratch` Dockerfiles,
# `buildah --storage-driver vfs bud` with private storage.
#
#   DIR=$(e2e/images/build.sh)         # prints ONLY the output dir on stdout
#   e2e/images/build.sh --print-refs   # print refs.env (below), never build
#   e2e/images/build.sh --print-dir    # print the output dir, never build
#   e2e/images/build.sh --demo         # `make demo`'s images (below)
#
# The output dir, ${CSIOPS_CACHE_DIR:-$HOME/.cache/csiops}/images/<key>/, holds
# one OCI archive per image and refs.env:
#
#   archive               ref (refs.env key)
#   csiops-operator.tar   ghcr.io/csiops/csiops-operator:v<version>  OPERATOR_IMAGE
#   csiops-sidecar.tar    ghcr.io/csiops/csiops-sidecar:v<version>   SIDECAR_IMAGE
#   csi-test-driver.tar   ghcr.io/csiops/csi-test-driver:v<version>  TEST_DRIVER_IMAGE
#   pause.tar             $PAUSE_IMAGE of e2e/versions.env          PAUSE_IMAGE
#
# and sidecar-bin/, the two binaries of the sidecar image as they are in it
# (csiops-sidecar, and csiops-node-sidecar built with `--profile node`), and
# demo-bin/csiops-demo, `make demo`'s driver, built with the images' binaries.
#
# `--demo` builds the same images without csiops-node-sidecar, whose
# size-optimised build (fat LTO, one codegen unit, every dependency compiled
# a second time) is two and a half of a cold demo's minutes: in the demo's
# sidecar image, csiops-sidecar serves the node roles itself (same code and
# flags; it hands off only to a node binary beside it, sidecars/src/entry.rs),
# at more memory per node pod. Its dir is keyed apart (`v<version>-demo_…`);
# when the full dir of the same sources is there, `--demo` prints that one.
#
# <version> is the workspace version (Cargo.toml). The operator and sidecar
# refs are exactly the ones operator/src/install.rs (manifests/install.yaml)
# and the operator's --sidecar-image default (operator/src/cli.rs) name;
# operator/tests/images.rs checks that they agree. The pause image is our own
# (pause/pause.c), tagged `localhost/csiops/pause:<pause version>` and used as
# containerd's sandbox_image in the e2e test bed; its version is bumped by hand
# with pause.c.
#
# Each archive's index.json names its image with the full ref in
# `org.opencontainers.image.ref.name`, so `ctr -n k8s.io images import
# <archive>` creates exactly that image name (checked with containerd 1.6).
#
# The key hashes every input (sources, Cargo.lock, Dockerfiles, this script,
# pause.c, refs, toolchain versions, RECIPE); an unchanged key reuses the dir.
# Labels: org.opencontainers.image.{source,version,revision}; the revision is
# the last git commit touching those inputs (`-dirty` when they have
# uncommitted changes), so a docs-only commit does not rebuild the images.
#
# Environment:
#   CSIOPS_CACHE_DIR        cache root (default: $HOME/.cache/csiops); the musl
#                           cargo target dir is <cache>/images/cargo-target-<hash
#                           of the checkout's path>
#   CSIOPS_IMAGE_REGISTRY   registry/namespace of the csiops images
#                           (default: ghcr.io/csiops)
#   CSIOPS_IMAGE_TAG        their tag (default: v<version>)
#   CSIOPS_REBUILD=1        ignore an existing output dir and rebuild it
# Prerequisites (installed when missing, as root, with apt-get / rustup):
# cargo + rustup, the x86_64-unknown-linux-musl target, musl-tools, buildah.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VERSIONS_ENV="$ROOT/e2e/versions.env"

RECIPE=3 # bump when the build flags, the Dockerfile arguments or the layout change
TARGET=x86_64-unknown-linux-musl
MUSL_CC=x86_64-linux-musl-gcc
IMAGES=(csiops-operator csiops-sidecar csi-test-driver pause)

log() { printf '[images %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ -f "$VERSIONS_ENV" ]] || die "missing $VERSIONS_ENV"
# shellcheck source=/dev/null
source "$VERSIONS_ENV"
: "${PAUSE_IMAGE:?PAUSE_IMAGE not set in $VERSIONS_ENV}"

# The workspace version: `version = "..."` under [workspace.package].
VERSION="$(awk '/^\[/{s=($0=="[workspace.package]")} s && $1=="version" {gsub(/"/,"",$3); print $3; exit}' "$ROOT/Cargo.toml")"
[[ -n "$VERSION" ]] || die "no version under [workspace.package] in $ROOT/Cargo.toml"
REGISTRY="${CSIOPS_IMAGE_REGISTRY:-ghcr.io/csiops}"
TAG="${CSIOPS_IMAGE_TAG:-v$VERSION}"

# ref, Dockerfile and binary of each image.
ref_of() {
  case "$1" in
    csiops-operator) echo "$REGISTRY/csiops-operator:$TAG" ;;
    csiops-sidecar) echo "$REGISTRY/csiops-sidecar:$TAG" ;;
    csi-test-driver) echo "$REGISTRY/csi-test-driver:$TAG" ;;
    pause) echo "$PAUSE_IMAGE" ;;
    *) die "unknown image $1" ;;
  esac
}
env_key_of() {
  case "$1" in
    csiops-operator) echo OPERATOR_IMAGE ;;
    csiops-sidecar) echo SIDECAR_IMAGE ;;
    csi-test-driver) echo TEST_DRIVER_IMAGE ;;
    pause) echo PAUSE_IMAGE ;;
  esac
}
dockerfile_of() {
  case "$1" in
    csiops-operator) echo "$ROOT/operator/Dockerfile" ;;
    csiops-sidecar) echo "$ROOT/sidecars/Dockerfile" ;;
    csi-test-driver) echo "$ROOT/e2e/Dockerfile" ;;
    pause) echo "$HERE/pause/Dockerfile" ;;
  esac
}
print_refs() {
  local i
  for i in "${IMAGES[@]}"; do printf '%s=%s\n' "$(env_key_of "$i")" "$(ref_of "$i")"; done
}

# Every input of the images, relative to $ROOT.
INPUT_PATHS=(Cargo.toml Cargo.lock .dockerignore crds proto runtime operator/Cargo.toml operator/src
  operator/Dockerfile sidecars cli/Cargo.toml cli/src e2e/Cargo.toml e2e/src e2e/Dockerfile e2e/images)

input_files() {
  if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -C "$ROOT" ls-files --cached --others --exclude-standard -- "${INPUT_PATHS[@]}" |
      sort -u | while IFS= read -r f; do [[ -f "$ROOT/$f" ]] && printf '%s\n' "$f"; done
  else
    (cd "$ROOT" && find "${INPUT_PATHS[@]}" -type f ! -path '*/target/*' 2>/dev/null | sort)
  fi
}

# Commands the build needs; apt packages providing them.
ensure_prereqs() {
  command -v cargo >/dev/null 2>&1 || die "cargo is not on PATH (install Rust with rustup)"
  command -v rustup >/dev/null 2>&1 || die "rustup is not on PATH (needed for the $TARGET target)"
  local missing=() cmd pkg
  for cmd in "$MUSL_CC:musl-tools" "buildah:buildah" "git:git"; do
    command -v "${cmd%%:*}" >/dev/null 2>&1 || missing+=("${cmd#*:}")
  done
  if ((${#missing[@]})); then
    [[ "$(id -u)" == 0 ]] || die "missing ${missing[*]}; run: sudo apt-get install -y ${missing[*]}"
    command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get to install them"
    log "installing ${missing[*]} (apt-get)"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; } >&2 ||
      die "apt-get install ${missing[*]} failed"
    for pkg in "$MUSL_CC" buildah git; do
      command -v "$pkg" >/dev/null 2>&1 || die "$pkg still missing after apt-get install"
    done
  fi
  if ! rustup target list --installed | grep -qx "$TARGET"; then
    log "rustup target add $TARGET"
    rustup target add "$TARGET" >&2 || die "rustup target add $TARGET failed"
  fi
}

cache_key() {
  local h flavour=""
  [[ "$FLAVOUR" == demo ]] && flavour="-demo"
  h="$( {
    echo "recipe=$RECIPE flavour=$FLAVOUR"
    print_refs
    rustc -vV
    "$MUSL_CC" -dumpversion 2>/dev/null || echo "no $MUSL_CC"
    buildah --version 2>/dev/null || echo "no buildah"
    input_files | while IFS= read -r f; do
      printf '%s\n' "$f"
      sha256sum <"$ROOT/$f"
    done
  } | sha256sum | cut -c1-16)"
  printf 'v%s%s_%s' "$VERSION" "$flavour" "$h"
}

# Revision label and image creation time: the last commit touching the inputs.
revision() {
  local rev
  rev="$(git -C "$ROOT" log -1 --format=%H -- "${INPUT_PATHS[@]}" 2>/dev/null)" || rev=""
  [[ -n "$rev" ]] || { echo unknown; return; }
  if [[ -n "$(git -C "$ROOT" status --porcelain -- "${INPUT_PATHS[@]}" 2>/dev/null)" ]]; then
    rev="$rev-dirty"
  fi
  echo "$rev"
}
source_date() {
  git -C "$ROOT" log -1 --format=%ct -- "${INPUT_PATHS[@]}" 2>/dev/null || echo 0
}

# dir_ok DIR [FLAVOUR]: DIR holds the images of FLAVOUR (default: $FLAVOUR).
dir_ok() {
  local dir="$1" flavour="${2:-$FLAVOUR}" i
  [[ -f "$dir/.complete" && -s "$dir/refs.env" ]] || return 1
  for i in "${IMAGES[@]}"; do [[ -s "$dir/$i.tar" ]] || return 1; done
  [[ -x "$dir/sidecar-bin/csiops-sidecar" && -x "$dir/demo-bin/csiops-demo" ]] || return 1
  [[ "$flavour" == demo || -x "$dir/sidecar-bin/csiops-node-sidecar" ]]
}

# The archive's index must name the image with the full ref: `ctr images
# import` (containerd 1.6 checked) names the imported image after
# org.opencontainers.image.ref.name.
check_ref_name() {
  local archive="$1" ref="$2" names
  names="$(tar -xOf "$archive" index.json |
    grep -o '"org.opencontainers.image.ref.name":"[^"]*"' || true)"
  [[ "$names" == "\"org.opencontainers.image.ref.name\":\"$ref\"" ]] ||
    die "$archive: index.json names ${names:-nothing}, expected $ref"
}

build_into() {
  local out="$1" cache_root="$2"
  local revision created
  revision="$(revision)"
  created="$(source_date)"

  # --- static binaries -----------------------------------------------------
  # One target dir per checkout: cargo names a workspace's own crates by
  # their path inside the workspace, so two checkouts sharing a target dir
  # would take each other's fresh-looking artifacts into their images.
  local target_dir
  target_dir="$cache_root/cargo-target-$(printf '%s' "$ROOT" | sha256sum | cut -c1-12)"
  # `make demo`'s own binary is built here too: it shares every dependency
  # (kube, k8s-openapi, tokio…) with the images' binaries, so the demo needs
  # no second, debug build of them.
  log "cargo build --release --target $TARGET (operator, kubectl-csiops, sidecar, csi-test-driver, csiops-demo) into $target_dir"
  log "(cold: several minutes on two cores; warm: seconds)"
  (cd "$ROOT" && CARGO_TARGET_DIR="$target_dir" cargo build --release --locked --target "$TARGET" \
    -p csiops-operator --bin csiops-operator \
    -p kubectl-csiops --bin kubectl-csiops \
    -p csiops-sidecars --bin csiops-sidecar \
    -p csiops-e2e --bin csi-test-driver --bin csiops-demo) >&2 || die "cargo build failed"
  local bin_dir="$target_dir/$TARGET/release"
  # The node roles' binary, built for size and without position independence
  # (no relocations to apply at start, so the read-only data stays clean and
  # shared with the file, as upstream's Go binaries are): sidecars/src/entry.rs.
  local node_bin_dir="$target_dir/$TARGET/node"
  if [[ "$FLAVOUR" == full ]]; then
    log "cargo build --profile node --target $TARGET (csiops-node-sidecar)"
    (cd "$ROOT" && CARGO_TARGET_DIR="$target_dir" RUSTFLAGS="-C relocation-model=static" \
      cargo build --profile node --locked --target "$TARGET" \
      -p csiops-sidecars --bin csiops-node-sidecar) >&2 || die "cargo build (node) failed"
  else
    log "demo images: no csiops-node-sidecar (csiops-sidecar serves the node roles; \`make images\` builds it)"
  fi

  local pause_version="${PAUSE_IMAGE##*:}"
  mkdir -p "$WORK/ctx/pause"
  "$MUSL_CC" -static -Os -s -Wall -Wextra -Werror -DPAUSE_VERSION="\"$pause_version\"" \
    -o "$WORK/ctx/pause/pause" "$HERE/pause/pause.c" >&2 || die "compiling pause.c failed"

  # --- images ----------------------------------------------------------------
  local storage=(--storage-driver vfs --root "$WORK/storage" --runroot "$WORK/run")
  local i ref bin
  for i in "${IMAGES[@]}"; do
    ref="$(ref_of "$i")"
    if [[ "$i" != pause ]]; then
      mkdir -p "$WORK/ctx/$i"
      cp "$bin_dir/$i" "$WORK/ctx/$i/$i"
      if [[ "$i" == csiops-sidecar && "$FLAVOUR" == full ]]; then
        cp "$node_bin_dir/csiops-node-sidecar" "$WORK/ctx/$i/"
      fi
      # The kubectl plugin ships in the operator image (/usr/local/bin), so
      # `kubectl cp` or `docker create`+`cp` gets a user the version that
      # matches the operator (docs/kubectl-plugin.md).
      if [[ "$i" == csiops-operator ]]; then
        cp "$bin_dir/kubectl-csiops" "$WORK/ctx/$i/"
      fi
      for bin in "$WORK/ctx/$i"/*; do
        # The images have no debug use for symbols; keep them small.
        strip "$bin"
      done
      # One time for the binaries of an image: csiops-sidecar hands off only
      # to a node binary not older than itself (sidecars/src/entry.rs).
      touch -r "$WORK/ctx/$i/$i" "$WORK/ctx/$i"/*
    fi
    local version="$VERSION"
    [[ "$i" == pause ]] && version="$pause_version"
    local dockerfile
    dockerfile="$(dockerfile_of "$i")"
    if [[ "$i" == csiops-sidecar && "$FLAVOUR" == demo ]]; then
      # The product's Dockerfile without the node binary's COPY.
      grep -v '^COPY .*/csiops-node-sidecar ' "$dockerfile" >"$WORK/Dockerfile.$i"
      (($(wc -l <"$dockerfile") - $(wc -l <"$WORK/Dockerfile.$i") == 1)) ||
        die "$dockerfile: expected one COPY of csiops-node-sidecar to leave out"
      dockerfile="$WORK/Dockerfile.$i"
    fi
    log "buildah bud $ref"
    buildah "${storage[@]}" bud --quiet --format oci --timestamp "$created" \
      --build-arg BIN_DIR=. --build-arg NODE_BIN_DIR=. --build-arg VERSION="$version" --build-arg REVISION="$revision" \
      -f "$dockerfile" -t "$ref" "$WORK/ctx/$i" >&2 || die "buildah bud $ref failed"
    buildah "${storage[@]}" push --quiet "$ref" "oci-archive:$out/$i.tar:$ref" >&2 ||
      die "buildah push $ref failed"
    check_ref_name "$out/$i.tar" "$ref"
  done
  buildah "${storage[@]}" rmi --all >/dev/null 2>&1 || true
  # The sidecar image's binaries as they are in it, for the node-memory
  # bench (e2e/bench/README.md) and the e2e that runs them outside a pod.
  mkdir -p "$out/sidecar-bin"
  cp "$WORK/ctx/csiops-sidecar/"* "$out/sidecar-bin/"
  # `make demo` runs this on the host (e2e/demo.sh).
  mkdir -p "$out/demo-bin"
  cp "$bin_dir/csiops-demo" "$out/demo-bin/"
  strip "$out/demo-bin/csiops-demo"

  print_refs >"$out/refs.env"
  touch "$out/.complete"
}

FLAVOUR=full

main() {
  local mode=build arg
  for arg in "$@"; do
    case "$arg" in
      --print-refs) print_refs; return ;;
      --print-dir) mode=print ;;
      --demo) FLAVOUR=demo ;;
      -h | --help) sed -n '2,/^set -euo/{/^set/!p}' "$0" >&2; return ;;
      *) die "unknown argument: $arg (see --help)" ;;
    esac
  done

  local cache_root="${CSIOPS_CACHE_DIR:-$HOME/.cache/csiops}/images"
  if [[ "$mode" == build ]]; then ensure_prereqs; fi
  local key; key="$(cache_key)"
  local dir="$cache_root/$key"
  # The full images of the same sources serve the demo too.
  local full_dir=""
  if [[ "$FLAVOUR" == demo ]]; then full_dir="$cache_root/$(FLAVOUR=full cache_key)"; fi
  if [[ "$mode" == print ]]; then echo "$dir"; return; fi

  if [[ "${CSIOPS_REBUILD:-0}" != 1 ]]; then
    if [[ -n "$full_dir" ]] && dir_ok "$full_dir" full; then echo "$full_dir"; return; fi
    if dir_ok "$dir"; then echo "$dir"; return; fi
  fi

  mkdir -p "$cache_root"
  # One builder at a time (they share the cargo target dir).
  exec 9>"$cache_root/.lock"
  command -v flock >/dev/null 2>&1 || die "flock (util-linux) is not on PATH"
  flock 9
  if [[ "${CSIOPS_REBUILD:-0}" != 1 ]] && dir_ok "$dir"; then
    echo "$dir"
    return
  fi

  log "building images into $dir"
  WORK="$(mktemp -d "$cache_root/work.XXXXXX")"
  trap 'rm -rf "$WORK"' EXIT
  local tmp_out="$WORK/out"
  mkdir -p "$tmp_out"
  local start=$SECONDS
  build_into "$tmp_out" "$cache_root"
  rm -rf "$dir"
  mv "$tmp_out" "$dir"
  log "done in $((SECONDS - start))s: $(cd "$dir" && du -h ./*.tar | tr '\t\n' ' ')"
  echo "$dir"
}

main "$@"
