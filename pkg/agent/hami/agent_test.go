package hami

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

func hamiNode(register string, slots string, ann map[string]string) *v1.Node {
	a := map[string]string{AnnotationRegister: register}
	for k, v := range ann {
		a[k] = v
	}
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-1", Annotations: a, Labels: map[string]string{}},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{ResourceGPU: resource.MustParse(slots)}}}
}

func TestAgentDevices(t *testing.T) {
	a := Agent{ProductLabel: gpu.LabelGPUProduct}
	// Out of index order, a duplicate, and a MIG device.
	reg := `[{"id":"GPU-b","index":1,"count":10,"devmem":81920,"devcore":100,"type":"NVIDIA A100","mode":"hami-core","health":true},` +
		`{"id":"GPU-a","count":10,"devmem":81920,"devcore":100,"type":"NVIDIA A100","mode":"hami-core","health":true},` +
		`{"id":"GPU-a","index":5,"count":10,"devmem":1,"devcore":100,"type":"NVIDIA A100","mode":"hami-core","health":true},` +
		`{"id":"GPU-m","index":2,"count":7,"devmem":81920,"devcore":100,"type":"NVIDIA A100","mode":"mig","health":true}]`
	got, st := a.Devices(hamiNode(reg, "20", map[string]string{AnnotationCordon: " GPU-b ,"}))
	want := []gpu.Device{
		{UUID: "GPU-a", Model: "NVIDIA A100", Type: "NVIDIA A100", MemoryMiB: 81920, Cores: 100, Slots: 10, Healthy: true},
		{UUID: "GPU-b", Model: "NVIDIA A100", Type: "NVIDIA A100", MemoryMiB: 81920, Cores: 100, Slots: 10, Healthy: true, Cordoned: true},
	}
	if st != gpu.Reported || !cmp.Equal(want, got, cmp.AllowUnexported(gpu.Device{})) {
		t.Errorf("devices %v %+v", st, got)
	}
	// No allocatable slot: the plugin's devices are not usable.
	got, _ = a.Devices(hamiNode(reg, "0", nil))
	if got[0].Healthy || got[1].Healthy {
		t.Errorf("allocatable 0: %+v", got)
	}
	// GFD's product label names the model, for exact model constraints.
	n := hamiNode(reg, "20", nil)
	n.Labels[gpu.LabelGPUProduct] = "NVIDIA-A100-SXM4-80GB"
	if got, _ = a.Devices(n); got[0].Model != "NVIDIA-A100-SXM4-80GB" {
		t.Errorf("model %q", got[0].Model)
	}
	// Unreadable: served, with no device (never allocatable's slots).
	if got, st = a.Devices(hamiNode("[{", "20", nil)); st != gpu.Reported || got == nil || len(got) != 0 {
		t.Errorf("unreadable: %v %v", st, got)
	}
	if _, st = a.Devices(&v1.Node{}); st != gpu.NotServed {
		t.Errorf("a node without the registration is not HAMi's: %v", st)
	}
}

// A node whose HAMi plugin runs but has not registered its GPUs is told
// from a plain node by more slots than GPU Feature Discovery counts GPUs
// (times NVIDIA's own time-slicing replicas); HAMi's handshake, which its
// scheduler leaves on plain nodes too, is no sign.
func TestAgentUnregistered(t *testing.T) {
	node := func(slots string, labels, ann map[string]string) *v1.Node {
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: labels, Annotations: ann},
			Status: v1.NodeStatus{Allocatable: v1.ResourceList{ResourceGPU: resource.MustParse(slots)}}}
	}
	for _, tc := range []struct {
		name string
		n    *v1.Node
		want gpu.AgentState
	}{
		{"plain, GFD", node("4", map[string]string{gpu.LabelGPUCount: "4"}, nil), gpu.NotServed},
		{"plain, no GFD", node("4", nil, nil), gpu.NotServed},
		{"slots before the registration", node("40", map[string]string{gpu.LabelGPUCount: "4"}, nil), gpu.Unregistered},
		{"NVIDIA time-slicing", node("40", map[string]string{gpu.LabelGPUCount: "4", gpu.LabelGPUReplicas: "10"}, nil), gpu.NotServed},
		{"more than time-slicing's", node("80", map[string]string{gpu.LabelGPUCount: "4", gpu.LabelGPUReplicas: "10"}, nil), gpu.Unregistered},
		{"HAMi's handshake on a plain node", node("4", map[string]string{gpu.LabelGPUCount: "4"}, map[string]string{AnnotationHandshake: "Requesting_2026-12-01 10:00:00"}), gpu.NotServed},
		{"registered", node("40", map[string]string{gpu.LabelGPUCount: "4"}, map[string]string{AnnotationRegister: `[{"id":"GPU-a","count":10,"devmem":1,"devcore":100,"health":true}]`}), gpu.Reported},
	} {
		if _, st := (Agent{}).Devices(tc.n); st != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, st, tc.want)
		}
	}
}

