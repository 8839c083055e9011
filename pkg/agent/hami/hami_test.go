package hami

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// The test vectors are those of the protocol doc (section 7), numbered as
// there: V1..V10.

const (
	uuid1 = "GPU-11111111-1111-1111-1111-111111111111"
	uuid2 = "GPU-22222222-2222-2222-2222-222222222222"
	// The doc's section 1 example: 2 x A100-SXM4-80GB, split 10.
	register1 = `[{"id":"GPU-11111111-1111-1111-1111-111111111111","count":10,"devmem":81920,"devcore":100,"type":"NVIDIA A100-SXM4-80GB","mode":"hami-core","health":true},{"id":"GPU-22222222-2222-2222-2222-222222222222","index":1,"count":10,"devmem":81920,"devcore":100,"type":"NVIDIA A100-SXM4-80GB","mode":"hami-core","health":true}]`
)

func TestV1RegisterJSON(t *testing.T) {
	got, err := ParseRegister(register1)
	if err != nil {
		t.Fatal(err)
	}
	a100 := Device{Count: 10, Devmem: 81920, Devcore: 100, Type: "NVIDIA A100-SXM4-80GB", Mode: ModeHAMiCore, Health: true}
	want := []Device{a100, a100}
	want[0].ID, want[1].ID, want[1].Index = uuid1, uuid2, 1
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want,+got):\n%s", diff)
	}
	// Every field is omitempty: no health means unhealthy.
	got, err = ParseRegister(`[{"id":"GPU-x","count":10,"devmem":40960,"devcore":100,"type":"NVIDIA-Tesla V100","mode":"hami-core"}]`)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Device{{ID: "GPU-x", Count: 10, Devmem: 40960, Devcore: 100, Type: "NVIDIA-Tesla V100", Mode: ModeHAMiCore}}, got); diff != "" {
		t.Errorf("(-want,+got):\n%s", diff)
	}
	for _, bad := range []string{`[{"id":1}]`, `[{"id":"x","devmem":3000000000}]`, `[`, `[{"id":"x","index":-1}]`} {
		if _, err := ParseRegister(bad); err == nil {
			t.Errorf("%s: want an error", bad)
		}
	}
	if ds, err := ParseRegister(`[]`); err != nil || len(ds) != 0 {
		t.Errorf("empty array: %v %v", ds, err)
	}
}

