package hami

import (
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// Agent is HAMi's device plugin as the GPU domain sees it (gpu.Agent): the
// devices a node registers, the request dialect, and the per-pod device
// record. It is a comparable value, so that profiles can check that they
// read devices the same way.
type Agent struct {
	Config Config
	// ProductLabel, when the node has it, names the model (GFD's product
	// label, which exact model constraints are written against); HAMi's
	// own type name otherwise.
	ProductLabel string
}

var _ gpu.Agent = Agent{}

// AgentName is how messages name it.
func (Agent) AgentName() string { return "HAMi" }

// Devices reads the registration. A node without it is not HAMi's; one
// whose registration does not parse has no device (its allocatable counts
// HAMi's slots, never GPUs). Devices follow the plugin's index; a device
// is healthy when the plugin says so and the node's allocatable
// nvidia.com/gpu is above 0 (HAMi's own rule). Devices in mig or mps mode
// are left out: their protocol is not implemented.
func (a Agent) Devices(node *v1.Node) ([]gpu.Device, gpu.AgentState) {
	v, ok := node.Annotations[AnnotationRegister]
	if !ok {
		if Unregistered(node) {
			return nil, gpu.Unregistered
		}
		return nil, gpu.NotServed
	}
	out := []gpu.Device{}
	ds, err := parseRegisterCached(v)
	if err != nil {
		return out, gpu.Reported
	}
	q := node.Status.Allocatable[ResourceGPU]
	allocatable := q.Sign() > 0
	cordoned := Cordoned(node.Annotations[AnnotationCordon])
	model := node.Labels[a.ProductLabel]
	seen := map[string]bool{}
	for _, d := range ds {
		if d.ID == "" || seen[d.ID] || (d.Mode != "" && d.Mode != ModeHAMiCore) {
			continue
		}
		seen[d.ID] = true
		m := model
		if m == "" {
			m = d.Type
		}
		out = append(out, gpu.Device{UUID: d.ID, Model: m, Type: d.Type, MemoryMiB: int64(d.Devmem), Cores: d.Devcore, Slots: d.Count,
			Healthy: d.Health && allocatable, Cordoned: cordoned[d.ID]})
	}
	return out, gpu.Reported
}

// Unregistered reports whether HAMi's device plugin runs on a node that has
// no registration yet: the plugin has registered with the kubelet (which
// then advertises its slots) before it writes the annotation, or cannot
// write it. Then the allocatable counts slots, not GPUs, and a bind there
// would carry no lock and no device list. The sign: the node advertises
// more nvidia.com/gpu than GPU Feature Discovery counts GPUs, times the
// replicas of NVIDIA's own time-slicing (nvidia.com/gpu.count,
// nvidia.com/gpu.replicas). A node without GFD's count is read as a plain
// node. (HAMi's scheduler's handshake annotation is no sign: it writes it
// on every node its label selector matches, and leaves it there.)
func Unregistered(node *v1.Node) bool {
	count, err := strconv.ParseInt(node.Labels[gpu.LabelGPUCount], 10, 64)
	if err != nil || count <= 0 {
		return false
	}
	replicas := int64(1)
	if r, err := strconv.ParseInt(node.Labels[gpu.LabelGPUReplicas], 10, 64); err == nil && r > 1 {
		replicas = r
	}
	q, ok := node.Status.Allocatable[ResourceGPU]
	return ok && q.Value() > count*replicas
}

// hasShareKeys reports which share resources a container sets.
func hasShareKeys(c *v1.Container) (mem, pct, cores bool) {
	has := func(n v1.ResourceName) bool {
		_, l := c.Resources.Limits[n]
		_, r := c.Resources.Requests[n]
		return l || r
	}
	return has(ResourceMemory), has(ResourceMemoryPercent), has(ResourceCores)
}

// Share reads HAMi's dialect: a container with nvidia.com/gpu and one of
// nvidia.com/gpumem, gpumem-percentage or gpucores. HAMi's webhook does not
// see pods of other schedulers, so its defaults are applied here: without
// gpucores, a request of all the memory (or of no memory) takes all the
// cores, which makes it exclusive. A pod without these resources does not
// use the dialect (nvidia.com/gpu alone is whole GPUs). What HAMi would
// silently ignore (gpumem that is not a plain integer) is an error, and so
// is a share in more than one container, which gpu-scheduler does not
// place.
func (a Agent) Share(pod *v1.Pod) (int32, gpu.DeviceShare, bool, error) {
	var found ContainerRequest
	var hasMem, hasCores bool
	n := 0
	check := func(cs []v1.Container) error {
		for i := range cs {
			c := &cs[i]
			mem, pct, cores := hasShareKeys(c)
			if !mem && !pct && !cores {
				continue
			}
			r := ParseContainerRequest(c, a.Config)
			if r.Nums == 0 {
				key := ResourceGPU
				v := ""
				if q, ok := c.Resources.Limits[ResourceGPU]; ok {
					v = q.String()
				}
				rule := "a share needs " + ResourceGPU + ": N (a whole number of devices) in the same container"
				if mem {
					key = ResourceMemory
					q := c.Resources.Limits[ResourceMemory]
					if _, ok := c.Resources.Limits[ResourceMemory]; !ok {
						q = c.Resources.Requests[ResourceMemory]
					}
					v = q.String()
					rule = "must be a plain number of MiB (20000, not 20Gi), with " + ResourceGPU + ": N in the same container"
				}
				return &gpu.InvalidError{Key: key, Value: v, Rule: rule, Resource: true}
			}
			n++
			found, hasMem, hasCores = r, mem || pct, cores
		}
		return nil
	}
	if err := check(pod.Spec.InitContainers); err != nil {
		return 0, gpu.DeviceShare{}, false, err
	}
	if err := check(pod.Spec.Containers); err != nil {
		return 0, gpu.DeviceShare{}, false, err
	}
	if n == 0 {
		return 0, gpu.DeviceShare{}, false, nil
	}
	gpuContainers := 0
	for _, cs := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			if containerGPUs(&cs[i]) > 0 {
				gpuContainers++
			}
		}
	}
	if n > 1 || gpuContainers > 1 {
		return 0, gpu.DeviceShare{}, false, &gpu.InvalidError{Key: ResourceMemory, Value: strconv.Itoa(gpuContainers) + " containers with " + ResourceGPU, Resource: true,
			Rule: "gpu-scheduler places a GPU share for one container of a pod; put the GPU work in one container"}
	}
	sh := gpu.DeviceShare{Cores: found.Coresreq}
	if found.Memreq > 0 {
		sh.MemoryMiB = int64(found.Memreq)
	} else {
		sh.Permille = found.MemPercentagereq * 10
	}
	if !hasCores && (found.MemPercentagereq == 100 || !hasMem) {
		sh.Cores = 100
	}
	return found.Nums, sh, true, nil
}