func podWith(containers ...v1.Container) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}, Spec: v1.PodSpec{Containers: containers}}
}

func ctr(name string, res map[v1.ResourceName]string) v1.Container {
	c := container(res)
	c.Name = name
	return *c
}

func TestAgentShare(t *testing.T) {
	a := Agent{}
	tests := []struct {
		name  string
		pod   *v1.Pod
		n     int32
		share gpu.DeviceShare
		ok    bool
		err   string
	}{
		{"gpu alone is not the dialect", podWith(ctr("c", map[v1.ResourceName]string{ResourceGPU: "2"})), 0, gpu.DeviceShare{}, false, ""},
		{"memory: no core limit", podWith(ctr("c", map[v1.ResourceName]string{ResourceGPU: "1", ResourceMemory: "20000"})), 1, gpu.DeviceShare{MemoryMiB: 20000}, true, ""},
		{"memory and cores", podWith(ctr("c", map[v1.ResourceName]string{ResourceGPU: "1", ResourceMemory: "20000", ResourceCores: "30"})), 1, gpu.DeviceShare{MemoryMiB: 20000, Cores: 30}, true, ""},
		{"percent", podWith(ctr("c", map[v1.ResourceName]string{ResourceGPU: "2", ResourceMemoryPercent: "50"})), 2, gpu.DeviceShare{Permille: 500}, true, ""},
		// The webhook's default: all the memory without cores is exclusive.
		{"100 percent", podWith(ctr("c", map[v1.ResourceName]string{ResourceGPU: "1", ResourceMemoryPercent: "100"})), 1, gpu.Exclusive, true, ""},
		{"cores only: all the memory", podWith(ctr("c", map[v1.ResourceName]string{ResourceGPU: "1", ResourceCores: "30"})), 1, gpu.DeviceShare{Permille: 1000, Cores: 30}, true, ""},
		{"memory as a quantity", podWith(ctr("c", map[v1.ResourceName]string{ResourceGPU: "1", ResourceMemory: "20Gi"})), 0, gpu.DeviceShare{}, false, "plain number of MiB"},
		{"memory without a device", podWith(ctr("c", map[v1.ResourceName]string{ResourceMemory: "20000"})), 0, gpu.DeviceShare{}, false, "plain number of MiB"},
		{"a share and another GPU container", podWith(ctr("a", map[v1.ResourceName]string{ResourceGPU: "1", ResourceMemory: "1000"}), ctr("b", map[v1.ResourceName]string{ResourceGPU: "1"})),
			0, gpu.DeviceShare{}, false, "one container"},
		{"two containers", podWith(ctr("a", map[v1.ResourceName]string{ResourceGPU: "1", ResourceMemory: "1000"}), ctr("b", map[v1.ResourceName]string{ResourceGPU: "1", ResourceMemory: "1000"})),
			0, gpu.DeviceShare{}, false, "one container"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, sh, ok, err := a.Share(tc.pod)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("want an error with %q, got %v", tc.err, err)
				}
				return
			}
			if err != nil || n != tc.n || sh != tc.share || ok != tc.ok {
				t.Errorf("got %d %+v %v %v", n, sh, ok, err)
			}
		})
	}
	// Through the domain: HAMi's exclusive default is whole GPUs.
	r, err := gpu.ParseRequest(podWith(ctr("c", map[v1.ResourceName]string{ResourceGPU: "1", ResourceMemoryPercent: "100"})), gpu.RequestOptions{ResourceNames: []v1.ResourceName{ResourceGPU}, Agent: a})
	if err != nil || r.Count != 1 || r.Shared() {
		t.Errorf("100%%: %+v %v", r, err)
	}
}

