// The pod sandbox's "pause" process for the suite's real node (see tools/k8s/build.sh): no registry
// is reachable here, so containerd gets it as a local image. Waits for SIGTERM/SIGINT.
module gpufn.local/tools/k8s/pause

go 1.26.0