// Uses reads the pod's device record as HAMi's scheduler counts it: the
// allocated list, on the node the pod's vgpu-node annotation names, added
// up per GPU (CollapseInitContainerUsage).
func (Agent) Uses(pod *v1.Pod, node string) ([]gpu.DeviceUse, bool) {
	if pod.Annotations[AnnotationVGPUNode] != node {
		return nil, false
	}
	v, ok := pod.Annotations[AnnotationAllocated]
	if !ok {
		return nil, false
	}
	pd, err := DecodePodDevices(v)
	if err != nil {
		return nil, false
	}
	u := PodUsage(pod, pd)
	if len(u) == 0 {
		return nil, false
	}
	out := make([]gpu.DeviceUse, 0, len(u))
	for id, x := range u {
		out = append(out, gpu.DeviceUse{UUID: id, MemoryMiB: x.Mem, Cores: int32(min(x.Cores, 1<<30)), Slots: x.Slots})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UUID < out[j].UUID })
	return out, true
}

// Pending reads the record HAMi's scheduler writes in its Filter on a pod
// it has chosen devices for, before it takes the lock to bind it: the pod
// holds them meanwhile, as HAMi counts it, from the decision's time (one in
// the future, or before the pod existed, is not one). Our own pods carry
// our assignment and are not HAMi's to hold.
func (Agent) Pending(p *v1.Pod) (string, time.Time, bool) {
	node := p.Annotations[AnnotationVGPUNode]
	_, ours := p.Annotations[gpu.AnnotationAssignment]
	_, record := p.Annotations[AnnotationAllocated]
	if node == "" || !record || ours || p.Spec.NodeName != "" || p.DeletionTimestamp != nil ||
		p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
		return "", time.Time{}, false
	}
	now := time.Now()
	since := now
	if sec, err := strconv.ParseInt(p.Annotations[AnnotationVGPUTime], 10, 64); err == nil && sec > 0 {
		since = time.Unix(sec, 0)
		if since.After(now) {
			since = now
		}
		if c := p.CreationTimestamp.Time; !c.IsZero() && since.Before(c) {
			since = c
		}
	}
	return node, since, true
}