// The record is HAMi's accounting: the allocated list on the node the
// annotation names, collapsed per GPU.
func TestAgentUses(t *testing.T) {
	a := Agent{}
	pod := podWith(ctr("a", nil), ctr("b", nil))
	pod.Annotations = map[string]string{AnnotationVGPUNode: "n", AnnotationAllocated: "GPU-a,NVIDIA,20000,30:;GPU-a,NVIDIA,1000,10:GPU-b,NVIDIA,5,0:;",
		AnnotationToAllocate: ";;;"}
	got, ok := a.Uses(pod, "n")
	want := []gpu.DeviceUse{{UUID: "GPU-a", MemoryMiB: 21000, Cores: 40, Slots: 2}, {UUID: "GPU-b", MemoryMiB: 5, Slots: 1}}
	if !ok || !cmp.Equal(want, got) {
		t.Errorf("%v %+v", ok, got)
	}
	if _, ok := a.Uses(pod, "m"); ok {
		t.Errorf("another node's record counted")
	}
	pod.Annotations[AnnotationAllocated] = "GPU-a,NVIDIA,x,1:;"
	if _, ok := a.Uses(pod, "n"); ok {
		t.Errorf("an unreadable record counted")
	}
}

// Each container that asks the plugin for GPUs gets its devices, in
// container order, init containers first; the others an empty entry.
func TestAllocation(t *testing.T) {
	pod := podWith(ctr("side", nil), ctr("main", map[v1.ResourceName]string{ResourceGPU: "2"}))
	pod.Spec.InitContainers = []v1.Container{ctr("init", map[v1.ResourceName]string{ResourceGPU: "1"})}
	devs := []gpu.Device{{UUID: "GPU-a", MemoryMiB: 81920}, {UUID: "GPU-b", MemoryMiB: 40960}, {UUID: "GPU-c", MemoryMiB: 40960}}
	pd, err := Allocation(pod, devs[:2], gpu.DeviceShare{Permille: 500, Cores: 50})
	if want := "GPU-a,NVIDIA,40960,50:;;GPU-a,NVIDIA,40960,50:GPU-b,NVIDIA,20480,50:;"; err != nil || EncodePodDevices(pd) != want {
		t.Errorf("got  %s %v\nwant %s", EncodePodDevices(pd), err, want)
	}
	// A sidecar runs beside the app containers and the init containers
	// after it: devices of its own (the effective request counts it).
	always := v1.ContainerRestartPolicyAlways
	side := ctr("side", map[v1.ResourceName]string{ResourceGPU: "1"})
	side.RestartPolicy = &always
	pod.Spec.InitContainers = []v1.Container{side, ctr("init", map[v1.ResourceName]string{ResourceGPU: "2"})}
	pd, err = Allocation(pod, devs, gpu.Exclusive)
	if want := "GPU-a,NVIDIA,81920,100:;GPU-b,NVIDIA,40960,100:GPU-c,NVIDIA,40960,100:;;GPU-b,NVIDIA,40960,100:GPU-c,NVIDIA,40960,100:;"; err != nil || EncodePodDevices(pd) != want {
		t.Errorf("sidecar: got  %s %v\nwant %s", EncodePodDevices(pd), err, want)
	}
	// Fewer devices than the containers ask for: an error, never a wrap.
	if _, err := Allocation(pod, devs[:2], gpu.Exclusive); err == nil {
		t.Errorf("want an error when the devices run out")
	}
	at := time.Unix(1787307330, 0)
	one, _ := Allocation(podWith(ctr("c", map[v1.ResourceName]string{ResourceGPU: "1"})), devs[:1], gpu.Exclusive)
	ann := BindAnnotations("gpu-node-1", one, at)
	want := map[string]string{AnnotationVGPUNode: "gpu-node-1", AnnotationVGPUTime: "1787307330", AnnotationBindTime: "1787307330", AnnotationBindPhase: BindAllocating,
		AnnotationToAllocate: "GPU-a,NVIDIA,81920,100:;", AnnotationAllocated: "GPU-a,NVIDIA,81920,100:;"}
	if diff := cmp.Diff(want, ann); diff != "" {
		t.Errorf("(-want,+got):\n%s", diff)
	}
}

