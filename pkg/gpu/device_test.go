package gpu

import (
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// testAgent is a node agent for the domain's tests, with its own plain
// annotations (pkg/agent/hami tests HAMi's): devices
// "uuid:MiB:cores:slots[:sick|:cordoned],...", a share "count:MiB:cores",
// and a pod's record "uuid:MiB:cores:slots,..." on the node named.
type testAgent struct{}

const (
	keyDevices = "test/devices"
	keyShare   = "test/share"
	keyUses    = "test/uses"
	keyUsesOn  = "test/uses-node"
	// keyUnregistered: the agent runs on the node and has not reported.
	keyUnregistered = "test/unregistered"
)

func (testAgent) AgentName() string { return "test" }

func (testAgent) Devices(n *v1.Node) ([]Device, AgentState) {
	v, ok := n.Annotations[keyDevices]
	if !ok {
		if _, ok := n.Annotations[keyUnregistered]; ok {
			return nil, Unregistered
		}
		return nil, NotServed
	}
	var out []Device
	for _, d := range strings.Split(v, ",") {
		f := strings.Split(d, ":")
		mem, _ := strconv.Atoi(f[1])
		cores, _ := strconv.Atoi(f[2])
		slots, _ := strconv.Atoi(f[3])
		dev := Device{UUID: f[0], Model: "T-" + f[1], MemoryMiB: int64(mem), Cores: int32(cores), Slots: int32(slots), Healthy: true}
		if len(f) > 4 {
			dev.Healthy, dev.Cordoned = f[4] != "sick", f[4] == "cordoned"
		}
		out = append(out, dev)
	}
	return out, Reported
}

func (testAgent) Share(p *v1.Pod) (int32, DeviceShare, bool, error) {
	v, ok := p.Annotations[keyShare]
	if !ok {
		return 0, DeviceShare{}, false, nil
	}
	var n, mem, cores int
	fmt.Sscanf(v, "%d:%d:%d", &n, &mem, &cores)
	return int32(n), DeviceShare{MemoryMiB: int64(mem), Cores: int32(cores)}, true, nil
}

func (testAgent) Pending(*v1.Pod) (string, time.Time, bool) { return "", time.Time{}, false }

func (testAgent) Uses(p *v1.Pod, node string) ([]DeviceUse, bool) {
	v, ok := p.Annotations[keyUses]
	if !ok || p.Annotations[keyUsesOn] != node {
		return nil, false
	}
	var out []DeviceUse
	for _, u := range strings.Split(v, ",") {
		f := strings.Split(u, ":")
		mem, _ := strconv.Atoi(f[1])
		cores, _ := strconv.Atoi(f[2])
		slots, _ := strconv.Atoi(f[3])
		out = append(out, DeviceUse{UUID: f[0], MemoryMiB: int64(mem), Cores: int32(cores), Slots: int32(slots)})
	}
	return out, true
}

var agentOpts = NodeOptions{ResourceNames: []v1.ResourceName{ResourceNvidiaGPU}, ProductLabel: LabelGPUProduct, MemoryLabel: LabelGPUMemory, Agent: testAgent{}}

func agentNode(name, devices string) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{keyDevices: devices}},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{ResourceNvidiaGPU: resource.MustParse("40")}}}
}

// agentPod is a bound pod asking for one device plugin slot (or gpus
// whole GPUs) with the given annotations.
func agentPod(name string, gpus int64, ann map[string]string) *v1.Pod {
	if gpus == 0 {
		gpus = 1
	}
	p := gpuPod(name, types.UID("uid-"+name), gpus, ann)
	p.Spec.NodeName = "n"
	return p
}

