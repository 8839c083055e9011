package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/fakedra"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/overcommit"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/gpufit"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

// installDRAClasses installs the fake driver's DeviceClasses; it skips the
// test where the API server does not map an extended resource to DRA
// (DeviceClass extendedResourceName, GA in 1.37).
func installDRAClasses(t *testing.T, s *harness.Scope, needExtended bool) {
	t.Helper()
	if err := fakedra.InstallClasses(s.Ctx, cluster.Client); err != nil {
		t.Fatal(err)
	}
	// A class that maps nvidia.com/gpu changes how every later test's GPU
	// pods are judged on nodes without it (DRA's reasons, not
	// NodeResourcesFit's): it goes with the test.
	t.Cleanup(func() {
		for _, c := range fakedra.DeviceClasses() {
			cluster.Client.ResourceV1().DeviceClasses().Delete(context.Background(), c.Name, metav1.DeleteOptions{})
		}
	})
	if !needExtended {
		return
	}
	c, err := cluster.Client.ResourceV1().DeviceClasses().Get(s.Ctx, fakedra.DriverName(fakedra.NVIDIA), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Spec.ExtendedResourceName == nil {
		t.Skip("the API server drops DeviceClass extendedResourceName (DRAExtendedResource, GA in 1.37): nvidia.com/gpu is not served by DRA here")
	}
}

// outsideClaim creates a claim and allocates it as another scheduler or
// controller would, on the given devices of a node's fake driver, each
// consuming consumed where given (a share of a device shared by capacity).
func outsideClaim(t *testing.T, s *harness.Scope, name, style, node string, consumed map[resourceapi.QualifiedName]resource.Quantity, devices ...string) *resourceapi.ResourceClaim {
	t.Helper()
	driver := fakedra.DriverName(style)
	req := resourceapi.ExactDeviceRequest{DeviceClassName: driver, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(len(devices))}
	if consumed != nil {
		req.Capacity = &resourceapi.CapacityRequirements{Requests: consumed}
	}
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: s.NS, Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}}}}}
	c, err := cluster.Client.ResourceV1().ResourceClaims(s.NS).Create(s.Ctx, c, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a := &resourceapi.AllocationResult{NodeSelector: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
		MatchFields: []v1.NodeSelectorRequirement{{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{node}}}}}}}
	for _, d := range devices {
		r := resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: driver, Pool: node, Device: d}
		if consumed != nil {
			r.ConsumedCapacity = consumed
			r.ShareID = ptr.To(types.UID(uuid.NewUUID()))
		}
		a.Devices.Results = append(a.Devices.Results, r)
	}
	c.Status.Allocation = a
	if c, err = cluster.Client.ResourceV1().ResourceClaims(s.NS).UpdateStatus(s.Ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if consumed != nil && len(c.Status.Allocation.Devices.Results) > 0 && c.Status.Allocation.Devices.Results[0].ConsumedCapacity == nil {
		t.Skip("the API server drops consumedCapacity (DRAConsumableCapacity)")
	}
	// Another allocator's claims reach the scheduler through its
	// informer: a pod created at once could meet an allocator that has not
	// seen them (a real double allocation, not ours to prevent).
	time.Sleep(time.Second)
	return c
}

// claimedDevices are the devices each claim of the scope holds, by device.
func claimedDevices(t *testing.T, s *harness.Scope) map[string][]string {
	t.Helper()
	list, err := cluster.Client.ResourceV1().ResourceClaims(s.NS).List(s.Ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, c := range list.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			k := r.Pool + "/" + r.Device
			out[k] = append(out[k], c.Name)
		}
	}
	return out
}

// deleteClaim frees and deletes a claim as the resource claim controller
// does (none runs here): the allocation and its reservations go first, then
// the finalizer the scheduler put on it, then the claim.
func deleteClaim(t *testing.T, s *harness.Scope, name string) {
	t.Helper()
	claims := cluster.Client.ResourceV1().ResourceClaims(s.NS)
	// Where a controller runs (kind), it may get there first.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, err := claims.Get(s.Ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c.Status.Allocation != nil || len(c.Status.ReservedFor) > 0 {
			c.Status.Allocation, c.Status.ReservedFor = nil, nil
			if c, err = claims.UpdateStatus(s.Ctx, c, metav1.UpdateOptions{}); err != nil {
				return err
			}
		}
		if len(c.Finalizers) > 0 {
			c.Finalizers = nil
			if _, err = claims.Update(s.Ctx, c, metav1.UpdateOptions{}); err != nil {
				return err
			}
		}
		return claims.Delete(s.Ctx, name, metav1.DeleteOptions{})
	})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

