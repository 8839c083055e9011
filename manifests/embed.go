// Package manifests embeds the shipped scheduler configuration, the deploy
// manifests and the example pods, so that make run, the tests and gpu-sim use
// exactly the files that are deployed.
package manifests

import (
	"embed"
	"io/fs"
	"sort"
	"strings"
)

// SchedulerConfig is config/scheduler-config.yaml.
//
//go:embed config/scheduler-config.yaml
var SchedulerConfig []byte

//go:embed rbac.yaml
var RBAC []byte

// AdmissionPolicy keeps gpu-scheduler.io/assignment gpu-scheduler's to
// write, and gpu-scheduler to status and its annotation.
//
//go:embed admission-policy.yaml
var AdmissionPolicy []byte

//go:embed configmap.yaml
var ConfigMap []byte

//go:embed deployment.yaml
var Deployment []byte

//go:embed examples/*.yaml
var examples embed.FS

// Example is one example pod manifest.
type Example struct {
	Name string
	YAML []byte
}

// Examples returns the example pods, by file name.
func Examples() []Example {
	var out []Example
	entries, _ := fs.ReadDir(examples, "examples")
	for _, e := range entries {
		b, _ := examples.ReadFile("examples/" + e.Name())
		out = append(out, Example{Name: strings.TrimSuffix(e.Name(), ".yaml"), YAML: b})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ConfigMapName holds the scheduler configuration in kube-system.
const ConfigMapName = "gpu-scheduler-config"

// RenderConfigMap is configmap.yaml as generated from the configuration
// (make manifests writes it; a test checks it is current).
func RenderConfigMap() []byte {
	var b strings.Builder
	b.WriteString("# Generated from config/scheduler-config.yaml by `make manifests`. Do not edit.\n")
	b.WriteString("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + ConfigMapName + "\n  namespace: kube-system\ndata:\n  scheduler-config.yaml: |\n")
	for _, line := range strings.Split(strings.TrimRight(string(SchedulerConfig), "\n"), "\n") {
		if line == "" {
			b.WriteString("\n")
			continue
		}
		b.WriteString("    " + line + "\n")
	}
	return []byte(b.String())
}
