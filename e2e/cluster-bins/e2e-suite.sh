#!/usr/bin/env bash
# Build (or reuse from the cache) Kubernetes' storage e2e suite at the pinned
# K8S_VERSION, for `make conformance` and the bounded subset `make test` runs
# (e2e/tests/conformance.rs). Prints ONLY the output dir on stdout:
#
#   e2e.test          Kubernetes' e2e.test with the External Storage suite
#                     (`go test -c` of kube/e2e-storage, see its e2e_test.go)
#   ginkgo            the Ginkgo v2 CLI at the version k8s.io/kubernetes requires
#   agnhost           test/images/agnhost at K8S_VERSION (in the agnhost image)
#   images/<name>.tar OCI archives of the images the suite's pods run, named
#                     $SUITE_REGISTRY/<name>:<upstream tag>, and of upstream's
#                     csi-snapshotter at EXTERNAL_SNAPSHOTTER_VERSION (the
#                     snapshotter helper the conformance drivers' controller
#                     runs); images.env lists them
#   repo-list.yaml    KUBE_TEST_REPO_LIST for e2e.test: the suite's image
#                     registry is $SUITE_REGISTRY, so nothing is ever pulled
#   capabilities.txt  the capability names the suite knows (the Capability
#                     constants of test/e2e/storage/framework/testdriver.go),
#                     to check driver definitions against: unknown keys are
#                     silently ignored by e2e.test
#
#   DIR=$(e2e/cluster-bins/e2e-suite.sh)
#   e2e/cluster-bins/e2e-suite.sh --print-dir   # never build
#
# The images. There is no container registry here, so the suite's images are
# built locally, FROM scratch, with buildah (as e2e/images/build.sh does):
#   busybox:1.37.0-2    Debian's static busybox (busybox-static), one symlink
#                       per applet: the suite's default test image
#   agnhost:2.66.1      upstream's agnhost binary built above, with the same
#                       busybox (HostExec pods run `nsenter … sh -c` in it)
#   nginx:1.27.0-2      the storage suites run it only as a shell (`sh -c`
#                       scripts), so it is the busybox image under that name
#   glibc-dns-testing:2.1.1
#                       (jessie-dnsutils before Kubernetes 1.37)
#                       the busybox image with Debian's dash as /bin/sh and
#                       GNU coreutils' dd (and their shared libraries): the
#                       suites run it as a shell that writes with
#                       `dd oflag=nocache`, which busybox's dd lacks, and
#                       busybox's sh would run its own dd whatever the PATH
#                       (upstream's image is Debian's)
#   csi-snapshotter:<EXTERNAL_SNAPSHOTTER_VERSION>
#                       the static binary from the snapshotter/ wrapper module
#                       (the one build.sh builds), alone
# The tags are the ones test/utils/image/manifest.go of K8S_VERSION names
# (checked below against the module), so e2e.test finds them by name.
#
# Environment: CSIOPS_CACHE_DIR (default $HOME/.cache/csiops), CSIOPS_REBUILD=1.
# Prerequisites installed when missing (root, apt-get): buildah, busybox-static.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VERSIONS_ENV="$(dirname "$HERE")/versions.env"
RECIPE=5 # bump when the build flags, the image recipes or the layout change
SUITE_REGISTRY=localhost/csiops-e2e

