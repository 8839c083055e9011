//go:build faultinject

package fault

import "os"

// DropFreedGPU makes the scheduler ignore the events that free a GPU (a
// bound GPU pod deleted or its assignment removed), as if the watch had
// missed them: no queueing hint fires and the requeue reconciler is not told.
// Only the reconciler's periodic resync can then notice the free device.
// Set GPU_SCHEDULER_FAULT_DROP_FREED_GPU=1.
func DropFreedGPU() bool { return os.Getenv("GPU_SCHEDULER_FAULT_DROP_FREED_GPU") == "1" }
