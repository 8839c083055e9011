package integration

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/kubectlgpu"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

var update = flag.Bool("update", false, "rewrite the golden files of kubectl gpu")

// kubectl gpu nodes, pending and frag, the built plugin against the local
// control plane, compared with golden files (go test -run TestKubectlGPU
// ./test/integration/ -args -update rewrites them).
func TestKubectlGPU(t *testing.T) {
	bin := filepath.Join(harness.BinDir(), "kubectl-gpu")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s: %v (make %s)", bin, err, bin)
	}
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "t4", CPU: "16", Memory: "64Gi", GPUs: 2, Model: "Tesla-T4", MemoryMiB: 15360},
		fleet.Node{Name: "a100", CPU: "64", Memory: "256Gi", GPUs: 4, Unhealthy: 1, Model: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920})
	// Bound by hand, with their assignments (no scheduler runs here).
	bind := func(spec harness.PodSpec, node, assignment string) {
		p := s.Pod(spec)
		p.Spec.NodeName = s.Node(node)
		p.Annotations[gpu.AnnotationAssignment] = s.Node(node) + ":" + assignment
		s.Create(p)
	}
	bind(harness.PodSpec{Name: "share-a", Milli: 600, CPU: "2"}, "t4", "0=600")
	bind(harness.PodSpec{Name: "share-b", Milli: 300, CPU: "2"}, "t4", "1=300")
	bind(harness.PodSpec{Name: "train", GPUs: 2, CPU: "8"}, "a100", "0=1000,1=1000")
	s.Create(s.Pod(harness.PodSpec{Name: "waits", GPUs: 4}), s.Pod(harness.PodSpec{Name: "cpu", CPU: "1"}))
	// The scheduler's explanation, as its reconciler writes it.
	w := s.Get("waits")
	w.Status.Conditions = append(w.Status.Conditions, v1.PodCondition{Type: gpu.ConditionPending, Status: v1.ConditionTrue,
		Reason: "Unschedulable", Message: "needs 4 free GPUs on one node; no node of an allowed model has that many free"})
	if _, err := cluster.Client.CoreV1().Pods(s.NS).UpdateStatus(s.Ctx, w, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"--kubeconfig", cluster.Kubeconfig, "-l", harness.LabelScope + "=" + s.ID, "-n", s.NS}, args...)...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("kubectl gpu %v: %v\n%s", args, err, errb.String())
		}
		// Node names and the namespace carry the scope's ID.
		return strings.ReplaceAll(out.String(), s.ID, "ID")
	}
	for name, args := range map[string][]string{
		"nodes":   {"nodes"},
		"pending": {"pending"},
		"frag":    {"frag", "--workload", "testdata/workload.yaml"},
	} {
		t.Run(name, func(t *testing.T) {
			got := run(args...)
			golden := filepath.Join("testdata", "kubectl-gpu-"+name+".txt")
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			// Column widths follow the scope's ID: compare words, not spaces.
			if squeeze(got) != squeeze(string(want)) {
				t.Errorf("kubectl gpu %s:\n%s\nwant (%s):\n%s", strings.Join(args, " "), got, golden, want)
			}
		})
	}
	// -o json carries the same figures, and the learned workload is the
	// scope's GPU pods.
	var nodes kubectlgpu.NodesReport
	if err := json.Unmarshal([]byte(run("nodes", "-o", "json")), &nodes); err != nil {
		t.Fatal(err)
	}
	if nodes.AllocatedMilli != 2900 || nodes.CapacityMilli != 5000 {
		t.Errorf("json: %d of %d milli allocated, want 2900 of 5000", nodes.AllocatedMilli, nodes.CapacityMilli)
	}
	var frag kubectlgpu.FragReport
	if err := json.Unmarshal([]byte(run("frag", "-o", "json")), &frag); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(frag.Workload, "4 GPU pods") || len(frag.Kinds) != 4 {
		t.Errorf("learned workload: %q, kinds %v", frag.Workload, frag.Kinds)
	}
	if out := run("pending", "-o", "yaml"); !strings.Contains(out, "name: waits") {
		t.Errorf("yaml: %s", out)
	}
}

func squeeze(s string) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	return strings.Join(lines, "\n")
}
