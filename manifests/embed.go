// Package manifests embeds the shipped scheduler configuration and the
// example pods, so that the binary's tools and the tests use exactly the files
// that are deployed.
package manifests

import _ "embed"

// SchedulerConfig is scheduler-config.yaml.
//
//go:embed scheduler-config.yaml
var SchedulerConfig []byte
