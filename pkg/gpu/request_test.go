package gpu

import (
	"errors"
	"math"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func pod(ann map[string]string, gpus int64, cpu string) *v1.Pod {
	c := v1.Container{Name: "c", Resources: v1.ResourceRequirements{Requests: v1.ResourceList{}, Limits: v1.ResourceList{}}}
	if cpu != "" {
		c.Resources.Requests[v1.ResourceCPU] = resource.MustParse(cpu)
	}
	if gpus > 0 {
		q := *resource.NewQuantity(gpus, resource.DecimalSI)
		c.Resources.Requests[ResourceNvidiaGPU] = q
		c.Resources.Limits[ResourceNvidiaGPU] = q
	}
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "uid-p", Annotations: ann}, Spec: v1.PodSpec{Containers: []v1.Container{c}}}
}

func TestParseRequest(t *testing.T) {
	tests := map[string]struct {
		ann  map[string]string
		gpus int64
		cpu  string
		want Request
	}{
		"cpu only":         {cpu: "4", want: Request{CPU: 4000}},
		"whole gpus":       {gpus: 2, cpu: "500m", want: Request{Count: 2, CPU: 500}},
		"milli":            {ann: map[string]string{AnnotationMilli: "500"}, want: Request{Milli: 500}},
		"milli spaces":     {ann: map[string]string{AnnotationMilli: " 250 "}, want: Request{Milli: 250}},
		"kai fraction":     {ann: map[string]string{AnnotationKAIFraction: "0.25"}, want: Request{Milli: 250}},
		"kai fraction one": {ann: map[string]string{AnnotationKAIFraction: "0.5", AnnotationKAIFractionNumDevices: "1"}, want: Request{Milli: 500}},
		"memory mib":       {ann: map[string]string{AnnotationMemory: "8192"}, want: Request{MemoryMiB: 8192}},
		"memory quantity":  {ann: map[string]string{AnnotationMemory: "8Gi"}, want: Request{MemoryMiB: 8192}},
		"kai memory":       {ann: map[string]string{AnnotationKAIMemory: "1000"}, want: Request{MemoryMiB: 1000}},
		// With one slot of the device plugin: a share it is asked to deliver.
		"fraction with one gpu": {ann: map[string]string{AnnotationKAIFraction: "0.5"}, gpus: 1, want: Request{Milli: 500, Slot: true}},
		"memory with one gpu":   {ann: map[string]string{AnnotationMemory: "8Gi"}, gpus: 1, want: Request{MemoryMiB: 8192, Slot: true}},
		"uuids": {ann: map[string]string{AnnotationHAMiUseUUID: "GPU-a, GPU-b", AnnotationHAMiNoUseUUID: "GPU-c"}, gpus: 1,
			want: Request{Count: 1, UUIDs: UUIDSelector{Use: []string{"GPU-a", "GPU-b"}, NoUse: []string{"GPU-c"}}}},
		"model exact": {ann: map[string]string{AnnotationModel: "A100-SXM4-80GB| H100-80GB-HBM3"}, gpus: 1,
			want: Request{Count: 1, Models: ModelSelector{Exact: []string{"A100-SXM4-80GB", "H100-80GB-HBM3"}}}},
		"hami types": {ann: map[string]string{AnnotationHAMiUseType: "a100,h100", AnnotationHAMiNoUseType: "mig"}, gpus: 1,
			want: Request{Count: 1, Models: ModelSelector{Include: []string{"A100", "H100"}, Exclude: []string{"MIG"}}}},
		"exclusion with our model": {ann: map[string]string{AnnotationModel: "T4", AnnotationHAMiNoUseType: "x"}, gpus: 1,
			want: Request{Count: 1, Models: ModelSelector{Exact: []string{"T4"}, Exclude: []string{"X"}}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseRequest(pod(tc.ann, tc.gpus, tc.cpu), DefaultRequestOptions)
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("request (-want,+got):\n%s", diff)
			}
		})
	}
}

