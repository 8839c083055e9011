// Command genmanifests writes manifests/configmap.yaml from the canonical
// scheduler configuration.
package main

import (
	"fmt"
	"os"

	"github.com/gpu-scheduler/gpu-scheduler/manifests"
)

func main() {
	if err := os.WriteFile("manifests/configmap.yaml", manifests.RenderConfigMap(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
