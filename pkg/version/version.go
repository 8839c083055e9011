// Package version is gpu-scheduler's own version. The upstream component
// version (k8s.io/component-base/version) must stay at the Kubernetes release
// we build on, v1.37.2, or the startup emulation-version check rejects it.
package version

// Version is stamped at build time with -ldflags -X.
var Version = "dev"