// Every invalid input names the key and the rule it broke.
func TestParseRequestInvalid(t *testing.T) {
	tests := map[string]struct {
		ann      map[string]string
		gpus     int64
		wantKey  string
		wantRule string
	}{
		"milli not a number":     {ann: map[string]string{AnnotationMilli: "half"}, wantKey: AnnotationMilli, wantRule: "integer from 1 to 999"},
		"milli zero":             {ann: map[string]string{AnnotationMilli: "0"}, wantKey: AnnotationMilli, wantRule: "integer from 1 to 999"},
		"milli negative":         {ann: map[string]string{AnnotationMilli: "-5"}, wantKey: AnnotationMilli, wantRule: "integer from 1 to 999"},
		"milli whole":            {ann: map[string]string{AnnotationMilli: "1000"}, wantKey: AnnotationMilli, wantRule: "use nvidia.com/gpu for whole GPUs"},
		"milli decimal":          {ann: map[string]string{AnnotationMilli: "2.5"}, wantKey: AnnotationMilli, wantRule: "integer"},
		"milli empty":            {ann: map[string]string{AnnotationMilli: ""}, wantKey: AnnotationMilli, wantRule: "integer"},
		"fraction not a number":  {ann: map[string]string{AnnotationKAIFraction: "quarter"}, wantKey: AnnotationKAIFraction, wantRule: "decimal fraction"},
		"fraction one":           {ann: map[string]string{AnnotationKAIFraction: "1"}, wantKey: AnnotationKAIFraction, wantRule: "less than 1"},
		"fraction zero":          {ann: map[string]string{AnnotationKAIFraction: "0"}, wantKey: AnnotationKAIFraction, wantRule: "greater than 0"},
		"fraction nan":           {ann: map[string]string{AnnotationKAIFraction: "NaN"}, wantKey: AnnotationKAIFraction, wantRule: "decimal fraction"},
		"fraction rounds to 0":   {ann: map[string]string{AnnotationKAIFraction: "0.0001"}, wantKey: AnnotationKAIFraction, wantRule: "rounds to 0"},
		"fraction rounds to 1k":  {ann: map[string]string{AnnotationKAIFraction: "0.9999"}, wantKey: AnnotationKAIFraction, wantRule: "rounds to 1000"},
		"memory zero":            {ann: map[string]string{AnnotationMemory: "0"}, wantKey: AnnotationMemory, wantRule: "positive amount"},
		"memory garbage":         {ann: map[string]string{AnnotationMemory: "lots"}, wantKey: AnnotationMemory, wantRule: "positive amount"},
		"memory negative qty":    {ann: map[string]string{AnnotationMemory: "-1Gi"}, wantKey: AnnotationMemory, wantRule: "positive amount"},
		"milli and fraction":     {ann: map[string]string{AnnotationMilli: "500", AnnotationKAIFraction: "0.5"}, wantKey: AnnotationKAIFraction, wantRule: "conflicts with " + AnnotationMilli},
		"milli and memory":       {ann: map[string]string{AnnotationMilli: "500", AnnotationMemory: "4096"}, wantKey: AnnotationMemory, wantRule: "set only one shared-GPU request"},
		"fraction and kai mem":   {ann: map[string]string{AnnotationKAIFraction: "0.5", AnnotationKAIMemory: "10"}, wantKey: AnnotationKAIMemory, wantRule: "conflicts with gpu-fraction"},
		"milli with whole gpus":  {ann: map[string]string{AnnotationMilli: "500"}, gpus: 2, wantKey: AnnotationMilli, wantRule: "request nvidia.com/gpu: 1 (delivered by a device plugin that enforces shares) or none (accounting only), not 2"},
		"num devices two":        {ann: map[string]string{AnnotationKAIFraction: "0.5", AnnotationKAIFractionNumDevices: "2"}, wantKey: AnnotationKAIFractionNumDevices, wantRule: "not supported"},
		"num devices garbage":    {ann: map[string]string{AnnotationKAIFraction: "0.5", AnnotationKAIFractionNumDevices: "x"}, wantKey: AnnotationKAIFractionNumDevices, wantRule: "positive integer"},
		"num devices alone":      {ann: map[string]string{AnnotationKAIFractionNumDevices: "1"}, wantKey: AnnotationKAIFractionNumDevices, wantRule: "needs gpu-fraction"},
		"num devices with milli": {ann: map[string]string{AnnotationMilli: "100", AnnotationKAIFractionNumDevices: "1"}, wantKey: AnnotationKAIFractionNumDevices, wantRule: "needs gpu-fraction"},
		"model empty":            {ann: map[string]string{AnnotationModel: " | "}, gpus: 1, wantKey: AnnotationModel, wantRule: "at least one GPU model"},
		"model and hami":         {ann: map[string]string{AnnotationModel: "T4", AnnotationHAMiUseType: "T4"}, gpus: 1, wantKey: AnnotationModel, wantRule: "use one model selector"},
		"hami empty":             {ann: map[string]string{AnnotationHAMiUseType: ","}, gpus: 1, wantKey: AnnotationHAMiUseType, wantRule: "at least one GPU type"},
		"hami exclude empty":     {ann: map[string]string{AnnotationHAMiNoUseType: " "}, gpus: 1, wantKey: AnnotationHAMiNoUseType, wantRule: "at least one GPU type"},
		"model without gpu":      {ann: map[string]string{AnnotationModel: "T4"}, wantKey: AnnotationModel, wantRule: "needs a GPU request"},
		"exclude without gpu":    {ann: map[string]string{AnnotationHAMiNoUseType: "T4"}, wantKey: AnnotationHAMiNoUseType, wantRule: "needs a GPU request"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := ParseRequest(pod(tc.ann, tc.gpus, ""), DefaultRequestOptions)
			var inv *InvalidError
			if !errors.As(err, &inv) {
				t.Fatalf("want *InvalidError, got %v", err)
			}
			if inv.Key != tc.wantKey {
				t.Errorf("key: want %q, got %q", tc.wantKey, inv.Key)
			}
			if !strings.Contains(err.Error(), tc.wantRule) || !strings.Contains(err.Error(), tc.wantKey) {
				t.Errorf("message %q does not name %q and %q", err.Error(), tc.wantKey, tc.wantRule)
			}
		})
	}
}