// Every dimension the agent enforces is exact: memory in MiB, cores, slots,
// exclusive whole GPUs, and health, cordon and identity.
func TestAgentFit(t *testing.T) {
	const devs = "A:80000:100:4,B:80000:100:4,C:80000:100:4:sick,D:80000:100:4:cordoned"
	share := func(count int32, mem int64, cores int32) Request {
		return Request{ShareCount: count, Share: DeviceShare{MemoryMiB: mem, Cores: cores}, NeedsDelivery: true}
	}
	tests := []struct {
		name     string
		held     []*v1.Pod
		req      Request
		want     Outcome
		wantMask string // devices the request may take
	}{
		{"idle", nil, Request{Milli: 500, Slot: true, NeedsDelivery: true}, Fits, "AB"},
		{"two halves fill the memory", []*v1.Pod{
			agentPod("h1", 0, map[string]string{keyUses: "A:40000:50:1", keyUsesOn: "n", AnnotationMilli: "500"}),
			agentPod("h2", 0, map[string]string{keyUses: "A:40000:50:1", keyUsesOn: "n", AnnotationMilli: "500"}),
		}, Request{Milli: 1, Slot: true, NeedsDelivery: true}, Fits, "B"},
		{"memory is exact", []*v1.Pod{agentPod("m", 0, map[string]string{keyShare: "1:60000:0", keyUses: "A:60000:0:1", keyUsesOn: "n"})},
			share(1, 20001, 0), Fits, "B"},
		{"memory to the MiB", []*v1.Pod{agentPod("m", 0, map[string]string{keyShare: "1:60000:0", keyUses: "A:60000:0:1", keyUsesOn: "n"})},
			share(1, 20000, 0), Fits, "AB"},
		{"cores are exact", []*v1.Pod{agentPod("c", 0, map[string]string{keyShare: "1:1000:60", keyUses: "A:1000:60:1", keyUsesOn: "n"})},
			share(1, 1000, 41), Fits, "B"},
		{"slots are exact", []*v1.Pod{
			agentPod("s1", 0, map[string]string{keyShare: "1:10:1", keyUses: "A:10:1:1", keyUsesOn: "n"}),
			agentPod("s2", 0, map[string]string{keyShare: "1:10:1", keyUses: "A:10:1:1", keyUsesOn: "n"}),
			agentPod("s3", 0, map[string]string{keyShare: "1:10:1", keyUses: "A:10:1:1", keyUsesOn: "n"}),
			agentPod("s4", 0, map[string]string{keyShare: "1:10:1", keyUses: "A:10:1:1", keyUsesOn: "n"}),
		}, share(1, 10, 1), Fits, "B"},
		{"whole GPUs are exclusive", []*v1.Pod{agentPod("t", 0, map[string]string{keyShare: "1:10:0", keyUses: "A:10:0:1", keyUsesOn: "n"})},
			Request{Count: 1}, Fits, "B"},
		{"no room for two whole", []*v1.Pod{agentPod("t", 0, map[string]string{keyShare: "1:10:0", keyUses: "A:10:0:1", keyUsesOn: "n"})},
			Request{Count: 2}, TooFewFreeDevices, "B"},
		{"three whole: two healthy devices", nil, Request{Count: 3}, TooFewDevices, ""},
		{"no cores left: a share without cores is refused", []*v1.Pod{agentPod("x", 0, map[string]string{keyShare: "1:1000:100", keyUses: "A:1000:100:1", keyUsesOn: "n"})},
			share(1, 1000, 0), Fits, "B"},
		{"larger than a device", nil, share(1, 80001, 0), ShareTooLarge, ""},
		{"uuid allowed", nil, Request{Count: 1, UUIDs: UUIDSelector{Use: []string{"B", "C"}}}, Fits, "B"},
		{"uuid excluded", nil, Request{Count: 1, UUIDs: UUIDSelector{NoUse: []string{"A"}}}, Fits, "B"},
		{"no allowed uuid", nil, Request{Count: 1, UUIDs: UUIDSelector{Use: []string{"C", "Z"}}}, DeviceNotAllowed, ""},
		{"model", nil, Request{Count: 1, Models: ModelSelector{Exact: []string{"T-1"}}}, ModelNotAllowed, ""},
		{"a share by annotation alone is not delivered", nil, Request{Milli: 500, NeedsDelivery: true}, NoShareDelivery, ""},
		{"unless accounting only", nil, Request{Milli: 500}, Fits, "AB"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTracker(agentOpts)
			st := tr.Compute(agentNode("n", devs), tc.held, 1<<20, 1<<20, "", false)
			if st.Overcommitted {
				t.Fatalf("overcommitted: %+v", st.agent)
			}
			out, _, _, mask := st.fit(&tc.req)
			var got string
			for i := 0; i < int(st.Count); i++ {
				if mask&(1<<uint(i)) != 0 {
					got += st.Devices[i].UUID
				}
			}
			if out != tc.want || (out == Fits || out == TooFewFreeDevices) && got != tc.wantMask {
				t.Errorf("got %v on %q, want %v on %q (free %v)", out, got, tc.want, tc.wantMask, st.Free[:st.Count])
			}
		})
	}
}

