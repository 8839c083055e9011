package gpudra

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/dra"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fakedra"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/internal/shared"
)

// testHandle is the little of a framework handle the ordering reads.
type testHandle struct {
	fwk.Handle
	snap fwk.SharedLister
}

func (h *testHandle) SnapshotSharedLister() fwk.SharedLister                 { return h.snap }
func (h *testHandle) SharedInformerFactory() informers.SharedInformerFactory { return nil }

type lister []*resourceapi.ResourceSlice

func (l lister) ListWithDeviceTaintRules() ([]*resourceapi.ResourceSlice, error) { return l, nil }

func names(s *resourceapi.ResourceSlice) []string {
	var out []string
	for _, d := range s.Spec.Devices {
		out = append(out, d.Name)
	}
	return out
}

// The allocator is shown each node's GPUs of our drivers most used first
// (the slice it reads is a copy; the informer's is never written), other
// drivers' slices as they are, and a node with nothing used as it is.
func TestOrder(t *testing.T) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	idle := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "idle"}}
	h := &testHandle{snap: cache.NewSnapshot(nil, []*v1.Node{node, idle})}
	s := shared.For(h)
	defer shared.Forget(h)
	x, _, err := s.ClaimIndex(dra.DefaultDrivers)
	if err != nil {
		t.Fatal(err)
	}
	opts := gpu.DefaultNodeOptions
	opts.Claims = x
	if err := s.Configure(opts); err != nil {
		t.Fatal(err)
	}
	ours := fakedra.Slice("n", fakedra.HAMi, 3, 0, "Tesla-T4", 15360)
	quiet := fakedra.Slice("idle", fakedra.HAMi, 3, 0, "Tesla-T4", 15360)
	other := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "nic"}, Spec: resourceapi.ResourceSliceSpec{Driver: "net.example.com",
		Devices: []resourceapi.Device{{Name: "b"}, {Name: "a"}}}}
	x.SliceChanged(nil, ours)
	x.SliceChanged(nil, quiet)
	share := func(uid types.UID, dev, cores string) *resourceapi.ResourceClaim {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: string(uid), UID: uid}}
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "r", Driver: dra.HAMi.Name, Pool: "n", Device: dev,
			ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"cores": resource.MustParse(cores), "memory": resource.MustParse("1Gi")}}}}}
		return c
	}
	x.ClaimChanged(nil, share("a", "hami-gpu-2", "60"))
	x.ClaimChanged(nil, share("b", "hami-gpu-1", "20"))
	o := &ordered{inner: lister{ours, quiet, other}, s: s, h: h}
	got, err := o.ListWithDeviceTaintRules()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"hami-gpu-2", "hami-gpu-1", "hami-gpu-0"}; !slices.Equal(names(got[0]), want) {
		t.Errorf("n's devices shown %v, want %v (most used first)", names(got[0]), want)
	}
	if want := []string{"hami-gpu-0", "hami-gpu-1", "hami-gpu-2"}; !slices.Equal(names(ours), want) {
		t.Errorf("the informer's slice was written: %v", names(ours))
	}
	if got[1] != quiet || got[2] != other {
		t.Error("a slice with nothing to reorder, or of another driver, was copied")
	}
}

// DynamicResourcesArgs are read strictly, defaulted as upstream's.
func TestArgs(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		ok        bool
	}{
		{"none", "", true},
		{"timeout", `{"filterTimeout":"5s"}`, true},
		{"misspelt", `{"filterTimout":"5s"}`, false},
		{"miscased", `{"FilterTimeout":"5s"}`, false},
		{"other-kind", `{"kind":"GPUFitArgs"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var obj runtime.Object
			if tc.raw != "" {
				obj = &runtime.Unknown{Raw: []byte(tc.raw)}
			}
			a, err := argsFrom(obj)
			if (err == nil) != tc.ok {
				t.Fatalf("err %v, want ok=%v", err, tc.ok)
			}
			if err == nil && a.FilterTimeout == nil {
				t.Errorf("filterTimeout not defaulted: %+v", a)
			}
		})
	}
}