func TestPodRequestCountsInitAndSidecars(t *testing.T) {
	always := v1.ContainerRestartPolicyAlways
	cpu := func(s string) v1.ResourceRequirements {
		return v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse(s)}}
	}
	p := &v1.Pod{Spec: v1.PodSpec{
		InitContainers: []v1.Container{
			{Name: "init-big", Resources: cpu("3")},
			{Name: "sidecar", Resources: cpu("500m"), RestartPolicy: &always},
			{Name: "init-after-sidecar", Resources: cpu("2")},
		},
		Containers: []v1.Container{{Name: "a", Resources: cpu("1")}, {Name: "b", Resources: cpu("1")}},
		Overhead:   v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m")},
	}}
	// max(2000+500, 3000, 2000+500) + 100 overhead
	if got := podRequest(p, v1.ResourceCPU, true); got != 3100 {
		t.Errorf("cpu: want 3100, got %d", got)
	}
}

func TestPerDevice(t *testing.T) {
	tests := []struct {
		req         Request
		nodeMem     int64
		wantDevices int32
		wantMilli   int32
		want        Outcome
	}{
		{Request{Count: 4}, 0, 4, 1000, Fits},
		{Request{Milli: 300}, 0, 1, 300, Fits},
		{Request{MemoryMiB: 20480}, 81920, 1, 250, Fits},
		{Request{MemoryMiB: 1}, 81920, 1, 1, Fits},        // rounds up
		{Request{MemoryMiB: 81920}, 81920, 1, 1000, Fits}, // the whole device
		{Request{MemoryMiB: 81921}, 81920, 1, 0, ShareTooLarge},
		{Request{MemoryMiB: 100}, 0, 1, 0, MemoryUnknown},
		{Request{}, 0, 0, 0, Fits},
		// Input that used to overflow: 10^16 MiB * 1000 wrapped negative
		// and fitted a full node; MaxInt64 gave 0 milli and was free.
		{Request{MemoryMiB: 10000000000000000}, 81920, 1, 0, ShareTooLarge},
		{Request{MemoryMiB: math.MaxInt64}, 81920, 1, 0, ShareTooLarge},
		{Request{MemoryMiB: 8192}, math.MaxInt64, 1, 0, MemoryUnknown},
		{Request{Milli: 5000}, 0, 1, 0, ShareTooLarge},
	}
	for _, tc := range tests {
		d, m, out := tc.req.PerDevice(tc.nodeMem)
		if d != tc.wantDevices || m != tc.wantMilli || out != tc.want {
			t.Errorf("%+v on %d MiB: want (%d,%d,%v), got (%d,%d,%v)", tc.req, tc.nodeMem, tc.wantDevices, tc.wantMilli, tc.want, d, m, out)
		}
	}
}

