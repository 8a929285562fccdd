#!/usr/bin/env bash
# Builds the test control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager,
# kwok), a kubelet and the pod sandbox's pause process for the optional real node, and the S3-compatible
# object store (SeaweedFS `weed`) and Kueue (with its CRDs and webhook configuration, from the same module)
# from the Go modules pinned beside this script, into a cache directory keyed by those pins.
# A warm cache makes this a no-op. Prints the directory holding the binaries on its last line.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
kube_version="$(sed -n 's/^require k8s.io\/kubernetes v\(.*\)$/\1/p' "$here/kube/go.mod")"
key="$(cat "$here"/*/go.mod "$here"/*/go.sum "$0" | sha256sum | cut -c1-12)"
out="${GPUFN_K8S_CACHE:-$HOME/.cache/gpufn-k8s}/$kube_version-$key"
bins=(etcd kube-apiserver kube-scheduler kube-controller-manager kubelet kwok weed pause kueue)
missing=0
for b in "${bins[@]}"; do [ -x "$out/$b" ] || missing=1; done
if [ "$missing" = 1 ]; then
  mkdir -p "$out.tmp"
  export CGO_ENABLED=0
  minor="${kube_version#*.}"; minor="${minor%%.*}"
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$kube_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  start=$SECONDS
  echo "building etcd, kwok, SeaweedFS, Kueue and Kubernetes v$kube_version control plane into $out (cold: ~15 min on 2 cores)" >&2
  (cd "$here/etcd" && go build -ldflags "-s -w" -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3)
  (cd "$here/kwok" && go build -ldflags "-s -w" -o "$out.tmp/kwok" sigs.k8s.io/kwok/cmd/kwok)
  (cd "$here/seaweedfs" && go build -ldflags "-s -w" -o "$out.tmp/weed" github.com/seaweedfs/seaweedfs/weed)
  (cd "$here/kube" && go build -ldflags "$ldflags" -o "$out.tmp/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kubelet)
  (cd "$here/pause" && go build -ldflags "-s -w" -o "$out.tmp/pause" .)
  (cd "$here/kueue" && go build -ldflags "-s -w" -o "$out.tmp/kueue" sigs.k8s.io/kueue/cmd/kueue \
      && kueue_dir="$(go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)" && mkdir -p "$out.tmp/kueue-config" \
      && cp -r "$kueue_dir"/config/components/crd "$kueue_dir"/config/components/webhook "$out.tmp/kueue-config/" \
      && chmod -R u+w "$out.tmp/kueue-config")
  rm -rf "$out" && mv "$out.tmp" "$out"
  echo "built in $((SECONDS - start)) s" >&2
fi
echo "$out"
