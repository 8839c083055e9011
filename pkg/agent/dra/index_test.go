package dra

import (
	"reflect"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

func str(v string) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{StringValue: ptr.To(v)}
}

func capa(v string) resourceapi.DeviceCapacity {
	return resourceapi.DeviceCapacity{Value: resource.MustParse(v)}
}

// nvGPU is a GPU as NVIDIA's driver publishes it.
func nvGPU(name, uuid, product, mem string) resourceapi.Device {
	return resourceapi.Device{Name: name,
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": str("gpu"), "uuid": str(uuid), "productName": str(product),
			"resource.kubernetes.io/pciBusID": str("0000:3b:00.0")},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": capa(mem)}}
}

func nvMIG(name, parent, product, mem string) resourceapi.Device {
	return resourceapi.Device{Name: name,
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": str("mig"), "parentUUID": str(parent), "productName": str(product),
			"profile": str("1g.10gb")},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": capa(mem), "multiprocessors": capa("14")}}
}

// hamiGPU is a GPU as HAMi's driver publishes it: shared by capacity.
func hamiGPU(name, uuid, product, mem string) resourceapi.Device {
	return resourceapi.Device{Name: name, AllowMultipleAllocations: ptr.To(true),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": str("hami-gpu"), "uuid": str(uuid), "productName": str(product)},
		Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": capa(mem), "cores": capa("100")}}
}

func slice(name, driver, node string, gen int64, devs ...resourceapi.Device) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{Driver: driver, NodeName: ptr.To(node),
			Pool: resourceapi.ResourcePool{Name: node, Generation: gen, ResourceSliceCount: 1}, Devices: devs}}
}

type result = resourceapi.DeviceRequestAllocationResult

func claim(ns, name string, uid types.UID, pods []types.UID, results ...result) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid}}
	if results != nil {
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	}
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "p", UID: p})
	}
	return c
}

func res(driver, pool, dev string) result {
	return result{Request: "gpu", Driver: driver, Pool: pool, Device: dev}
}