// GPUs a DRA driver publishes serve nvidia.com/gpu (the DeviceClass maps
// it): gpu-scheduler places such pods on the DRA node, where the
// DynamicResources plugin allocates the devices, never a tainted one; a
// claim allocated by someone else holds its device, and the pods that do
// not fit around it wait for GPUFit's reason until it goes.
func TestDRAWholeGPUs(t *testing.T) {
	s := cluster.NewScope(t)
	installDRAClasses(t, s, true)
	s.AddNodes(fleet.Node{Name: "dra", CPU: "32", Memory: "128Gi", GPUs: 5, Unhealthy: 1, Model: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920, DRA: fakedra.NVIDIA})
	node := s.Node("dra")
	s.Create(s.Pod(harness.PodSpec{Name: "w2", GPUs: 2}))
	p := s.WaitBound(bindTimeout, "w2")["w2"]
	if p.Spec.NodeName != node {
		t.Fatalf("w2 on %q", p.Spec.NodeName)
	}
	if got := s.Get("w2").Status.ExtendedResourceClaimStatus; got == nil {
		t.Fatal("w2's GPUs were not allocated through DRA")
	}
	held := claimedDevices(t, s)
	if len(held) != 2 {
		t.Fatalf("w2's claim holds %v, want 2 devices", held)
	}
	// Someone else allocates a free healthy device (gpu-4 is tainted).
	var free string
	for i := 0; i < 4; i++ {
		if d := fmt.Sprintf("gpu-%d", i); held[node+"/"+d] == nil {
			free = d
			break
		}
	}
	outsideClaim(t, s, "outside", fakedra.NVIDIA, node, nil, free)

	// One healthy device is left: two GPUs wait, one binds to it.
	s.Create(s.Pod(harness.PodSpec{Name: "w2b", GPUs: 2}))
	t.Logf("w2b waits: %s", s.WaitUnschedulable(bindTimeout, "w2b"))
	s.Create(s.Pod(harness.PodSpec{Name: "w1", GPUs: 1}))
	s.WaitBound(bindTimeout, "w1")
	held = claimedDevices(t, s)
	for d, cs := range held {
		if len(cs) > 1 {
			t.Errorf("device %s booked twice: %v", d, cs)
		}
	}
	if held[node+"/gpu-4"] != nil {
		t.Errorf("the tainted device was allocated: %v", held)
	}
	if len(held) != 4 {
		t.Errorf("devices held %v, want the 4 healthy ones", held)
	}
	// The outside claim and w1's go (as the claim controller would delete
	// a deleted pod's claim): w2b fits.
	w1 := s.Get("w1").Status.ExtendedResourceClaimStatus.ResourceClaimName
	s.Delete("w1")
	deleteClaim(t, s, w1)
	deleteClaim(t, s, "outside")
	s.WaitBound(bindTimeout, "w2b")
}

