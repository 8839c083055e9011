// Command gpu-workload stands in for a GPU job on kind: it prints the
// environment its device plugin gave it (the devices, and HAMi-core's
// limits) between two marker lines, then sleeps until it is stopped, holding
// its devices as a running job does. The e2e suite reads the lines from the
// container's log and checks them against the scheduler's assignment.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// The markers around the environment in the log.
const (
	Begin = "--- gpu-workload env ---"
	End   = "--- gpu-workload end ---"
)

func main() {
	env := os.Environ()
	sort.Strings(env)
	fmt.Println(Begin)
	for _, kv := range env {
		if strings.HasPrefix(kv, "NVIDIA_") || strings.HasPrefix(kv, "CUDA_") || strings.HasPrefix(kv, "GPU_") {
			fmt.Println(kv)
		}
	}
	fmt.Println(End)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
}
