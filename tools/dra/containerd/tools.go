//go:build tools

// Package tools records the command this module builds, so `go mod tidy` keeps its dependencies:
// containerd 1.7, whose CRI plugin applies CDI devices (Debian's 1.6 does not), for the real node
// that runs a DRA driver.
package tools

import _ "github.com/containerd/containerd/cmd/containerd"