// Fragmentation-aware placement sees the claims: seven nodes each with three
// of four GPUs held by claims allocated elsewhere, and an empty one. Single
// GPUs go to the nearly full nodes; the empty node stays whole for a pod
// that needs it. (Blind to the claims, the scheduler would see eight equal
// nodes, and DRA's filter would move each pod on to an untried one: the
// empty node would stay empty by chance one time in eight.)
func TestDRAPacksAroundClaims(t *testing.T) {
	s := cluster.NewScope(t)
	installDRAClasses(t, s, true)
	partial := []string{"a", "b", "c", "d", "e", "f", "g"}
	var nodes []fleet.Node
	for _, n := range append(slices.Clone(partial), "empty") {
		nodes = append(nodes, fleet.Node{Name: n, CPU: "32", Memory: "128Gi", GPUs: 4, Model: "NVIDIA-H100-80GB-HBM3", MemoryMiB: 81559, DRA: fakedra.NVIDIA})
	}
	s.AddNodes(nodes...)
	for _, n := range partial {
		outsideClaim(t, s, "held-"+n, fakedra.NVIDIA, s.Node(n), nil, "gpu-0", "gpu-1", "gpu-2")
	}
	var names []string
	for i := range partial {
		names = append(names, fmt.Sprintf("one-%d", i))
		s.Create(s.Pod(harness.PodSpec{Name: names[i], GPUs: 1}))
		s.WaitBound(bindTimeout, names[i])
	}
	for _, name := range names {
		if n := s.Get(name).Spec.NodeName; n == s.Node("empty") {
			t.Errorf("%s went to the empty node: the claims elsewhere were not seen", name)
		}
	}
	s.Create(s.Pod(harness.PodSpec{Name: "four", GPUs: 4}))
	if n := s.WaitBound(bindTimeout, "four")["four"].Spec.NodeName; n != s.Node("empty") {
		t.Errorf("four on %s", n)
	}
}

// Claims allocated elsewhere are counted against capacity: two claims on
// one whole GPU, or two shares of a GPU shared by capacity (HAMi's DRA
// driver) whose cores add up to more than it has, overcommit the node, which
// is surfaced and placed on no more; it is resolved when one goes.
func TestDRAClaimsOvercommit(t *testing.T) {
	for _, tc := range []struct {
		name, style string
		device      string
		a, b        map[resourceapi.QualifiedName]resource.Quantity
	}{
		{name: "whole", style: fakedra.NVIDIA, device: "gpu-0"},
		{name: "shares", style: fakedra.HAMi, device: "hami-gpu-0",
			a: map[resourceapi.QualifiedName]resource.Quantity{"cores": resource.MustParse("70"), "memory": resource.MustParse("4Gi")},
			b: map[resourceapi.QualifiedName]resource.Quantity{"cores": resource.MustParse("50"), "memory": resource.MustParse("4Gi")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := cluster.NewScope(t)
			installDRAClasses(t, s, false)
			s.AddNodes(fleet.Node{Name: "n", CPU: "32", Memory: "128Gi", GPUs: 1, Model: "Tesla-T4", MemoryMiB: 15360, DRA: tc.style})
			node := s.Node("n")
			outsideClaim(t, s, "first", tc.style, node, tc.a, tc.device)
			outsideClaim(t, s, "second", tc.style, node, tc.b, tc.device)
			t.Logf("node event: %s", nodeEvent(t, s, node, overcommit.ReasonOvercommitted, "DRA claims"))
			deleteClaim(t, s, "first")
			nodeEvent(t, s, node, overcommit.ReasonResolved, "fit")
		})
	}
}

// A node whose GPUs a DRA driver publishes and a device plugin advertises
// too: each GPU counts once, and the node is reported. A pod the device
// plugin would serve waits while claims hold the GPUs through DRA: neither
// view books a device the other gave out.
func TestDRAAndDevicePluginSeeOneGPU(t *testing.T) {
	s := cluster.NewScope(t)
	installDRAClasses(t, s, false)
	s.AddNodes(fleet.Node{Name: "both", CPU: "32", Memory: "128Gi", GPUs: 2, Model: "NVIDIA-L4", MemoryMiB: 23034, DRA: fakedra.NVIDIA, DevicePluginToo: true})
	node := s.Node("both")
	t.Logf("node event: %s", nodeEvent(t, s, node, overcommit.ReasonGPUsSeenTwice, "nvidia.com/gpu"))
	outsideClaim(t, s, "both-gpus", fakedra.NVIDIA, node, nil, "gpu-0", "gpu-1")
	s.Create(s.Pod(harness.PodSpec{Name: "plugin-pod", GPUs: 1}))
	t.Logf("plugin-pod waits: %s", s.WaitReason(bindTimeout, "plugin-pod", gpufit.ErrReasonTooFewFree))
	deleteClaim(t, s, "both-gpus")
	s.WaitBound(bindTimeout, "plugin-pod")
}

