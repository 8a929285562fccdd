#!/usr/bin/env bash
# Builds what the suite's real node needs to run a DRA driver: containerd 1.7 (its CRI plugin applies
# the CDI devices a DRA driver prepares; Debian's containerd 1.6 has no CDI) and the suite's DRA driver,
# draplugin (its kubelet plugin: fake GPUs published in a ResourceSlice, each claim's devices given to
# the container through CDI), from the Go modules pinned beside this script, into a cache directory
# keyed by those pins -- apart from tools/k8s's, so the control plane's cache stays warm when these
# change. A warm cache makes this a no-op. Prints the directory holding the binaries on its last line.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
key="$(cat "$here"/*/go.mod "$here"/*/go.sum "$here"/draplugin/*.go "$0" | sha256sum | cut -c1-12)"
out="${GPUFN_K8S_CACHE:-$HOME/.cache/gpufn-k8s}/dra-$key"
if [ ! -x "$out/containerd" ] || [ ! -x "$out/draplugin" ]; then
  mkdir -p "$out.tmp"
  export CGO_ENABLED=0
  start=$SECONDS
  echo "building containerd 1.7 and the suite's DRA driver into $out (cold: ~3 min on 2 cores)" >&2
  (cd "$here/containerd" && go build -tags "no_btrfs no_devmapper no_zfs no_aufs" -ldflags "-s -w" \
      -o "$out.tmp/containerd" github.com/containerd/containerd/cmd/containerd)
  (cd "$here/draplugin" && go build -ldflags "-s -w" -o "$out.tmp/draplugin" .)
  rm -rf "$out" && mv "$out.tmp" "$out"
  echo "built in $((SECONDS - start)) s" >&2
fi
echo "$out"