func TestV2RegisterLegacy(t *testing.T) {
	got, err := ParseRegister(`GPU-a,10,81920,100,NVIDIA A100-SXM4-80GB,0,true:GPU-b,10,81920,100,NVIDIA A100-SXM4-80GB,1,true,1,hami-core:`)
	if err != nil {
		t.Fatal(err)
	}
	want := []Device{
		{ID: "GPU-a", Count: 10, Devmem: 81920, Devcore: 100, Type: "NVIDIA A100-SXM4-80GB", Mode: ModeHAMiCore, Health: true},
		{ID: "GPU-b", Index: 1, Count: 10, Devmem: 81920, Devcore: 100, Type: "NVIDIA A100-SXM4-80GB", Numa: 1, Mode: ModeHAMiCore, Health: true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want,+got):\n%s", diff)
	}
	if _, err := ParseRegister(`GPU-a,10,81920,100,NVIDIA A100,0,true`); err == nil || err.Error() != "node annotation missing device separator" {
		t.Errorf("no separator: %v", err)
	}
	for _, bad := range []string{"GPU-a,10,81920:", "GPU-a,x,81920,100,T,0,true:", "GPU-a,10,81920,100,T,0,maybe:", "GPU-a,10,81920,100,T,0,true,-1,hami-core:", "nocomma:"} {
		if _, err := ParseRegister(bad); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

func container(res map[v1.ResourceName]string) *v1.Container {
	c := &v1.Container{Name: "c", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{}}}
	for k, v := range res {
		c.Resources.Limits[k] = resource.MustParse(v)
	}
	return c
}

func TestV3V4Requests(t *testing.T) {
	tests := []struct {
		res  map[v1.ResourceName]string
		want ContainerRequest
	}{
		{map[v1.ResourceName]string{ResourceGPU: "1"}, ContainerRequest{Nums: 1, Memreq: 0, MemPercentagereq: 100, Coresreq: 0}},
		{map[v1.ResourceName]string{ResourceGPU: "1", ResourceMemory: "20000", ResourceCores: "30"}, ContainerRequest{Nums: 1, Memreq: 20000, MemPercentagereq: 101, Coresreq: 30}},
		{map[v1.ResourceName]string{ResourceGPU: "2", ResourceMemoryPercent: "50"}, ContainerRequest{Nums: 2, Memreq: 0, MemPercentagereq: 50, Coresreq: 0}},
		{map[v1.ResourceName]string{ResourceGPU: "1", ResourceMemory: "20Gi"}, ContainerRequest{}},
		// Beyond the vectors: clamps, and what is ignored.
		{map[v1.ResourceName]string{ResourceGPU: "1", ResourceMemoryPercent: "150"}, ContainerRequest{Nums: 1, MemPercentagereq: 100}},
		{map[v1.ResourceName]string{ResourceGPU: "1", ResourceMemoryPercent: "0"}, ContainerRequest{Nums: 1, MemPercentagereq: 100}},
		{map[v1.ResourceName]string{ResourceGPU: "1", ResourceMemory: "8000", ResourceMemoryPercent: "50"}, ContainerRequest{Nums: 1, Memreq: 8000, MemPercentagereq: 50}},
		{map[v1.ResourceName]string{ResourceGPU: "1", ResourceCores: "250"}, ContainerRequest{Nums: 1, MemPercentagereq: 100, Coresreq: 100}},
		{map[v1.ResourceName]string{ResourceGPU: "1", ResourceCores: "5000000000"}, ContainerRequest{Nums: 1, MemPercentagereq: 100, Coresreq: 100}},
		// Not an int64: ignored, as HAMi does.
		{map[v1.ResourceName]string{ResourceGPU: "1", ResourceCores: "9223372036854775807"}, ContainerRequest{Nums: 1, MemPercentagereq: 100}},
		{map[v1.ResourceName]string{ResourceGPU: "500m"}, ContainerRequest{}},
		{map[v1.ResourceName]string{ResourceMemory: "20000"}, ContainerRequest{}},
	}
	for _, tc := range tests {
		if diff := cmp.Diff(tc.want, ParseContainerRequest(container(tc.res), Config{})); diff != "" {
			t.Errorf("%v (-want,+got):\n%s", tc.res, diff)
		}
	}
	// Limits before requests.
	c := container(map[v1.ResourceName]string{ResourceGPU: "1", ResourceMemory: "1000"})
	c.Resources.Requests = v1.ResourceList{ResourceMemory: resource.MustParse("2000")}
	if got := ParseContainerRequest(c, Config{}).Memreq; got != 1000 {
		t.Errorf("limits first: %d", got)
	}
	// V4: 50% of an 81920 MiB device, no cores: the entry ...,NVIDIA,40960,0:
	r := ParseContainerRequest(container(map[v1.ResourceName]string{ResourceGPU: "1", ResourceMemoryPercent: "50"}), Config{})
	entry := EncodeContainerDevices(ContainerDevices{{UUID: "GPU-x", Type: Family, Usedmem: r.MemoryOn(81920), Usedcores: r.Coresreq}})
	if entry != "GPU-x,NVIDIA,40960,0:" {
		t.Errorf("V4: %q", entry)
	}
	// A factor and a default from the plugin's config.
	if got := ParseContainerRequest(container(map[v1.ResourceName]string{ResourceGPU: "1"}), Config{DefaultMemory: 5000, DefaultCores: 10}); got != (ContainerRequest{Nums: 1, Memreq: 5000, MemPercentagereq: 101, Coresreq: 10}) {
		t.Errorf("defaults: %+v", got)
	}
	if got := ParseContainerRequest(container(map[v1.ResourceName]string{ResourceGPU: "1", ResourceMemory: "1000"}), Config{MemoryFactor: 4}).Memreq; got != 4000 {
		t.Errorf("factor: %d", got)
	}
}

func TestV5V6Encode(t *testing.T) {
	if got := EncodePodDevices(PodDevices{{{UUID: uuid1, Type: Family, Usedmem: 20000, Usedcores: 30}}}); got != uuid1+",NVIDIA,20000,30:;" {
		t.Errorf("V5 single: %q", got)
	}
	two := ContainerDevices{{UUID: "GPU-a", Type: Family, Usedmem: 20000, Usedcores: 30}, {UUID: "GPU-b", Type: Family, Usedmem: 20000, Usedcores: 30}}
	if got := EncodePodDevices(PodDevices{two}); got != "GPU-a,NVIDIA,20000,30:GPU-b,NVIDIA,20000,30:;" {
		t.Errorf("V5 two: %q", got)
	}
	v6 := PodDevices{{}, {{UUID: "GPU-a", Type: Family, Usedmem: 20000, Usedcores: 30}}, {{UUID: "GPU-b", Type: Family, Usedmem: 81920, Usedcores: 100}}}
	s := EncodePodDevices(v6)
	if s != ";GPU-a,NVIDIA,20000,30:;GPU-b,NVIDIA,81920,100:;" {
		t.Fatalf("V6: %q", s)
	}
	got, err := DecodePodDevices(s)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(append(v6, ContainerDevices{}), got); diff != "" {
		t.Errorf("V6 decodes to 4 segments (-want,+got):\n%s", diff)
	}
}

func TestV7Pop(t *testing.T) {
	s := ";GPU-a,NVIDIA,20000,30:;GPU-b,NVIDIA,81920,100:;"
	for i, want := range []struct{ uuid, rest string }{{"GPU-a", ";;GPU-b,NVIDIA,81920,100:;;"}, {"GPU-b", ";;;;;"}} {
		cd, rest, err := PopNextContainerDevices(s)
		if err != nil || len(cd) != 1 || cd[0].UUID != want.uuid || rest != want.rest {
			t.Fatalf("call %d: %v %q %v", i+1, cd, rest, err)
		}
		s = rest
	}
	if _, _, err := PopNextContainerDevices(s); err == nil {
		t.Errorf("nothing left: want an error")
	}
	if _, rest, _ := PopNextContainerDevices(uuid1 + ",NVIDIA,20000,30:;"); rest != ";;" {
		t.Errorf("V5 popped: %q", rest)
	}
}

func TestV8NodeLock(t *testing.T) {
	at := time.Date(2026, 8, 21, 10, 15, 30, 0, time.UTC)
	if v := NodeLockValue(at, "default", "pod-a"); v != "2026-08-21T10:15:30Z,default,pod-a" {
		t.Errorf("value: %q", v)
	}
	tm, ns, name, err := ParseNodeLock("2026-08-21T10:15:30Z,default,pod-a")
	if err != nil || !tm.Equal(at) || ns != "default" || name != "pod-a" {
		t.Errorf("owned: %v %q %q %v", tm, ns, name, err)
	}
	tm, ns, name, err = ParseNodeLock("2026-08-21T10:15:30Z")
	if err != nil || !tm.Equal(at) || ns != "" || name != "" {
		t.Errorf("legacy: %v %q %q %v", tm, ns, name, err)
	}
	if _, _, _, err := ParseNodeLock("2026-08-21T10:15:30Z,default"); err == nil || !strings.Contains(err.Error(), "expected 3 parts, got 2") {
		t.Errorf("two parts: %v", err)
	}
}

func TestV9Usage(t *testing.T) {
	pod := &v1.Pod{Spec: v1.PodSpec{InitContainers: []v1.Container{{Name: "i"}}, Containers: []v1.Container{{Name: "a"}, {Name: "b"}}}}
	pd := PodDevices{
		{{UUID: "GPU-a", Type: Family, Usedmem: 10000, Usedcores: 50}},
		{{UUID: "GPU-a", Type: Family, Usedmem: 20000, Usedcores: 30}},
		{{UUID: "GPU-a", Type: Family, Usedmem: 20000, Usedcores: 30}},
	}
	if diff := cmp.Diff(map[string]Usage{"GPU-a": {Mem: 40000, Cores: 60, Slots: 2}}, PodUsage(pod, pd)); diff != "" {
		t.Errorf("(-want,+got):\n%s", diff)
	}
	// Only an init container on a device: one slot, its peak.
	pd = PodDevices{{{UUID: "GPU-b", Type: Family, Usedmem: 7000, Usedcores: 10}}, {}, {}}
	if got := PodUsage(pod, pd)["GPU-b"]; got != (Usage{Mem: 7000, Cores: 10, Slots: 1}) {
		t.Errorf("init only: %+v", got)
	}
}

func TestV10Decode(t *testing.T) {
	if _, err := DecodeContainerDevices("GPU-a,NVIDIA,20000"); err == nil || !strings.Contains(err.Error(), "missing fields") {
		t.Errorf("three fields: %v", err)
	}
	got, err := DecodePodDevices("GPU-a,NVIDIA,20000,30,x:;")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(PodDevices{{{UUID: "GPU-a", Type: Family, Usedmem: 20000, Usedcores: 30}}, {}}, got); diff != "" {
		t.Errorf("(-want,+got):\n%s", diff)
	}
	for _, bad := range []string{"GPU-a,NVIDIA,x,30:", "GPU-a,NVIDIA,20000,3000000000:"} {
		if _, err := DecodePodDevices(bad); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

// The decoders take anything without panicking, and what they accept
// encodes back to something they read the same way.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{register1, "GPU-a,10,81920,100,T,0,true:", ";GPU-a,NVIDIA,20000,30:;GPU-b,NVIDIA,81920,100:;",
		"2026-08-21T10:15:30Z,default,pod-a", "GPU-a,NVIDIA,20000,30,x:;", "[]", ":;,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ParseRegister(s)
		ParseNodeLock(s)
		Cordoned(s)
		pd, err := DecodePodDevices(s)
		if err != nil {
			return
		}
		again, err := DecodePodDevices(EncodePodDevices(pd))
		if err != nil {
			t.Fatalf("re-decoding %q: %v", EncodePodDevices(pd), err)
		}
		// Encoding ends every container with ';': one more empty entry.
		if len(again) != len(pd)+1 || !cmp.Equal(again[:len(pd)], pd, cmp.Comparer(func(a, b ContainerDevices) bool {
			return len(a) == len(b) && (len(a) == 0 || cmp.Equal([]ContainerDevice(a), []ContainerDevice(b)))
		})) {
			t.Fatalf("%q decodes to %v, re-encoded to %v", s, pd, again)
		}
		if _, rest, err := PopNextContainerDevices(s); err == nil {
			if _, err := DecodePodDevices(rest); err != nil {
				t.Fatalf("popped %q leaves %q: %v", s, rest, err)
			}
		}
	})
}
