package gpufit

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	fwk "k8s.io/kube-scheduler/framework"
	st "k8s.io/kubernetes/pkg/scheduler/testing"
	tk "k8s.io/kubernetes/test/utils/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/dra"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

func allocated(driver string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", UID: "c"}}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: "r", Driver: driver, Pool: "n", Device: "gpu-0"}}}}
	return c
}

func TestDRAHints(t *testing.T) {
	tCtx := tk.Init(t)
	e := newEnv(tCtx, t, nil, nil, nil)
	gpuPod := st.MakePod().Name("p").UID("p").Req(map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1"}).Obj()
	cpuPod := st.MakePod().Name("c").UID("c").Req(map[v1.ResourceName]string{v1.ResourceCPU: "1"}).Obj()
	ours := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: resourceapi.ResourceSliceSpec{Driver: dra.NVIDIA.Name, NodeName: ptr.To("n")}}
	changed := ours.DeepCopy()
	changed.Spec.Devices = []resourceapi.Device{{Name: "gpu-0"}}
	theirs := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: resourceapi.ResourceSliceSpec{Driver: "net.example.com", NodeName: ptr.To("n")}}
	free := allocated(dra.NVIDIA.Name).DeepCopy()
	free.Status.Allocation = nil
	for _, tc := range []struct {
		name     string
		slice    bool
		pod      *v1.Pod
		old, new interface{}
		want     fwk.QueueingHint
	}{
		{name: "our driver's slice", slice: true, pod: gpuPod, new: ours, want: fwk.Queue},
		{name: "our driver's slice, devices changed", slice: true, pod: gpuPod, old: ours, new: changed, want: fwk.Queue},
		{name: "our driver's slice, republished as it was", slice: true, pod: gpuPod, old: ours, new: ours.DeepCopy(), want: fwk.QueueSkip},
		{name: "another driver's slice", slice: true, pod: gpuPod, new: theirs, want: fwk.QueueSkip},
		{name: "a slice, a CPU pod", slice: true, pod: cpuPod, new: ours, want: fwk.QueueSkip},
		{name: "claim deallocated", pod: gpuPod, old: allocated(dra.NVIDIA.Name), new: free, want: fwk.Queue},
		{name: "claim deleted", pod: gpuPod, old: allocated(dra.HAMi.Name), want: fwk.Queue},
		{name: "claim deleted, final state unknown", pod: gpuPod, old: cache.DeletedFinalStateUnknown{Obj: allocated(dra.HAMi.Name)}, want: fwk.Queue},
		{name: "claim still allocated", pod: gpuPod, old: allocated(dra.NVIDIA.Name), new: allocated(dra.NVIDIA.Name), want: fwk.QueueSkip},
		{name: "claim allocated now", pod: gpuPod, old: free, new: allocated(dra.NVIDIA.Name), want: fwk.QueueSkip},
		{name: "another driver's claim", pod: gpuPod, old: allocated("net.example.com"), want: fwk.QueueSkip},
		{name: "a claim, a CPU pod", pod: cpuPod, old: allocated(dra.NVIDIA.Name), want: fwk.QueueSkip},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fn := e.pl.isSchedulableAfterClaimChange
			if tc.slice {
				fn = e.pl.isSchedulableAfterSliceChange
			}
			got, err := fn(tCtx.Logger(), tc.pod, tc.old, tc.new)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
