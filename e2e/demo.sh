#!/usr/bin/env bash
# `make demo`: build (or reuse) what the demo needs, both phases at once,
# each with its elapsed time, then run it. Only what the demo runs is
# built: the test bed's Go binaries without external-snapshotter
# (`build.sh --core`) and the images, whose cargo build also makes the
# demo's own binary (e2e/images/build.sh), so nothing is compiled twice and
# no debug build of the workspace is needed.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
START=$SECONDS
elapsed() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
say() { printf '[demo %s] %s\n' "$(elapsed $((SECONDS - START)))" "$*" >&2; }

# The two set-up phases run side by side: each is mostly compiling on every
# core, but each has stretches on one core (Go's links, rustc's single-crate
# front ends and the node binary's whole-program optimisation) that the
# other fills. Each prints its own progress; its output dir goes to a file.
OUT="$(mktemp -d)"
phase() { # phase KEY NAME COMMAND... : COMMAND in the background, its stdout to $OUT/KEY
  local key="$1" name="$2"
  shift 2
  say "$name…"
  (
    t=$SECONDS
    "$@" >"$OUT/$key"
    say "$name: done in $(elapsed $((SECONDS - t)))"
  ) &
}
fail() { say "$1 failed"; kill $(jobs -p) 2>/dev/null || true; rm -rf "$OUT"; exit 1; }
phase bins "control plane, kubelet and kwok (cached by version in ~/.cache/csiops/bins)" \
  "$HERE/cluster-bins/build.sh" --core
bins=$!
phase images "images and the demo binary (cached by source hash in ~/.cache/csiops/images)" \
  "$HERE/images/build.sh"
images=$!
wait "$bins" || fail "building the control plane"
wait "$images" || fail "building the images"
BIN_DIR="$(cat "$OUT/bins")"
IMAGES_DIR="$(cat "$OUT/images")"
rm -rf "$OUT"
say "set-up done; starting the demo"
printf '\n' >&2

# The kwok nodes' registrars run on the host: the sidecar image's own binary.
export CSIOPS_BIN_DIR="$BIN_DIR" CSIOPS_IMAGES_DIR="$IMAGES_DIR" \
  CSIOPS_SIDECAR_BIN="$IMAGES_DIR/sidecar-bin/csiops-sidecar"
exec "$IMAGES_DIR/demo-bin/csiops-demo" "$@"