// The annotation values that overflowed before are refused with their range.
func TestParseRequestBounds(t *testing.T) {
	// Exponents: the quantity parser never returns on the second, and
	// comparing the first with the bound takes forever.
	for _, v := range []string{"10000000000000000", "9223372036854775807", "1048577", "2Ti", "1e30", "100Ei",
		"9e-23372036854775807", "9E23372036854775807", "8e9", "1.5.Gi", "Gi", "0x10Gi"} {
		_, err := ParseRequest(pod(map[string]string{AnnotationMemory: v}, 0, ""), DefaultRequestOptions)
		var inv *InvalidError
		if !errors.As(err, &inv) || !strings.Contains(inv.Rule, "1048576") {
			t.Errorf("gpu-memory=%q: want an invalid-annotation error naming the range, got %v", v, err)
		}
	}
	for _, v := range []string{"1048576", "1Ti", "80Gi", "1.5Gi", "80G"} {
		if _, err := ParseRequest(pod(map[string]string{AnnotationMemory: v}, 0, ""), DefaultRequestOptions); err != nil {
			t.Errorf("gpu-memory=%q: %v", v, err)
		}
	}
	// Huge resource quantities saturate instead of wrapping.
	p := pod(nil, 0, "")
	p.Spec.Containers[0].Resources.Requests[v1.ResourceCPU] = resource.MustParse("1e30")
	p.Spec.Containers[0].Resources.Requests[v1.ResourceMemory] = resource.MustParse("100Ei")
	p.Spec.Containers = append(p.Spec.Containers, p.Spec.Containers[0])
	p.Spec.Containers[1].Resources.Requests = v1.ResourceList{ResourceNvidiaGPU: resource.MustParse("9223372036854775807"),
		v1.ResourceCPU: resource.MustParse("9223372036854775807")}
	r, err := ParseRequest(p, DefaultRequestOptions)
	if err != nil {
		t.Fatal(err)
	}
	if r.CPU <= 0 || r.CPU > maxCPUMilli || r.Memory <= 0 || r.Memory > maxMemoryMiB || r.Count != MaxDevices+1 {
		t.Errorf("not saturated: %+v", r)
	}
}

func TestModelSelector(t *testing.T) {
	tests := []struct {
		sel   ModelSelector
		model string
		want  bool
	}{
		{ModelSelector{}, "", true},
		{ModelSelector{Exact: []string{"A100", "H100"}}, "H100", true},
		{ModelSelector{Exact: []string{"A100"}}, "a100", false},
		{ModelSelector{Exact: []string{"A100"}}, "", false},
		{ModelSelector{Include: []string{"A100"}}, "NVIDIA-A100-SXM4-80GB", true},
		{ModelSelector{Include: []string{"A100"}}, "Tesla-T4", false},
		{ModelSelector{Exclude: []string{"T4"}}, "Tesla-T4", false},
		{ModelSelector{Exclude: []string{"T4"}}, "", true},
		{ModelSelector{Include: []string{"NVIDIA"}, Exclude: []string{"T4"}}, "NVIDIA-T4", false},
	}
	for _, tc := range tests {
		if got := tc.sel.Matches(tc.model, strings.ToUpper(tc.model)); got != tc.want {
			t.Errorf("%+v matches %q: want %v, got %v", tc.sel, tc.model, tc.want, got)
		}
	}
}

var smallExponent = regexp.MustCompile(`^[0-9]{1,20}[eE][0-9]{1,2}$`)

