package hami

import v1 "k8s.io/api/core/v1"

// Usage is what one pod holds on one GPU.
type Usage struct {
	Mem   int64 // MiB
	Cores int64 // percent
	// Slots is how many of the device's Count the pod takes.
	Slots int32
}

// PodUsage adds up a pod's device list per GPU as HAMi's accounting does
// (CollapseInitContainerUsage): init containers run one after another, so
// they take their peak; app containers run together, so they add up; a GPU
// takes the larger of the two, and one slot per app container on it (one at
// least). The list's entries follow the pod's containers, init containers
// first.
func PodUsage(pod *v1.Pod, pd PodDevices) map[string]Usage {
	numInit := len(pod.Spec.InitContainers)
	initPeak := map[string]Usage{}
	appSum := map[string]Usage{}
	for i, cd := range pd {
		for _, d := range cd {
			if i < numInit {
				u := initPeak[d.UUID]
				u.Mem, u.Cores, u.Slots = max(u.Mem, int64(d.Usedmem)), max(u.Cores, int64(d.Usedcores)), 1
				initPeak[d.UUID] = u
				continue
			}
			u := appSum[d.UUID]
			u.Mem += int64(d.Usedmem)
			u.Cores += int64(d.Usedcores)
			u.Slots++
			appSum[d.UUID] = u
		}
	}
	out := make(map[string]Usage, len(initPeak)+len(appSum))
	for id, u := range initPeak {
		out[id] = u
	}
	for id, a := range appSum {
		u := out[id]
		out[id] = Usage{Mem: max(u.Mem, a.Mem), Cores: max(u.Cores, a.Cores), Slots: max(a.Slots, 1)}
	}
	return out
}
