"""The development and test Kubernetes control plane: not part of the runtime package.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK built from the Go modules
pinned in `tools/k8s/` of a checkout, run as plain processes with fake GPU node pools made from
the GPU classes. The test suite starts one per session; `gpufn-devcluster` starts one by hand.
A distribution of its own (`devcluster/pyproject.toml`, `pip install -e ./devcluster`, which the
README's set-up does), so the runtime wheel ships none of it; it needs a checkout (or
`$GPUFN_K8S_BIN`) for the binaries.
"""