// Whatever sequence of requests is placed, no device ever holds more memory,
// cores or containers than it has, and a whole GPU is never shared.
func TestAgentPlacementNeverOvercommits(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	node := agentNode("n", "A:81920:100:4,B:81920:100:4,C:40960:100:3,D:81920:100:10")
	for round := 0; round < 200; round++ {
		tr := NewTracker(agentOpts)
		st := tr.Compute(node, nil, 1<<20, 1<<20, "", false)
		holders := map[int][]DeviceShare{}
		for k := 0; k < 30; k++ {
			var r Request
			switch rng.Intn(5) {
			case 0:
				r = Request{Count: int32(1 + rng.Intn(2))}
			case 1:
				r = Request{Milli: int32(1 + rng.Intn(999)), Slot: true}
			case 2:
				r = Request{MemoryMiB: int64(1 + rng.Intn(60000)), Slot: true}
			default:
				r = Request{ShareCount: int32(1 + rng.Intn(2)), Share: DeviceShare{MemoryMiB: int64(1 + rng.Intn(50000)), Cores: int32(rng.Intn(101))}}
			}
			r.NeedsDelivery = true
			p := Policies[rng.Intn(len(Policies))]
			c, _, ok := Evaluate(p, st, &r, nil)
			if !ok {
				continue
			}
			for _, i := range c.Devices() {
				holders[i] = append(holders[i], c.Share)
			}
			next := st.Clone()
			next.TakeChoice(c)
			if next.Overcommitted {
				t.Fatalf("round %d: %s placed %+v on %v and overcommitted the node", round, p, r, c.Devices())
			}
			st = next
		}
		for i, shs := range holders {
			d := &st.Devices[i]
			var mem int64
			var cores int32
			for _, sh := range shs {
				mem += sh.MemoryOn(d.MemoryMiB)
				cores += sh.Cores
				if sh.IsExclusive(d) && len(shs) > 1 {
					t.Fatalf("round %d: device %s shared by a whole GPU: %+v", round, d.UUID, shs)
				}
			}
			if mem > d.MemoryMiB || cores > d.Cores || int32(len(shs)) > d.Slots {
				t.Fatalf("round %d: device %s holds %d MiB, %d%% cores, %d containers: %+v", round, d.UUID, mem, cores, len(shs), shs)
			}
		}
	}
}

// An agent's record says which devices a pod holds; it counts as written
// where it agrees with the pod's request, and otherwise at no less than the
// request on each of its devices. A record cannot shrink what a pod holds,
// claim a device of another node, or claim a device for a pod that asks for
// none.
func TestAgentHolds(t *testing.T) {
	const devs = "A:80000:100:4,B:80000:100:4"
	tests := []struct {
		name string
		pod  *v1.Pod
		free [2]int32
	}{
		// Laid down, a request goes to the highest index: records on A
		// tell the two apart.
		{"agreeing record", agentPod("p", 0, map[string]string{AnnotationMilli: "500", keyUses: "A:40000:50:1", keyUsesOn: "n"}), [2]int32{500, 1000}},
		{"record shrunk: its device, at the request's size", agentPod("p", 0, map[string]string{AnnotationMilli: "500", keyUses: "A:1:1:1", keyUsesOn: "n"}), [2]int32{500, 1000}},
		{"record larger than the request: the record's size", agentPod("p", 0, map[string]string{AnnotationMilli: "500", keyUses: "A:60000:70:1", keyUsesOn: "n"}), [2]int32{250, 1000}},
		{"record for another node", agentPod("p", 0, map[string]string{AnnotationMilli: "500", keyUses: "A:40000:50:1", keyUsesOn: "m"}), [2]int32{1000, 500}},
		{"unknown device", agentPod("p", 0, map[string]string{AnnotationMilli: "500", keyUses: "Z:40000:50:1", keyUsesOn: "n"}), [2]int32{1000, 500}},
		{"whole GPU without a record", agentPod("p", 0, nil), [2]int32{1000, 0}},
		{"whole GPU with its record", agentPod("p", 0, map[string]string{keyUses: "A:80000:100:1", keyUsesOn: "n"}), [2]int32{0, 1000}},
		{"a record naming fewer devices than asked: the request, all of it", agentPod("p", 2, map[string]string{keyUses: "A:80000:100:1", keyUsesOn: "n"}), [2]int32{0, 0}},
		{"cpu pod with a record", func() *v1.Pod {
			p := agentPod("p", 0, map[string]string{keyUses: "A:80000:100:1", keyUsesOn: "n"})
			p.Spec.Containers[0].Resources = v1.ResourceRequirements{}
			return p
		}(), [2]int32{1000, 1000}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := NewTracker(agentOpts).Compute(agentNode("n", devs), []*v1.Pod{tc.pod}, 1<<20, 1<<20, "", false)
			if got := [2]int32{st.Free[0], st.Free[1]}; got != tc.free {
				t.Errorf("free %v, want %v", got, tc.free)
			}
		})
	}
}