log() { printf '[e2e-suite %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# shellcheck source=/dev/null
source "$VERSIONS_ENV"
# shellcheck source=matrix.sh
source "$HERE/matrix.sh"
matrix_select # CSIOPS_K8S_MINOR: the suite of that minor, with its image tags
: "${K8S_VERSION:?K8S_VERSION not set in versions.env}"
: "${SUITE_IMAGES:?SUITE_IMAGES not set in versions.env}"
# name:tag:ImageID of each image (versions.env lists them comma-separated):
# the tag test/utils/image/manifest.go of K8S_VERSION gives that ImageID.
IFS=, read -r -a SUITE_IMAGES <<<"$SUITE_IMAGES"
: "${EXTERNAL_SNAPSHOTTER_VERSION:?EXTERNAL_SNAPSHOTTER_VERSION not set in versions.env}"
# shellcheck source=k8s-ldflags.sh
source "$HERE/k8s-ldflags.sh"
command -v go >/dev/null 2>&1 || die "go is not on PATH"
export GOTOOLCHAIN=local
export GOFLAGS="-mod=readonly -buildvcs=false"

ensure_prereqs() {
  local missing=()
  command -v buildah >/dev/null 2>&1 || missing+=(buildah)
  [[ -x /bin/busybox ]] && /bin/busybox --list 2>/dev/null | grep -qx nsenter || missing+=(busybox-static)
  ((${#missing[@]})) || return 0
  [[ "$(id -u)" == 0 ]] || die "missing ${missing[*]}; run: sudo apt-get install -y ${missing[*]}"
  log "installing ${missing[*]} (apt-get)"
  { apt-get -o DPkg::Lock::Timeout=600 update -q && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}"; } >&2 ||
    die "apt-get install ${missing[*]} failed"
}

busybox_version() {
  dpkg-query -W -f '${Version}' busybox-static 2>/dev/null || /bin/busybox 2>&1 | head -1
  dpkg-query -W -f ' ${Package} ${Version}' coreutils dash 2>/dev/null || dd --version | head -1
}

# Debian's dash as /bin/sh and GNU dd, with the shared libraries they load,
# into the rootfs $1.
add_debian_sh_and_dd() {
  local rootfs="$1" name bin lib
  for name in sh:dash dd:dd; do
    bin="$(command -v "${name#*:}")" || die "no ${name#*:} on this machine"
    rm -f "$rootfs/bin/${name%%:*}"
    cp -L "$bin" "$rootfs/bin/${name%%:*}"
    for lib in $(ldd "$bin" | grep -o '/[^ )]*'); do cp --parents -L "$lib" "$rootfs/"; done
  done
  # They must run with only what the image has, and the shell must find
  # GNU dd, not busybox's.
  chroot "$rootfs" /bin/sh -c 'dd --version' | grep -q coreutils ||
    die "dash and GNU dd do not run in $rootfs"
}

cache_key() {
  local gover h
  gover="$(go env GOVERSION)"
  h="$( {
    echo "recipe=$RECIPE registry=$SUITE_REGISTRY ${SUITE_IMAGES[*]}"
    cat "$(kube_mod_file_dir)"/go.{mod,sum} "$HERE"/snapshotter/go.{mod,sum} "$HERE"/kube/e2e-storage/*.go "$HERE/k8s-ldflags.sh"
    matrix_overlay_files
    busybox_version
    buildah --version 2>/dev/null || echo "no buildah"
  } | sha256sum | cut -c1-12)"
  printf 'k8s-%s_snap-%s_%s_%s' "$K8S_VERSION" "$EXTERNAL_SNAPSHOTTER_VERSION" "$gover" "$h"
}

dir_ok() {
  local dir="$1" i
  [[ -f "$dir/.complete" && -s "$dir/repo-list.yaml" && -s "$dir/images.env" && -s "$dir/capabilities.txt" ]] || return 1
  for i in e2e.test ginkgo agnhost; do [[ -x "$dir/$i" ]] || return 1; done
  for i in "${SUITE_IMAGES[@]}" csi-snapshotter; do [[ -s "$dir/images/${i%%:*}.tar" ]] || return 1; done
  [[ "$("$dir/e2e.test" --version 2>/dev/null)" == "$K8S_VERSION" ]]
}

# The tag manifest.go of K8S_VERSION gives each image must be ours.
check_tags() {
  local manifest i name tag id
  manifest="$(cd "$KUBE_DIR" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/utils/image/manifest.go"
  for i in "${SUITE_IMAGES[@]}"; do
    IFS=: read -r name tag id <<<"$i"
    grep -Eq "configs\[$id\] = Config\{list\.PromoterE2eRegistry, \"$name\", \"$tag\"\}" "$manifest" ||
      die "$manifest does not name $name:$tag (ImageID $id): update SUITE_IMAGES in the versions.env of $K8S_VERSION"
  done
}

build_binaries() (
  local out="$1" kld ginkgo_version
  kld="$(k8s_version_ldflags "$KUBE_DIR" "$K8S_VERSION")"
  cd "$KUBE_DIR"
  go mod download >&2
  log "go test -c e2e.test (External Storage) $K8S_VERSION"
  CGO_ENABLED=0 go test -c "${GO_COMPILE_FLAGS[@]}" -ldflags="$kld" -o "$out/e2e.test" ./e2e-storage >&2
  ginkgo_version="$(go list -m -f '{{.Version}}' github.com/onsi/ginkgo/v2)"
  log "go build ginkgo $ginkgo_version, agnhost $K8S_VERSION"
  CGO_ENABLED=0 go build "${GO_COMPILE_FLAGS[@]}" -ldflags="-s -w" -o "$out/ginkgo" github.com/onsi/ginkgo/v2/ginkgo >&2
  local k8s_dir
  k8s_dir="$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
  sed -n 's/^[[:space:]]*Cap[A-Za-z]*[[:space:]]*Capability = "\([^"]*\)".*/\1/p' \
    "$k8s_dir/test/e2e/storage/framework/testdriver.go" >"$out/capabilities.txt"
  [[ -s "$out/capabilities.txt" ]] || die "no Capability constants found in $k8s_dir/test/e2e/storage/framework/testdriver.go"
  local agnhost_version
  agnhost_version="$(cat "$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/images/agnhost/VERSION")"
  CGO_ENABLED=0 go build "${GO_COMPILE_FLAGS[@]}" -ldflags="-s -w -X main.Version=$agnhost_version" \
    -o "$out/agnhost" k8s.io/kubernetes/test/images/agnhost >&2
  log "go build csi-snapshotter $EXTERNAL_SNAPSHOTTER_VERSION"
  cd "$HERE/snapshotter"
  go mod download >&2
  CGO_ENABLED=0 go build "${GO_COMPILE_FLAGS[@]}" -ldflags="-s -w -X main.version=$EXTERNAL_SNAPSHOTTER_VERSION" \
    -o "$out/csi-snapshotter" github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter >&2
)

build_images() {
  local out="$1" work="$2"
  local storage=(--storage-driver vfs --root "$work/storage" --runroot "$work/run")
  local ctx="$work/ctx" name tag id ref applet
  mkdir -p "$ctx/rootfs/bin" "$ctx/rootfs/tmp" "$out/images"
  chmod 1777 "$ctx/rootfs/tmp"
  cp /bin/busybox "$ctx/rootfs/bin/busybox"
  for applet in $(/bin/busybox --list); do
    [[ "$applet" == busybox ]] || ln -s busybox "$ctx/rootfs/bin/$applet"
  done
  printf 'FROM scratch\nCOPY rootfs/ /\nENV PATH=/bin\nCMD ["sh"]\n' >"$ctx/Dockerfile"
  cp -a "$ctx" "$work/agnhost-ctx"
  cp -a "$ctx" "$work/dnsutils-ctx"
  add_debian_sh_and_dd "$work/dnsutils-ctx/rootfs"
  cp "$out/agnhost" "$work/agnhost-ctx/rootfs/agnhost"
  ln -s agnhost "$work/agnhost-ctx/rootfs/agnhost-2"
  printf 'FROM scratch\nCOPY rootfs/ /\nENV PATH=/bin\nENTRYPOINT ["/agnhost"]\nCMD ["pause"]\n' \
    >"$work/agnhost-ctx/Dockerfile"
  : >"$out/images.env"
  for i in "${SUITE_IMAGES[@]}"; do
    IFS=: read -r name tag id <<<"$i"
    ref="$SUITE_REGISTRY/$name:$tag"
    local dir="$ctx"
    [[ "$name" == agnhost ]] && dir="$work/agnhost-ctx"
    [[ "$name" == glibc-dns-testing || "$name" == jessie-dnsutils ]] && dir="$work/dnsutils-ctx"
    log "buildah bud $ref"
    buildah "${storage[@]}" bud --quiet --format oci --timestamp 0 -t "$ref" "$dir" >&2 ||
      die "buildah bud $ref failed"
    buildah "${storage[@]}" push --quiet "$ref" "oci-archive:$out/images/$name.tar:$ref" >&2 ||
      die "buildah push $ref failed"
    printf '%s=%s\n' "$name" "$ref" >>"$out/images.env"
  done
  ref="$SUITE_REGISTRY/csi-snapshotter:$EXTERNAL_SNAPSHOTTER_VERSION"
  mkdir -p "$work/snap-ctx"
  cp "$out/csi-snapshotter" "$work/snap-ctx/csi-snapshotter"
  printf 'FROM scratch\nCOPY csi-snapshotter /csi-snapshotter\nENTRYPOINT ["/csi-snapshotter"]\n' >"$work/snap-ctx/Dockerfile"
  log "buildah bud $ref"
  buildah "${storage[@]}" bud --quiet --format oci --timestamp 0 -t "$ref" "$work/snap-ctx" >&2 ||
    die "buildah bud $ref failed"
  buildah "${storage[@]}" push --quiet "$ref" "oci-archive:$out/images/csi-snapshotter.tar:$ref" >&2 ||
    die "buildah push $ref failed"
  printf 'csi-snapshotter=%s\n' "$ref" >>"$out/images.env"
  rm "$out/csi-snapshotter"
  buildah "${storage[@]}" rmi --all >/dev/null 2>&1 || true
  printf 'promoterE2eRegistry: %s\n' "$SUITE_REGISTRY" >"$out/repo-list.yaml"
}

main() {
  local mode=build
  case "${1:-}" in
    --print-dir) mode=print ;;
    -h | --help) sed -n '2,33p' "$0" >&2; return ;;
    "") ;;
    *) die "unknown argument: $1" ;;
  esac
  [[ "$mode" == print ]] || ensure_prereqs
  local root="${CSIOPS_CACHE_DIR:-$HOME/.cache/csiops}/e2e-suite"
  local key dir
  key="$(cache_key)"
  dir="$root/$key"
  if [[ "$mode" == print ]]; then echo "$dir"; return; fi
  if [[ "${CSIOPS_REBUILD:-0}" != 1 ]] && dir_ok "$dir"; then echo "$dir"; return; fi

  mkdir -p "$root"
  exec 9>"$root/.$key.lock"
  flock 9
  if [[ "${CSIOPS_REBUILD:-0}" != 1 ]] && dir_ok "$dir"; then echo "$dir"; return; fi
  # The kube module to build in: kube/, or for an older minor kube/'s
  # sources with its matrix entry laid over them (see matrix.sh).
  KUBE_DIR="$(kube_module_dir)"
  check_tags
  local work
  work="$(mktemp -d "$root/.tmp.$key.XXXXXX")"
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" EXIT
  local start=$SECONDS
  log "building the storage e2e suite $K8S_VERSION into $dir (cold: the slowest Go build of the test bed)"
  mkdir -p "$work/out"
  build_binaries "$work/out"
  build_images "$work/out" "$work"
  touch "$work/out/.complete"
  dir_ok "$work/out" || die "the fresh build in $work/out failed its checks"
  rm -rf "$dir"
  mv -T "$work/out" "$dir"
  log "done in $((SECONDS - start))s: $dir"
  echo "$dir"
}

main "$@"