func TestIndexDevices(t *testing.T) {
	var told []string
	x := NewIndex(DefaultDrivers, func(n string) { told = append(told, n) })
	tainted := nvGPU("gpu-2", "GPU-c", "NVIDIA-A100-SXM4-80GB", "80Gi")
	tainted.Taints = []resourceapi.DeviceTaint{{Key: "gpu.nvidia.com/xid", Value: "79", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	informational := nvGPU("gpu-1", "GPU-b", "NVIDIA-A100-SXM4-80GB", "80Gi")
	informational.Taints = []resourceapi.DeviceTaint{{Key: "gpu.nvidia.com/unmonitored", Effect: resourceapi.DeviceTaintEffectNone}}
	vfio := resourceapi.Device{Name: "gpu-vfio-3", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": str("vfio")}}
	lostPart := nvMIG("gpu-5-mig-1g10gb-19-0", "GPU-lost", "NVIDIA-A100-SXM4-80GB", "10Gi")
	lostPart.Taints = []resourceapi.DeviceTaint{{Key: "gpu.nvidia.com/gpu-lost", Effect: resourceapi.DeviceTaintEffectNoExecute}}
	// NVML's product name has spaces; GFD's label, dashes.
	x.SliceChanged(nil, slice("b-slice", NVIDIA.Name, "n1", 1,
		nvGPU("gpu-0", "GPU-a", "NVIDIA A100-SXM4-80GB", "80Gi"), informational, tainted, vfio,
		nvMIG("gpu-4-mig-1g10gb-19-0", "GPU-mig", "NVIDIA-A100-SXM4-80GB", "10Gi"),
		nvMIG("gpu-4-mig-1g10gb-19-1", "GPU-mig", "NVIDIA-A100-SXM4-80GB", "10Gi"), lostPart))
	// An older generation of the pool no longer counts.
	x.SliceChanged(nil, slice("a-old", NVIDIA.Name, "n1", 0, nvGPU("gpu-9", "GPU-old", "Tesla-T4", "15Gi")))
	// Another driver's devices are not GPUs.
	x.SliceChanged(nil, slice("c-net", "net.example.com", "n1", 1, resourceapi.Device{Name: "nic-0"}))
	devs, ok := x.NodeDevices("n1")
	if !ok {
		t.Fatal("no devices on n1")
	}
	var got []string
	for _, d := range devs {
		got = append(got, d.UUID)
	}
	if want := []string{"GPU-a", "GPU-b", "GPU-c", "GPU-mig", "GPU-lost"}; !slices.Equal(got, want) {
		t.Fatalf("devices %v, want %v", got, want)
	}
	if d := devs[0]; d.Model != "NVIDIA-A100-SXM4-80GB" || d.MemoryMiB != 80*1024 || d.Cores != 100 || d.Slots != 1 || !d.Healthy || d.Cordoned {
		t.Errorf("GPU-a read as %+v", d)
	}
	if !devs[1].Healthy || devs[2].Healthy {
		t.Errorf("taints: GPU-b healthy %v (effect None), GPU-c healthy %v (NoSchedule)", devs[1].Healthy, devs[2].Healthy)
	}
	if d := devs[3]; !d.Cordoned || d.MemoryMiB != 20*1024 || d.Slots != 2 || !d.Healthy {
		t.Errorf("a GPU in MIG mode: %+v, want cordoned (no whole-GPU request), 20 GiB from its partitions, 2 slots", d)
	}
	if devs[4].Healthy {
		t.Error("a GPU whose partition is tainted NoExecute is healthy")
	}
	if !slices.Contains(told, "n1") {
		t.Errorf("n1's change not told: %v", told)
	}
	if _, ok := x.NodeDevices("n2"); ok {
		t.Error("n2 has no slice")
	}
	// The slice goes: so do its devices.
	x.SliceChanged(slice("b-slice", NVIDIA.Name, "n1", 1), nil)
	x.SliceChanged(slice("a-old", NVIDIA.Name, "n1", 0), nil)
	if devs, ok := x.NodeDevices("n1"); ok {
		t.Errorf("devices left after the slices went: %v", devs)
	}
}

func TestIndexClaims(t *testing.T) {
	x := NewIndex(DefaultDrivers, nil)
	x.SliceChanged(nil, slice("nv", NVIDIA.Name, "n1", 1,
		nvGPU("gpu-0", "GPU-a", "NVIDIA-A100-SXM4-80GB", "80Gi"), nvGPU("gpu-1", "GPU-b", "NVIDIA-A100-SXM4-80GB", "80Gi"),
		nvMIG("gpu-2-mig-0", "GPU-m", "NVIDIA-A100-SXM4-80GB", "10Gi")))
	x.SliceChanged(nil, slice("hami", HAMi.Name, "n2", 1, hamiGPU("hami-gpu-0", "GPU-h", "Tesla-T4", "16Gi")))

	whole := claim("ns", "whole", "u1", []types.UID{"pod-1"}, res(NVIDIA.Name, "n1", "gpu-1"))
	admin := res(NVIDIA.Name, "n1", "gpu-0")
	admin.AdminAccess = ptr.To(true)
	monitor := claim("ns", "monitor", "u2", nil, admin)
	mig := claim("ns", "mig", "u3", nil, res(NVIDIA.Name, "n1", "gpu-2-mig-0"))
	share := res(HAMi.Name, "n2", "hami-gpu-0")
	share.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{"cores": resource.MustParse("30"), "memory": resource.MustParse("4Gi")}
	shared := claim("ns", "share", "u4", nil, share)
	shared.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "p", UID: "pod-4"}}
	pending := claim("ns", "pending", "u5", nil) // not allocated
	other := claim("ns", "other", "u6", nil, res("net.example.com", "n1", "nic-0"))
	for _, c := range []*resourceapi.ResourceClaim{whole, monitor, mig, shared, pending, other} {
		x.ClaimChanged(nil, c)
	}
	got := x.Claimed("n1")
	want := []gpu.ClaimHold{
		{Name: "ns/mig", Uses: []gpu.DeviceUse{{UUID: "GPU-m", MemoryMiB: 10 * 1024, Cores: 100, Slots: 1}}},
		{Name: "ns/whole", Consumers: []types.UID{"pod-1"}, Uses: []gpu.DeviceUse{{UUID: "GPU-b", MemoryMiB: 80 * 1024, Cores: 100, Slots: 1}}},
	}
	if !equalHolds(got, want) {
		t.Errorf("n1 claims %+v, want %+v (admin access holds nothing; a partition holds its memory of its GPU)", got, want)
	}
	got = x.Claimed("n2")
	want = []gpu.ClaimHold{{Name: "ns/share", Consumers: []types.UID{"pod-4"}, Uses: []gpu.DeviceUse{{UUID: "GPU-h", MemoryMiB: 4096, Cores: 30, Slots: 1}}}}
	if !equalHolds(got, want) {
		t.Errorf("n2 claims %+v, want %+v", got, want)
	}
	// Deallocated, then deleted.
	x.ClaimChanged(whole, claim("ns", "whole", "u1", nil))
	x.ClaimChanged(shared, nil)
	if got := x.Claimed("n1"); len(got) != 1 || got[0].Name != "ns/mig" {
		t.Errorf("n1 after the deallocation: %+v", got)
	}
	if got := x.Claimed("n2"); len(got) != 0 {
		t.Errorf("n2 after the deletion: %+v", got)
	}
}

func equalHolds(a, b []gpu.ClaimHold) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || !slices.Equal(a[i].Consumers, b[i].Consumers) || !slices.Equal(a[i].Uses, b[i].Uses) {
			return false
		}
	}
	return true
}