// Another scheduler's pod whose record names the node's devices holds them
// before it is bound (HAMi's scheduler writes the record, then binds), once,
// and no longer than the window.
func TestAgentPending(t *testing.T) {
	tr := NewTracker(agentOpts)
	node := agentNode("n", "A:80000:100:4,B:80000:100:4")
	p := agentPod("hami", 0, map[string]string{keyUses: "A:80000:100:1", keyUsesOn: "n"})
	p.Spec.NodeName = ""
	free := func(pods ...*v1.Pod) [2]int32 {
		st := tr.Build(node, 1, pods, 1<<20, 1<<20)
		return [2]int32{st.Free[0], st.Free[1]}
	}
	if got := free(); got != [2]int32{1000, 1000} {
		t.Fatalf("before: %v", got)
	}
	window := 5 * time.Minute
	tr.SetPending(p, "n", time.Now().Add(window))
	if got := free(); got != [2]int32{0, 1000} {
		t.Errorf("in flight: %v", got)
	}
	bound := p.DeepCopy()
	bound.Spec.NodeName = "n"
	if got := free(bound); got != [2]int32{0, 1000} {
		t.Errorf("bound, before the event: counted twice? %v", got)
	}
	tr.SetPending(p, "", time.Time{})
	if got := free(); got != [2]int32{1000, 1000} {
		t.Errorf("forgotten: %v", got)
	}
	tr.SetPending(p, "n", time.Now().Add(-time.Second))
	if got := free(); got != [2]int32{1000, 1000} {
		t.Errorf("past the window: %v", got)
	}
	// Moved to another node: it holds nothing here any more.
	until := time.Now().Add(window)
	tr.SetPending(p, "n", until)
	tr.SetPending(p, "m", until)
	if got := free(); got != [2]int32{1000, 1000} || tr.PendingOn(p.UID, "m") == nil || tr.PendingOn(p.UID, "n") != nil {
		t.Errorf("moved: %v", got)
	}
	// A status update of a pending pod changes no state.
	tr.SetPending(p, "n", until)
	free()
	v := tr.slot("n", false).version.Load()
	again := p.DeepCopy()
	again.Status.Phase = v1.PodPending
	tr.SetPending(again, "n", until)
	if tr.slot("n", false).version.Load() != v || tr.Lookup("n", 1) == nil {
		t.Errorf("a no-op update invalidated the state")
	}
	// Gone from the informer (the alive hook): it holds nothing.
	tr.SetAlive(func(types.UID, string, Reservation) bool { return false })
	tr.SetPending(p, "n", until.Add(time.Second))
	if got := free(); got != [2]int32{1000, 1000} {
		t.Errorf("gone: %v", got)
	}
	tr.SetAlive(func(types.UID, string, Reservation) bool { return true })
	// A cached state expires with the window.
	tr.SetPending(p, "n", time.Now().Add(50*time.Millisecond))
	free()
	time.Sleep(100 * time.Millisecond)
	if st := tr.Lookup("n", 1); st != nil {
		t.Errorf("a state with an expired in-flight pod is still served: %v", st.Free[:2])
	}
}

// An agent reports every device; the ones that can take pods are the
// healthy, uncordoned ones: an idle node of them is allocated nothing.
func TestAgentUsable(t *testing.T) {
	st := NewTracker(agentOpts).Compute(agentNode("n", "A:80000:100:4,B:80000:100:4,C:80000:100:4:sick,D:80000:100:4:cordoned"), nil, 1<<20, 1<<20, "", false)
	if st.Count != 4 || st.Usable() != 2 || st.Idle() != 2000 {
		t.Errorf("count %d, usable %d, idle %d", st.Count, st.Usable(), st.Idle())
	}
	plain := NewTracker(DefaultNodeOptions).Compute(node("m", 3, 4, nil), nil, 0, 0, "", false)
	if plain.Usable() != 3 {
		t.Errorf("plain: usable %d", plain.Usable())
	}
}

// A node whose agent runs but has not reported its devices takes no GPU
// pod, whatever its allocatable says (those are the agent's slots), and
// says so; CPU-only pods still fit.
func TestAgentUnregistered(t *testing.T) {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{keyUnregistered: ""}},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{ResourceNvidiaGPU: resource.MustParse("40")}}}
	inv := ReadInventory(n, agentOpts)
	if !inv.Unregistered || inv.Count != 0 || !inv.Delivers() {
		t.Fatalf("inventory %+v", inv)
	}
	s := NewTracker(agentOpts).Compute(n, nil, 0, 0, "", false)
	for _, r := range []Request{{Count: 1}, {Milli: 500, Slot: true, NeedsDelivery: true}, {Milli: 500}} {
		if out, _, _ := s.Fit(&r); out != AgentUnregistered {
			t.Errorf("%+v: %v, want AgentUnregistered", r, out)
		}
		if out := s.Hosts(&r); out != AgentUnregistered {
			t.Errorf("%+v: hosts %v", r, out)
		}
	}
	if out, _, _ := s.Fit(&Request{CPU: 1000}); out != Fits {
		t.Errorf("CPU-only: %v", out)
	}
}