// Allocation is the device list for a pod given the devices chosen (in
// index order) and the share each takes: every container that asks the
// device plugin for GPUs gets as many as it asks for, in container order,
// init containers first; the others get an empty entry. Containers that run
// together take devices of their own: app containers and sidecars (init
// containers that keep running) from the next unused device on; an
// ordinary init container runs alone beside the sidecars started before it
// and reuses the devices after theirs. The devices chosen are as many as the
// pod's effective request, which is exactly this: running out means the two
// disagree, and is an error.
func Allocation(pod *v1.Pod, devs []gpu.Device, share gpu.DeviceShare) (PodDevices, error) {
	var pd PodDevices
	next := 0
	take := func(c *v1.Container, at int) (ContainerDevices, int, error) {
		n := containerGPUs(c)
		if n <= 0 {
			return ContainerDevices{}, at, nil
		}
		if at+int(n) > len(devs) {
			return nil, at, fmt.Errorf("container %s asks for %d GPUs, but only %d of the %d chosen are left for it", c.Name, n, len(devs)-at, len(devs))
		}
		cd := make(ContainerDevices, 0, n)
		for _, d := range devs[at : at+int(n)] {
			cd = append(cd, ContainerDevice{UUID: d.UUID, Type: Family,
				Usedmem: int32(min(share.MemoryOn(d.MemoryMiB), 1<<31-1)), Usedcores: share.Cores})
		}
		return cd, at + int(n), nil
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		sidecar := c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways
		cd, after, err := take(c, next)
		if err != nil {
			return nil, err
		}
		if sidecar {
			next = after
		}
		pd = append(pd, cd)
	}
	for i := range pod.Spec.Containers {
		cd, after, err := take(&pod.Spec.Containers[i], next)
		if err != nil {
			return nil, err
		}
		next = after
		pd = append(pd, cd)
	}
	return pd, nil
}

// containerGPUs is what a container asks the device plugin for (limits
// first); a value that is not a whole number asks for nothing.
func containerGPUs(c *v1.Container) int64 {
	n, has, isInt := quantity(c, ResourceGPU)
	if !has || !isInt {
		return 0
	}
	return n
}

// BindAnnotations are the pod annotations the device plugin reads, as HAMi's
// scheduler writes them: the node, the time of the decision, the device
// list twice (the plugin consumes one, accounting reads the other), and
// the bind phase and time. Times are Unix seconds.
func BindAnnotations(node string, pd PodDevices, now time.Time) map[string]string {
	list := EncodePodDevices(pd)
	ts := strconv.FormatInt(now.Unix(), 10)
	return map[string]string{
		AnnotationVGPUNode:   node,
		AnnotationVGPUTime:   ts,
		AnnotationToAllocate: list,
		AnnotationAllocated:  list,
		AnnotationBindPhase:  BindAllocating,
		AnnotationBindTime:   ts,
	}
}

// registered caches parsed registrations by value: a node's state is
// rebuilt on every change to the node or its pods (the node lock changes
// it twice per bind), and the registration rarely changes.
var registered struct {
	sync.Mutex
	m map[string]registration
}

type registration struct {
	ds  []Device
	err error
}

// maxRegistered bounds the cache (a value per node, and the old value of a
// node whose devices changed); past it, it starts over.
const maxRegistered = 1 << 14

// parseRegisterCached is ParseRegister, sorted by the plugin's index, from
// the cache when the value was seen before. The result is shared: read
// only.
func parseRegisterCached(v string) ([]Device, error) {
	registered.Lock()
	r, ok := registered.m[v]
	registered.Unlock()
	if ok {
		return r.ds, r.err
	}
	ds, err := ParseRegister(v)
	sort.SliceStable(ds, func(i, j int) bool {
		if ds[i].Index != ds[j].Index {
			return ds[i].Index < ds[j].Index
		}
		return ds[i].ID < ds[j].ID
	})
	registered.Lock()
	if registered.m == nil || len(registered.m) >= maxRegistered {
		registered.m = map[string]registration{}
	}
	registered.m[v] = registration{ds: ds, err: err}
	registered.Unlock()
	return ds, err
}