func TestNodeLock(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}})
	now := time.Date(2026, 8, 21, 10, 15, 30, 0, time.UTC)
	alive := func(context.Context, string, string, time.Time) (bool, error) { return false, nil }
	gone := func(context.Context, string, string, time.Time) (bool, error) { return true, nil }
	lock := func() string {
		n, _ := client.CoreV1().Nodes().Get(ctx, "n", metav1.GetOptions{})
		return n.Annotations[AnnotationNodeLock]
	}
	va, err := LockNode(ctx, client, "n", "ns", "a", now, NodeLockTimeout, alive, nil)
	if err != nil || lock() != "2026-08-21T10:15:30Z,ns,a" || va != lock() {
		t.Fatalf("take: %v %q %q", err, va, lock())
	}
	// The pod's earlier attempt: taken again, with a new value.
	va2, err := LockNode(ctx, client, "n", "ns", "a", now.Add(time.Second), NodeLockTimeout, alive, nil)
	if err != nil || va2 != lock() || va2 == va || !strings.HasSuffix(va2, ",ns,a") {
		t.Errorf("ours already: %v %q", err, va2)
	}
	// The earlier attempt's cleanup leaves it alone.
	if err := ReleaseNodeLock(ctx, client, "n", va); err != nil || lock() != va2 {
		t.Errorf("an earlier attempt released the new hold: %v %q", err, lock())
	}
	// Even within the same instant.
	va3, err := LockNode(ctx, client, "n", "ns", "a", now.Add(time.Second), NodeLockTimeout, alive, nil)
	if err != nil || va3 == va2 || va3 != lock() {
		t.Errorf("retaken in the same instant: %v %q %q", err, va3, va2)
	}
	if err := ReleaseNodeLock(ctx, client, "n", va2); err != nil || lock() != va3 {
		t.Errorf("an earlier attempt in the same instant released the new hold: %v %q", err, lock())
	}
	va = va3
	var locked *ErrLocked
	if _, err := LockNode(ctx, client, "n", "ns", "b", now.Add(time.Minute), NodeLockTimeout, alive, nil); !errors.As(err, &locked) || locked.Holder != "ns/a" {
		t.Errorf("contention: %v", err)
	}
	// Only that hold is released: not another pod's, not a later one.
	if err := ReleaseNodeLock(ctx, client, "n", "2026-08-21T10:15:32Z,ns,a"); err != nil || lock() != va {
		t.Errorf("released another hold: %v %q", err, lock())
	}
	// A holder that is gone, or a lock past its expiry, is taken over; the
	// value is known before it is written.
	var written string
	vb, err := LockNode(ctx, client, "n", "ns", "b", now.Add(time.Minute), NodeLockTimeout, gone, func(v string) { written = v })
	if err != nil || vb != lock() || written != vb || !strings.HasSuffix(vb, ",ns,b") {
		t.Errorf("holder gone: %v %q %q", err, vb, lock())
	}
	vc, err := LockNode(ctx, client, "n", "ns", "c", now.Add(7*time.Minute), NodeLockTimeout, alive, nil)
	if err != nil || !strings.HasSuffix(lock(), ",ns,c") {
		t.Errorf("expired: %v %q", err, lock())
	}
	if err := ReleaseNodeLock(ctx, client, "n", vc); err != nil || lock() != "" {
		t.Errorf("release: %v %q", err, lock())
	}
	// A malformed lock blocks the node, as it blocks HAMi's scheduler.
	n, _ := client.CoreV1().Nodes().Get(ctx, "n", metav1.GetOptions{})
	n.Annotations = map[string]string{AnnotationNodeLock: "yesterday,x"}
	client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	if _, err := LockNode(ctx, client, "n", "ns", "d", now, NodeLockTimeout, gone, nil); err == nil || errors.As(err, &locked) {
		t.Errorf("malformed: %v", err)
	}
}
