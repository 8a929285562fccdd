"""The development and test Kubernetes control plane: not part of the runtime package.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK built from the Go modules
pinned in `tools/k8s/` of a checkout, run as plain processes with fake GPU node pools made from
the GPU classes. The test suite starts one per session; `gpufn devcluster` starts one by hand.
It needs the `devcluster` extra (`pip install -e '.[devcluster]'`, part of `.[test]`) for its
certificates, and a checkout (or `$GPUFN_K8S_BIN`) for the binaries.
"""
