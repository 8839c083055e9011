//go:build !faultinject

package fault

// DropFreedGPU is false outside fault-injection builds.
func DropFreedGPU() bool { return false }

// FailReserve is false outside fault-injection builds.
func FailReserve(string) bool { return false }