// FuzzParseRequest: any annotation values and GPU quantity either parse into
// a sane request or give an *InvalidError; never a panic, never an
// out-of-range value. On any node (any memory label), a valid GPU request
// either does not fit the node's devices by size, or takes 1-1000 milli on
// each of 1..MaxDevices+1 devices.
func FuzzParseRequest(f *testing.F) {
	for _, seed := range [][6]string{
		{"500", "", "", "", "", ""},
		{"", "0.25", "", "", "", ""},
		{"", "", "8Gi", "", "A100|H100", ""},
		{"", "0.5", "", "1", "", "a100,h100"},
		{"999", "", "", "", "", ""},
		{"1e3", "NaN", "-0", "0x10", "|", ","},
		{"", "", "10000000000000000", "", "", ""},
		{"", "", "9223372036854775807", "", "", ""},
		{"", "", "1048576", "", "", ""},
	} {
		for _, gpus := range []string{"", "2", "9223372036854775807", "1e30"} {
			for _, mem := range []string{"", "81920", "85899345920", "9223372036854775807", "1"} {
				f.Add(seed[0], seed[1], seed[2], seed[3], seed[4], seed[5], gpus, mem)
			}
		}
	}
	f.Fuzz(func(t *testing.T, milli, fraction, memory, numDevices, model, hami, gpus, nodeMem string) {
		ann := map[string]string{}
		for k, v := range map[string]string{AnnotationMilli: milli, AnnotationKAIFraction: fraction, AnnotationMemory: memory,
			AnnotationKAIFractionNumDevices: numDevices, AnnotationModel: model, AnnotationHAMiUseType: hami} {
			if v != "" {
				ann[k] = v
			}
		}
		p := pod(ann, 0, "1")
		// A pod's resources are quantities the API server parsed; the
		// parser does not return on some exponents (9223372e36854775807),
		// so only plain ones and small exponents are tried.
		if !plainQuantity(gpus) && !smallExponent.MatchString(gpus) {
			gpus = ""
		}
		if q, err := resource.ParseQuantity(gpus); err == nil {
			p.Spec.Containers[0].Resources.Requests[ResourceNvidiaGPU] = q
			p.Spec.Containers[0].Resources.Limits[ResourceNvidiaGPU] = q
		}
		r, err := ParseRequest(p, DefaultRequestOptions)
		if err == nil && r.HasGPU() && !UsesGPU(p, DefaultRequestOptions) {
			// The tracker would skip a pod that holds a device.
			t.Fatalf("UsesGPU false for %+v", r)
		}
		if err != nil {
			var inv *InvalidError
			if !errors.As(err, &inv) || inv.Key == "" || inv.Rule == "" {
				t.Fatalf("error is not a keyed *InvalidError: %v", err)
			}
			return
		}
		if r.Milli < 0 || r.Milli >= MilliPerGPU || r.MemoryMiB < 0 || r.MemoryMiB > MaxGPUMemoryMiB ||
			r.Count < 0 || r.Count > MaxDevices+1 || r.CPU < 0 || r.CPU > maxCPUMilli || r.Memory < 0 {
			t.Fatalf("out of range: %+v", r)
		}
		if r.Shared() && r.Count > 0 {
			t.Fatalf("shared and whole at once: %+v", r)
		}
		if (r.Milli > 0) && (r.MemoryMiB > 0) {
			t.Fatalf("two shared dialects at once: %+v", r)
		}
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{LabelGPUMemory: nodeMem}},
			Status: v1.NodeStatus{Allocatable: v1.ResourceList{ResourceNvidiaGPU: resource.MustParse("8")}}}
		inv := ReadInventory(n, DefaultNodeOptions)
		if inv.MemoryMiB < 0 || inv.MemoryMiB > MaxGPUMemoryMiB {
			t.Fatalf("node memory %q read as %d MiB", nodeMem, inv.MemoryMiB)
		}
		devices, m, out := r.PerDevice(inv.MemoryMiB)
		if r.HasGPU() && out == Fits && (devices < 1 || devices > MaxDevices+1 || m < 1 || m > MilliPerGPU) {
			t.Fatalf("%+v on %d MiB takes %d devices of %d milli", r, inv.MemoryMiB, devices, m)
		}
		st := NewNodeState("n", inv, 0)
		if o, _, _ := st.Fit(&r); o == Fits && r.HasGPU() {
			c, _, ok := DefaultScoring.Evaluate(st, &r, nil)
			if !ok || popcount(c.Mask) != int(devices) || c.Milli != m {
				t.Fatalf("%+v fits but Evaluate chose %+v (ok %v)", r, c, ok)
			}
		}
	})
}