// claimPod is a pod of gpu-scheduler's that uses a claim of its own asking
// a share of one GPU by capacity (HAMi's DRA driver).
func claimPod(t *testing.T, s *harness.Scope, name, cores, memory string) *v1.Pod {
	t.Helper()
	req := resourceapi.ExactDeviceRequest{DeviceClassName: fakedra.DriverName(fakedra.HAMi), AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
		Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			"cores": resource.MustParse(cores), "memory": resource.MustParse(memory)}}}
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: s.NS, Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}}}}}
	if _, err := cluster.Client.ResourceV1().ResourceClaims(s.NS).Create(s.Ctx, c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := s.Pod(harness.PodSpec{Name: name})
	p.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(name)}}
	p.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
	return p
}

// The device a claim gets follows our order, not the allocator's first fit:
// a share goes to the GPU another share already uses (best fit), and the
// free GPU stays whole. Upstream's allocator would take hami-gpu-0, the
// first in the slice.
func TestDRADeviceChoice(t *testing.T) {
	s := cluster.NewScope(t)
	installDRAClasses(t, s, false)
	s.AddNodes(fleet.Node{Name: "hami", CPU: "32", Memory: "128Gi", GPUs: 2, Model: "Tesla-T4", MemoryMiB: 15360, DRA: fakedra.HAMi})
	node := s.Node("hami")
	outsideClaim(t, s, "used", fakedra.HAMi, node, map[resourceapi.QualifiedName]resource.Quantity{
		"cores": resource.MustParse("30"), "memory": resource.MustParse("4Gi")}, "hami-gpu-1")
	s.Create(claimPod(t, s, "share", "20", "2Gi"))
	if n := s.WaitBound(bindTimeout, "share")["share"].Spec.NodeName; n != node {
		t.Fatalf("share on %q", n)
	}
	held := claimedDevices(t, s)
	if got := held[node+"/hami-gpu-1"]; !slices.Contains(got, "share") {
		t.Errorf("the share got %v, want hami-gpu-1 beside the other share (best fit); claims by device: %v", got, held)
	}
	// A claim of all a GPU's capacity takes the free one (first fit in
	// the slice's order would have left none).
	s.Create(claimPod(t, s, "whole", "100", "15Gi"))
	s.WaitBound(bindTimeout, "whole")
	if got := claimedDevices(t, s)[node+"/hami-gpu-0"]; !slices.Contains(got, "whole") {
		t.Errorf("the whole GPU went elsewhere: %v", claimedDevices(t, s))
	}
}

// GPUScore reads a claim's share: a share by capacity goes to the node
// where it fits most tightly, beside another share on a 4-GPU node, not to
// the node with one whole free GPU, which scoring it as a CPU pod (the least
// idle GPU node) would pick.
func TestDRAClaimScored(t *testing.T) {
	s := cluster.NewScope(t)
	installDRAClasses(t, s, false)
	s.AddNodes(fleet.Node{Name: "busy", CPU: "32", Memory: "128Gi", GPUs: 4, Model: "Tesla-T4", MemoryMiB: 15360, DRA: fakedra.HAMi},
		fleet.Node{Name: "small", CPU: "32", Memory: "128Gi", GPUs: 1, Model: "Tesla-T4", MemoryMiB: 15360, DRA: fakedra.HAMi})
	outsideClaim(t, s, "used", fakedra.HAMi, s.Node("busy"), map[resourceapi.QualifiedName]resource.Quantity{
		"cores": resource.MustParse("50"), "memory": resource.MustParse("6Gi")}, "hami-gpu-0")
	s.Create(claimPod(t, s, "share", "30", "4Gi"))
	if n := s.WaitBound(bindTimeout, "share")["share"].Spec.NodeName; n != s.Node("busy") {
		t.Errorf("the share went to %s, not beside the other share on %s", n, s.Node("busy"))
	}
	if got := claimedDevices(t, s)[s.Node("busy")+"/hami-gpu-0"]; !slices.Contains(got, "share") {
		t.Errorf("the share is not beside the other: %v", claimedDevices(t, s))
	}
}
