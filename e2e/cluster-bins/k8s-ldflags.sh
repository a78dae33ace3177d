# Sourced by build.sh and e2e-suite.sh: the compile flags both build with,
# and the version ldflags of a Kubernetes binary, the ones upstream's
# hack/lib/version.sh sets, on both k8s.io/component-base/version and
# k8s.io/client-go/pkg/version, plus -s -w.
#
# One set of compile flags for both scripts: with identical flags, e2e.test
# reuses the packages compiled for the control plane from GOCACHE. No DWARF
# from the compiler: -s -w drops it at link time anyway, and not generating
# it takes a tenth off a cold build (kube-scheduler alone: 215 → 194
# CPU-seconds).
GO_COMPILE_FLAGS=(-trimpath -gcflags=all=-dwarf=false)

#
#   go build -ldflags="$(k8s_version_ldflags WRAPPER_DIR K8S_VERSION)" ...
#
# buildDate is the release's publish time from the module proxy (reproducible
# builds); gitCommit is empty (the module zip does not record it).
k8s_version_ldflags() {
  local wrapper="$1" version="$2"
  local minor="${version#v1.}"; minor="${minor%%.*}"
  local build_date
  build_date="$(cd "$wrapper" && go list -m -json k8s.io/kubernetes |
    sed -n 's/^[[:space:]]*"Time": "\(.*\)",$/\1/p')"
  [[ -n "$build_date" ]] || build_date="1970-01-01T00:00:00Z"
  local flags=(-s -w) pkg key val
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    for key in gitVersion gitMajor gitMinor gitCommit gitTreeState buildDate; do
      case "$key" in
        gitVersion) val="$version" ;;
        gitMajor) val=1 ;;
        gitMinor) val="$minor" ;;
        gitCommit) val="" ;;
        gitTreeState) val="clean" ;;
        buildDate) val="$build_date" ;;
      esac
      flags+=("-X" "$pkg.$key=$val")
    done
  done
  echo "${flags[*]}"
}
