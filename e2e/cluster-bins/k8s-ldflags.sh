# Sourced by build.sh and e2e-suite.sh: the version ldflags of a Kubernetes
# binary, the ones upstream's hack/lib/version.sh sets, on both
# k8s.io/component-base/version and k8s.io/client-go/pkg/version, plus -s -w.
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
