#!/usr/bin/env bash
# Builds upstream's csi-sanity (github.com/kubernetes-csi/csi-test) at the
# version pinned in e2e/versions.env into the cache, once (~1 min); prints its path.
exec "$(dirname "${BASH_SOURCE[0]}")/go-install.sh" csi-sanity CSI_SANITY_VERSION \
  github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity
