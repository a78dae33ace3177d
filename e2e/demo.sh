#!/usr/bin/env bash
# `make demo`: build (or reuse) what the demo needs, one phase at a time with
# its elapsed time, then run it. Only what the demo runs is built: the test
# bed's Go binaries without external-snapshotter (`build.sh --core`) and the
# images, whose cargo build also makes the demo's own binary
# (e2e/images/build.sh), so nothing is compiled twice and no debug build of
# the workspace is needed. The images are the `--demo` ones: the sidecar
# image without the size-optimised node binary, whose second compile of
# every dependency is not worth two and a half minutes of a demo on one
# node (csiops-sidecar serves the node roles itself; e2e/images/build.sh).
# The phases run one after the other: each keeps both cores busy, and run
# side by side (tried 2026-11-28) they took 15.5 minutes cold against 15.0
# one after the other.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
START=$SECONDS

phase() { # phase NAME COMMAND... : runs COMMAND, prints how long it took
  local name="$1" t=$SECONDS
  shift
  printf '[demo %s] %s…\n' "$(elapsed $((SECONDS - START)))" "$name" >&2
  "$@"
  printf '[demo %s] %s: done in %s\n' "$(elapsed $((SECONDS - START)))" "$name" "$(elapsed $((SECONDS - t)))" >&2
}
elapsed() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

bins() { BIN_DIR="$("$HERE/cluster-bins/build.sh" --core)"; }
images() { IMAGES_DIR="$("$HERE/images/build.sh" --demo)"; }

phase "control plane, kubelet and kwok (cached by version in ~/.cache/csiops/bins)" bins
phase "images and the demo binary (cached by source hash in ~/.cache/csiops/images)" images
printf '[demo %s] set-up done; starting the demo\n\n' "$(elapsed $((SECONDS - START)))" >&2

# The kwok nodes' registrars run on the host: the sidecar image's own binary.
export CSIOPS_BIN_DIR="$BIN_DIR" CSIOPS_IMAGES_DIR="$IMAGES_DIR" \
  CSIOPS_SIDECAR_BIN="$IMAGES_DIR/sidecar-bin/csiops-sidecar"
exec "$IMAGES_DIR/demo-bin/csiops-demo" "$@"
