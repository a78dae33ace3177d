#!/usr/bin/env bash
# Builds Helm (helm.sh/helm/v3, through the Go module proxy) at the version
# pinned in e2e/versions.env into the cache, once (a few minutes); prints its
# path. The chart tests (`e2e/tests/helm.rs`) run `helm lint`, `helm
# template` and install/upgrade/uninstall with it.
exec "$(dirname "${BASH_SOURCE[0]}")/go-install.sh" helm HELM_VERSION helm.sh/helm/v3/cmd/helm