func gpuPod(uid types.UID, node string, gpus int64) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: string(uid), UID: uid}, Spec: v1.PodSpec{NodeName: node,
		Containers: []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{
			Requests: v1.ResourceList{gpu.ResourceNvidiaGPU: *resource.NewQuantity(gpus, resource.DecimalSI)},
			Limits:   v1.ResourceList{gpu.ResourceNvidiaGPU: *resource.NewQuantity(gpus, resource.DecimalSI)}}}}}}
	p.Status.Phase = v1.PodRunning
	return p
}

// The accounting of a DRA node: claims hold their devices whoever allocated
// them, a pod a claim serves holds nothing more, a GPU pod without a claim
// (in flight, or served by a device plugin beside DRA) is laid down by its
// request, and a node a device plugin also serves is reported, its GPUs
// counted once.
func TestTrackerCountsClaims(t *testing.T) {
	x := NewIndex(DefaultDrivers, nil)
	opts := gpu.DefaultNodeOptions
	opts.Claims = x
	tr := gpu.NewTracker(opts)
	x.SliceChanged(nil, slice("nv", NVIDIA.Name, "n1", 1,
		nvGPU("gpu-0", "GPU-a", "NVIDIA-A100-SXM4-80GB", "80Gi"), nvGPU("gpu-1", "GPU-b", "NVIDIA-A100-SXM4-80GB", "80Gi"),
		nvGPU("gpu-2", "GPU-c", "NVIDIA-A100-SXM4-80GB", "80Gi"), nvGPU("gpu-3", "GPU-d", "NVIDIA-A100-SXM4-80GB", "80Gi")))
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	served := gpuPod("served", "n1", 1)
	served.Status.ExtendedResourceClaimStatus = &v1.PodExtendedResourceClaimStatus{ResourceClaimName: "served-gpu"}
	reserved := gpuPod("reserved", "n1", 1) // its claim names it; the pod does not show it yet
	loose := gpuPod("loose", "n1", 1)
	x.ClaimChanged(nil, claim("ns", "served-gpu", "c1", nil, res(NVIDIA.Name, "n1", "gpu-0")))
	x.ClaimChanged(nil, claim("ns", "reserved", "c2", []types.UID{"reserved"}, res(NVIDIA.Name, "n1", "gpu-1")))
	x.ClaimChanged(nil, claim("other", "elsewhere", "c3", nil, res(NVIDIA.Name, "n1", "gpu-2")))

	// A pod whose status names a claim not seen yet holds its request
	// until the claim is counted: never nothing.
	early := gpuPod("early", "n1", 1)
	early.Status.ExtendedResourceClaimStatus = &v1.PodExtendedResourceClaimStatus{ResourceClaimName: "early-gpu"}
	if st := tr.Compute(node, []*v1.Pod{early}, 0, 0, "", false); st.Overcommitted || st.Free[0]+st.Free[1]+st.Free[2]+st.Free[3] != 0 {
		t.Errorf("three claims and a pod whose claim is not seen yet: free %v, want the fourth device held by its request", st.Free[:4])
	}
	st := tr.Compute(node, []*v1.Pod{served, reserved, loose}, 0, 0, "", false)
	if !st.Claimed || st.Count != 4 || st.DoubleView != "" {
		t.Fatalf("inventory %+v", st.Inventory)
	}
	if st.Overcommitted {
		t.Fatal("overcommitted: a pod served by a claim was counted twice")
	}
	if out, _, _ := st.Fit(&gpu.Request{Count: 1}); out != gpu.TooFewFreeDevices {
		t.Errorf("4 GPUs, 3 claims, 1 pod without a claim: a GPU fits (%v)", out)
	}
	st = tr.Compute(node, []*v1.Pod{served, reserved}, 0, 0, "", false)
	if out, _, _ := st.Fit(&gpu.Request{Count: 1}); out != gpu.Fits {
		t.Errorf("one GPU left: %v", out)
	}
	if out, _, _ := st.Fit(&gpu.Request{Count: 2}); out != gpu.TooFewFreeDevices {
		t.Errorf("two GPUs fit where one is left: %v", out)
	}
	// Shares of the request dialect are not delivered on a DRA node, not
	// even accounting only: DRA's allocator would hand out a whole device.
	for _, r := range []gpu.Request{{Milli: 500, Slot: true, NeedsDelivery: true}, {Milli: 500}} {
		if out, _, _ := st.Fit(&r); out != gpu.NoShareDelivery {
			t.Errorf("a share on a DRA node (%+v): %v", r, out)
		}
	}
	// A pod binding (reserved, its claim allocated for it, not in this
	// view yet): its claim holds its device, not the reservation too.
	tr.Reserve("n1", "binding", gpu.Reservation{Namespace: "ns", Name: "binding", Choice: gpu.Choice{Mask: 1 << 3, Milli: 1000}})
	x.ClaimChanged(nil, claim("ns", "binding-gpu", "c5", []types.UID{"binding"}, res(NVIDIA.Name, "n1", "gpu-3")))
	if st := tr.Compute(node, []*v1.Pod{served, reserved}, 0, 0, "", false); st.Overcommitted || st.Free[3] != 0 {
		t.Errorf("a binding pod's reservation and claim: overcommitted %v, free %v", st.Overcommitted, st.Free[:4])
	}
	x.ClaimChanged(claim("ns", "binding-gpu", "c5", nil), nil)
	tr.Unreserve("binding")
	// GFD's product label names the model; the driver's is the type.
	node.Labels = map[string]string{gpu.LabelGPUProduct: "A100-by-GFD"}
	if st := tr.Compute(node, nil, 0, 0, "", false); st.Devices[0].Model != "A100-by-GFD" || st.Devices[0].Type != "NVIDIA-A100-SXM4-80GB" {
		t.Errorf("model %q type %q", st.Devices[0].Model, st.Devices[0].Type)
	}
	node.Labels = nil
	// A claim more than the node has overcommits it.
	x.ClaimChanged(nil, claim("other", "twice", "c4", nil, res(NVIDIA.Name, "n1", "gpu-0")))
	if st := tr.Compute(node, []*v1.Pod{served, reserved}, 0, 0, "", false); !st.Overcommitted {
		t.Error("two claims on one exclusive GPU: not overcommitted")
	}
	// A device plugin that also advertises the GPUs.
	node.Status.Allocatable = v1.ResourceList{gpu.ResourceNvidiaGPU: resource.MustParse("4")}
	if st := tr.Compute(node, nil, 0, 0, "", false); st.Count != 4 || st.DoubleView == "" {
		t.Errorf("double view: count %d, reported %q", st.Count, st.DoubleView)
	}
}

