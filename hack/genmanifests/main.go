// Command genmanifests writes the files made from the canonical ones:
// manifests/configmap.yaml from the scheduler configuration, and the Helm
// chart's files/ (the configuration, RBAC, the admission policy, the
// dashboard and the alerts), which its templates read. manifests/
// deployment.yaml is rendered from the chart (make manifests runs helm).
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpu-scheduler/gpu-scheduler/manifests"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run() error {
	if err := os.WriteFile("manifests/configmap.yaml", manifests.RenderConfigMap(), 0o644); err != nil {
		return err
	}
	for name, data := range manifests.ChartFiles() {
		if err := os.WriteFile(filepath.Join("manifests/charts/gpu-scheduler/files", name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}
