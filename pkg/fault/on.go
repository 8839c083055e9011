//go:build faultinject

package fault

import (
	"os"
	"strings"
)

// DropFreedGPU makes the scheduler ignore the events that free a GPU (a
// bound GPU pod deleted or its assignment removed), as if the watch had
// missed them: no queueing hint fires and the requeue reconciler is not told.
// Only the reconciler's periodic resync can then notice the free device.
// Set GPU_SCHEDULER_FAULT_DROP_FREED_GPU=1.
func DropFreedGPU() bool { return os.Getenv("GPU_SCHEDULER_FAULT_DROP_FREED_GPU") == "1" }

// FailReserve makes GPUFit's Reserve fail, outside a pod group's tentative
// placement, for pods whose name ends with the value of
// GPU_SCHEDULER_FAULT_FAIL_RESERVE: as when the devices changed between a
// gang's placement and its commit, so that the members reserved before it
// wait at Permit for a member that never comes.
func FailReserve(name string) bool {
	v := os.Getenv("GPU_SCHEDULER_FAULT_FAIL_RESERVE")
	return v != "" && strings.HasSuffix(name, v)
}
