//go:build !faultinject

package fault

// DropFreedGPU is false outside fault-injection builds.
func DropFreedGPU() bool { return false }
