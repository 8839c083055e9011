package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/gpu-scheduler/gpu-scheduler/manifests"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/kubectlgpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/simulator"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

var update = flag.Bool("update", false, "rewrite the golden files of kubectl gpu")

var uuids = regexp.MustCompile(`GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

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
		fleet.Node{Name: "a100", CPU: "64", Memory: "256Gi", GPUs: 4, Unhealthy: 1, Model: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920},
		// HAMi's device plugin: UUIDs, and memory, cores and slots held.
		fleet.Node{Name: "l4", CPU: "16", Memory: "64Gi", GPUs: 2, Model: "NVIDIA-L4", MemoryMiB: 23034, HAMiSplit: 10})
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
	bind(harness.PodSpec{Name: "share-l4", Milli: 250, CPU: "2"}, "l4", "1=250")
	s.Create(s.Pod(harness.PodSpec{Name: "waits", GPUs: 4}), s.Pod(harness.PodSpec{Name: "cpu", CPU: "1"}))
	// The scheduler's explanation, as its reconciler writes it.
	w := s.Get("waits")
	w.Status.Conditions = append(w.Status.Conditions, v1.PodCondition{Type: gpu.ConditionPending, Status: v1.ConditionTrue,
		Reason: "Unschedulable", Message: "needs 4 free GPUs on one node; no node of an allowed model has that many free"})
	if _, err := cluster.Client.CoreV1().Pods(s.NS).UpdateStatus(s.Ctx, w, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	runErr := func(args ...string) (string, error) {
		cmd := exec.Command(bin, append([]string{"--kubeconfig", cluster.Kubeconfig, "-l", harness.LabelScope + "=" + s.ID, "-n", s.NS}, args...)...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("%w: %s", err, errb.String())
		}
		// Node names and the namespace carry the scope's ID, and fake
		// HAMi's UUIDs are made from the node names.
		return uuids.ReplaceAllString(strings.ReplaceAll(out.String(), s.ID, "ID"), "GPU-<uuid>"), nil
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := runErr(args...)
		if err != nil {
			t.Fatalf("kubectl gpu %v: %v", args, err)
		}
		return out
	}
	for name, args := range map[string][]string{
		"nodes":   {"nodes"},
		"pending": {"pending"},
		"frag":    {"frag", "--workload", "testdata/workload.yaml"},
		// The profile's own target workload, from --config (else the
		// deployed ConfigMap, else the shipped configuration).
		"frag-static": {"frag", "--config", "testdata/static-config.yaml"},
		// kubectl's wide: device memory and node agent.
		"nodes-wide": {"nodes", "-o", "wide"},
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
	if nodes.AllocatedMilli != 3150 || nodes.CapacityMilli != 7000 {
		t.Errorf("json: %d of %d milli allocated, want 3150 of 7000", nodes.AllocatedMilli, nodes.CapacityMilli)
	}
	// The learned workload is every GPU pod of the profile, whatever -n
	// says (it narrows only what is shown), as the scheduler learns it.
	var frag kubectlgpu.FragReport
	err := wait.PollUntilContextTimeout(s.Ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		all, err := cluster.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		want := 0
		for i := range all.Items {
			if p := &all.Items[i]; p.Spec.SchedulerName == gpu.SchedulerName && gpu.UsesGPU(p, gpu.DefaultRequestOptions) {
				want++
			}
		}
		if err := json.Unmarshal([]byte(run("frag", "-o", "json")), &frag); err != nil {
			return false, err
		}
		return strings.Contains(frag.Workload, fmt.Sprintf("the %d GPU pods", want)) && len(frag.Kinds) >= 5, nil
	})
	if err != nil {
		t.Errorf("learned workload: %q, kinds %v: %v", frag.Workload, frag.Kinds, err)
	}
	if out := run("pending", "-o", "yaml"); !strings.Contains(out, "name: waits") || !strings.Contains(out, "kind: PendingList") {
		t.Errorf("yaml: %s", out)
	}
	// kubectl's output conventions: name, jsonpath, go-template, wide,
	// --no-headers.
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"nodes -o name":     {[]string{"nodes", "-o", "name"}, "node/ID-a100\nnode/ID-l4\nnode/ID-t4\n"},
		"pending -o name":   {[]string{"pending", "-o", "name"}, "pod/waits\n"},
		"frag -o name":      {[]string{"frag", "--workload", "testdata/workload.yaml", "-o", "name"}, "node/ID-a100\nnode/ID-l4\nnode/ID-t4\n"},
		"nodes -o jsonpath": {[]string{"nodes", "-o", "jsonpath={.capacityMilli} {.nodes[*].name}"}, "7000 ID-a100 ID-l4 ID-t4"},
		"pending --template": {[]string{"pending", "-o", "go-template", "--template", "{{range .items}}{{.name}}: {{.request}}{{end}}"},
			"waits: 4 GPU"},
		"pending --no-headers": {[]string{"pending", "--no-headers"},
			"e2e-ID waits 4 GPU needs 4 free GPUs on one node; no node of an allowed model has that many free\n"},
	} {
		if got := run(tc.args...); squeeze(got) != squeeze(tc.want) {
			t.Errorf("%s: got %q, want %q", name, got, tc.want)
		}
	}
	if got := run("pending", "-o", "wide"); !strings.Contains(got, "NOMINATED NODE") || !strings.Contains(got, "<none>") {
		t.Errorf("pending -o wide: %s", got)
	}
	if _, err := runErr("nodes", "-o", "table"); err == nil || !strings.Contains(err.Error(), "wide") {
		t.Errorf("an unknown format: %v", err)
	}

	// The namespace is the context's, as kubectl's; -A is every one. A
	// pod of another namespace waits too.
	other := s.ID + "-other"
	if _, err := cluster.Client.CoreV1().Namespaces().Create(s.Ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.CoreV1().Namespaces().Delete(context.Background(), other, metav1.DeleteOptions{})
	})
	elsewhere := s.Pod(harness.PodSpec{Name: "waits-elsewhere", GPUs: 8})
	elsewhere.Namespace = other
	if _, err := cluster.Client.CoreV1().Pods(other).Create(s.Ctx, elsewhere, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(cluster.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Contexts[cfg.CurrentContext].Namespace = s.NS
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, kc); err != nil {
		t.Fatal(err)
	}
	inContext := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, append([]string{"--kubeconfig", kc, "-l", harness.LabelScope + "=" + s.ID}, args...)...).Output()
		if err != nil {
			t.Fatalf("kubectl gpu %v: %v", args, err)
		}
		return string(out)
	}
	if got := inContext("pending", "-o", "name"); got != "pod/waits\n" {
		t.Errorf("pending in the context's namespace: %q, want pod/waits", got)
	}
	if got := inContext("pending", "-A", "-o", "name"); !strings.Contains(got, "pod/waits\n") || !strings.Contains(got, "pod/waits-elsewhere\n") {
		t.Errorf("pending -A: %q, want both pods", got)
	}

	// whatif -f as kubectl reads it: a directory (in name order), stdin,
	// and a pod of another namespace than -n refused.
	dir := t.TempDir()
	for name, spec := range map[string]harness.PodSpec{"a.yaml": {Name: "first", GPUs: 1}, "b.yaml": {Name: "second", Milli: 500}} {
		p := s.Pod(spec)
		p.APIVersion, p.Kind = "v1", "Pod"
		p.Namespace = ""
		b, err := yaml.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := run("whatif", "-f", dir, "-o", "name"); got != "pod/first\npod/second\n" {
		t.Errorf("whatif -f DIR: %q", got)
	}
	stdin, err := os.ReadFile(filepath.Join(dir, "a.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--kubeconfig", cluster.Kubeconfig, "-l", harness.LabelScope+"="+s.ID, "-n", s.NS, "whatif", "-f", "-", "-o", "json")
	cmd.Stdin = bytes.NewReader(stdin)
	out, err := cmd.Output()
	var placed struct {
		Kind  string                      `json:"kind"`
		Notes []string                    `json:"notes"`
		Items []simulator.WhatIfPlacement `json:"items"`
	}
	// -l narrows the nodes whatif sees, not the scheduler's: it says so.
	if err != nil || json.Unmarshal(out, &placed) != nil || placed.Kind != "WhatIfList" || len(placed.Items) != 1 ||
		placed.Items[0].Name != "first" || placed.Items[0].Namespace != s.NS || placed.Items[0].Node == "" ||
		!strings.Contains(strings.Join(placed.Notes, "\n"), "-l ") {
		t.Errorf("whatif -f -: %v %+v\n%s", err, placed, out)
	}
	// The learned target as the scheduler holds it: its leader publishes
	// it on its lease (targetWorkload.publishTo), and kubectl gpu reads it
	// there rather than learning again from the pods that exist now.
	published := `{"gpu-scheduler":{"at":"2026-12-02T10:00:00Z","tasks":[{"cpuMilli":1000,"gpuMilli":300,"gpuCount":1,"weight":1}]}}`
	if _, err := cluster.Client.CoordinationV1().Leases(s.NS).Create(s.Ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Name: "sched", Annotations: map[string]string{gpu.AnnotationTargetWorkload: published}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(t.TempDir(), "config.yaml")
	shipped := strings.Replace(string(manifests.SchedulerConfig), "publishTo: kube-system/gpu-scheduler", "publishTo: "+s.NS+"/sched", 1)
	if shipped == string(manifests.SchedulerConfig) {
		t.Fatal("the shipped configuration publishes nowhere")
	}
	if err := os.WriteFile(cfgFile, []byte(shipped), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(run("frag", "--config", cfgFile, "-o", "json")), &frag); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(frag.Workload, "published on lease "+"e2e-ID/sched") || len(frag.Kinds) != 1 || frag.Kinds[0].Share != 1 {
		t.Errorf("the published target: %q, kinds %+v", frag.Workload, frag.Kinds)
	}
	// whatif goes on learning from a target that says what it was learned
	// from; one from before that is kept as published, and it says so.
	notes := func() string {
		t.Helper()
		cmd := exec.Command(bin, "--kubeconfig", cluster.Kubeconfig, "-l", harness.LabelScope+"="+s.ID, "-n", s.NS, "whatif", "-f", "-",
			"--config", cfgFile, "-o", "json")
		cmd.Stdin = bytes.NewReader(stdin)
		out, err := cmd.Output()
		placed.Notes = nil
		if err != nil || json.Unmarshal(out, &placed) != nil || len(placed.Items) != 1 || placed.Items[0].Node == "" {
			t.Fatalf("whatif --config: %v\n%s", err, out)
		}
		return strings.Join(placed.Notes, "\n")
	}
	if n := notes(); !strings.Contains(n, "does not say what it was learned from") {
		t.Errorf("a target published without its weight: notes %q", n)
	}
	lease, err := cluster.Client.CoordinationV1().Leases(s.NS).Get(s.Ctx, "sched", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lease.Annotations[gpu.AnnotationTargetWorkload] = strings.Replace(published, `"weight":1}]`, `"weight":1}],"seenPods":42,"kinds":[{"cpuMilli":1000,"gpuMilli":300,"gpuCount":1,"weight":40}]`, 1)
	if _, err := cluster.Client.CoordinationV1().Leases(s.NS).Update(s.Ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := notes(); strings.Contains(n, "learned from") || strings.Contains(n, "approximated") {
		t.Errorf("a target published with its weight: notes %q", n)
	}
	// One no learner takes (a kind weighing more than all the pods) is
	// kept as published, and it says why.
	lease, err = cluster.Client.CoordinationV1().Leases(s.NS).Get(s.Ctx, "sched", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lease.Annotations[gpu.AnnotationTargetWorkload] = strings.Replace(published, `"weight":1}]`, `"weight":1}],"seenPods":42,"kinds":[{"cpuMilli":1000,"gpuMilli":300,"gpuCount":1,"weight":50}]`, 1)
	if _, err := cluster.Client.CoordinationV1().Leases(s.NS).Update(s.Ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := notes(); !strings.Contains(n, "could not be learned from") || !strings.Contains(n, "keeps it as published") {
		t.Errorf("a target no learner takes: notes %q", n)
	}
	wrongNS := strings.Replace(string(stdin), "metadata:\n", "metadata:\n  namespace: elsewhere\n", 1)
	cmd = exec.Command(bin, "--kubeconfig", cluster.Kubeconfig, "-l", harness.LabelScope+"="+s.ID, "-n", s.NS, "whatif", "-f", "-")
	cmd.Stdin = strings.NewReader(wrongNS)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "namespace") {
		t.Errorf("a pod of another namespace than -n: %v\n%s", err, out)
	}
}

func squeeze(s string) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	return strings.Join(lines, "\n")
}

// make dist's archive and krew manifest, installed by krew itself (from its
// Go module) into a scratch KREW_ROOT: the plugin it installs runs against
// the cluster, and an archive whose checksum is not the manifest's is
// refused.
func TestKrewInstall(t *testing.T) {
	krew := filepath.Join(harness.BinDir(), "krew")
	if _, err := os.Stat(krew); err != nil {
		t.Fatalf("%s: %v (make %s)", krew, err, krew)
	}
	dist := t.TempDir()
	platform := runtime.GOOS + "_" + runtime.GOARCH
	mk := exec.Command("make", "-s", "-C", harness.RepoRoot(), "dist", "DIST="+dist, "DIST_PLATFORMS="+runtime.GOOS+"/"+runtime.GOARCH)
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make dist: %v\n%s", err, out)
	}
	manifest := filepath.Join(dist, "gpu.yaml")
	archive := filepath.Join(dist, "kubectl-gpu_"+platform+".tar.gz")
	data, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	version, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"name: gpu", "version: " + strings.TrimSpace(string(version)), "os: " + runtime.GOOS,
		"/releases/download/" + strings.TrimSpace(string(version)) + "/kubectl-gpu_" + platform + ".tar.gz"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("manifest lacks %q:\n%s", want, data)
		}
	}
	root := t.TempDir()
	install := func(manifest string) (string, error) {
		cmd := exec.Command(krew, "install", "--manifest="+manifest, "--archive="+archive)
		cmd.Env = append(os.Environ(), "KREW_ROOT="+root)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// One changed digit of the checksum.
	sum := regexp.MustCompile(`sha256: ([0-9a-f]{64})`).FindStringSubmatch(string(data))
	if sum == nil {
		t.Fatalf("no sha256 in the manifest:\n%s", data)
	}
	flipped := "0"
	if sum[1][0] == '0' {
		flipped = "1"
	}
	bad := filepath.Join(dist, "bad.yaml")
	if err := os.WriteFile(bad, []byte(strings.Replace(string(data), sum[1], flipped+sum[1][1:], 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := install(bad); err == nil {
		t.Errorf("krew installed an archive against a wrong checksum:\n%s", out)
	}
	if out, err := install(manifest); err != nil {
		t.Fatalf("krew install: %v\n%s", err, out)
	}
	plugin := filepath.Join(root, "bin", "kubectl-gpu")
	out, err := exec.Command(plugin, "--version").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "kubectl-gpu "+strings.TrimSpace(string(version)) {
		t.Errorf("installed kubectl-gpu --version: %q, %v", out, err)
	}
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "t4", CPU: "16", Memory: "64Gi", GPUs: 2, Model: "Tesla-T4"})
	out, err = exec.Command(plugin, "nodes", "--kubeconfig", cluster.Kubeconfig, "-l", harness.LabelScope+"="+s.ID).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "0 of 2000m") {
		t.Errorf("installed kubectl-gpu nodes: %v\n%s", err, out)
	}
}