func class(name, expr string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}}}
}

func TestClaimRequest(t *testing.T) {
	x := NewIndex(DefaultDrivers, nil)
	classes := map[string]*resourceapi.DeviceClass{
		"gpu.nvidia.com": class("gpu.nvidia.com", `device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'`),
		"mig.nvidia.com": class("mig.nvidia.com", `device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'`),
		"hami":           class("hami", `device.driver == "hami-core-gpu.project-hami.io" && device.attributes["hami-core-gpu.project-hami.io"].type == "hami-gpu"`),
		"nic":            class("nic", `device.driver == 'net.example.com'`),
	}
	get := func(n string) *resourceapi.DeviceClass { return classes[n] }
	req := func(cls string, n int64, caps map[resourceapi.QualifiedName]resource.Quantity) resourceapi.DeviceRequest {
		e := &resourceapi.ExactDeviceRequest{DeviceClassName: cls, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: n}
		if caps != nil {
			e.Capacity = &resourceapi.CapacityRequirements{Requests: caps}
		}
		return resourceapi.DeviceRequest{Name: "r", Exactly: e}
	}
	c := func(reqs ...resourceapi.DeviceRequest) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}}}
	}
	share := map[resourceapi.QualifiedName]resource.Quantity{"cores": resource.MustParse("30"), "memory": resource.MustParse("4Gi")}
	allocated := c(req("gpu.nvidia.com", 2, nil))
	allocated.Status.Allocation = &resourceapi.AllocationResult{}
	all := c(resourceapi.DeviceRequest{Name: "r", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com", AllocationMode: resourceapi.DeviceAllocationModeAll}})
	for _, tc := range []struct {
		name   string
		claims []*resourceapi.ResourceClaim
		want   gpu.Request
		ok     bool
	}{
		{"two whole GPUs", []*resourceapi.ResourceClaim{c(req("gpu.nvidia.com", 2, nil))}, gpu.Request{Count: 2, ByClaim: true}, true},
		{"whole GPUs add up across claims, other devices do not count",
			[]*resourceapi.ResourceClaim{c(req("gpu.nvidia.com", 1, nil), req("nic", 1, nil)), c(req("gpu.nvidia.com", 1, nil))}, gpu.Request{Count: 2, ByClaim: true}, true},
		{"a share by capacity", []*resourceapi.ResourceClaim{c(req("hami", 1, share))},
			gpu.Request{ShareCount: 1, Share: gpu.DeviceShare{MemoryMiB: 4096, Cores: 30}, ByClaim: true}, true},
		{"HAMi without capacity: the whole GPU", []*resourceapi.ResourceClaim{c(req("hami", 1, nil))}, gpu.Request{Count: 1, ByClaim: true}, true},
		{"already allocated: nothing new", []*resourceapi.ResourceClaim{allocated}, gpu.Request{}, false},
		{"MIG: not a whole GPU", []*resourceapi.ResourceClaim{c(req("mig.nvidia.com", 1, nil))}, gpu.Request{}, false},
		{"all devices: cannot say", []*resourceapi.ResourceClaim{all}, gpu.Request{}, false},
		{"two shares: cannot say", []*resourceapi.ResourceClaim{c(req("hami", 2, share))}, gpu.Request{}, false},
		{"an unknown class", []*resourceapi.ResourceClaim{c(req("nope", 1, nil))}, gpu.Request{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := x.ClaimRequest(tc.claims, get)
			if ok != tc.ok || ok && !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v %v, want %+v %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
