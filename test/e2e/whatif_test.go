package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/simulator"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

// kubectl gpu whatif places pods as the scheduler then does: the same
// nodes and devices for each, the same pods left pending. A gpu-scheduler
// of its own (default profile, learned fragmentation scoring) schedules the
// pods one by one after the what-if, from the same starting cluster. The
// cluster has more than 100 nodes (110 without GPUs), where the scheduler
// scores only part of them: whatif says so, and still predicts every bind,
// since fewer nodes than that are feasible for a GPU pod.
func TestWhatIfMatchesScheduling(t *testing.T) {
	if !cluster.Local() {
		t.Skip("needs the local control plane")
	}
	bin := filepath.Join(harness.BinDir(), "kubectl-gpu")
	profile := "gpu-scheduler-whatif"
	sched, err := harness.StartProfile(context.Background(), cluster, filepath.Join(harness.BinDir(), "gpu-scheduler"), profile, nil, harness.AccountingOnlySharing)
	if err != nil {
		t.Fatal(err)
	}
	defer sched.Stop(5 * time.Second)
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "a", CPU: "32", Memory: "128Gi", GPUs: 4, Model: "Tesla-T4", MemoryMiB: 15360},
		fleet.Node{Name: "b", CPU: "32", Memory: "128Gi", GPUs: 2, Model: "Tesla-T4", MemoryMiB: 15360},
		fleet.Node{Name: "c", CPU: "16", Memory: "64Gi", GPUs: 2, Model: "NVIDIA-L4", MemoryMiB: 23034})
	var cpuNodes []fleet.Node
	for i := 0; i < 110; i++ {
		cpuNodes = append(cpuNodes, fleet.Node{Name: fmt.Sprintf("cpu-%03d", i), CPU: "8", Memory: "32Gi"})
	}
	s.AddNodes(cpuNodes...)
	// A cluster that is not empty.
	for _, spec := range []harness.PodSpec{{Name: "old-1", Milli: 400}, {Name: "old-2", GPUs: 1}} {
		spec.Scheduler = profile
		s.Create(s.Pod(spec))
		s.WaitBound(bindTimeout, spec.Name)
	}
	// Its leader (it runs without leader election: itself) publishes the
	// target it learned on the lease its configuration names, with the
	// weight of the pods behind it; whatif reads it there and goes on
	// learning from each pod it places, as the scheduler does (the l4 pod
	// among them, restricted to a model, moves where later shares go).
	err = wait.PollUntilContextTimeout(s.Ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := cluster.Client.CoordinationV1().Leases("kube-system").Get(ctx, "gpu-scheduler", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		all, err := gpu.ExportedWorkloads(l.Annotations[gpu.AnnotationTargetWorkload])
		if err != nil {
			return false, err
		}
		// Both pods learned: whatif goes on from there.
		e, ok := all[profile]
		return ok && e.SeenPods > 1.5, nil
	})
	if err != nil {
		t.Fatalf("the learned target of %s is not published on kube-system/gpu-scheduler: %v", profile, err)
	}
	specs := []harness.PodSpec{
		{Name: "s300", Milli: 300}, {Name: "w1", GPUs: 1}, {Name: "s600", Milli: 600}, {Name: "w2", GPUs: 2},
		{Name: "s500", Milli: 500}, {Name: "l4", GPUs: 1, Model: "NVIDIA-L4"}, {Name: "too-big", GPUs: 3},
		{Name: "s250", Milli: 250}, {Name: "s700", Milli: 700},
	}
	var docs []string
	for _, spec := range specs {
		spec.Scheduler = profile
		p := s.Pod(spec)
		p.APIVersion, p.Kind = "v1", "Pod"
		// As users write GPUs: limits only (the API server defaults the
		// requests of the pods created; whatif must do the same).
		for i := range p.Spec.Containers {
			for name := range p.Spec.Containers[i].Resources.Limits {
				if strings.HasPrefix(string(name), "nvidia.com/") {
					delete(p.Spec.Containers[i].Resources.Requests, name)
				}
			}
		}
		b, err := yaml.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(b))
	}
	podsFile := filepath.Join(t.TempDir(), "pods.yaml")
	if err := os.WriteFile(podsFile, []byte(strings.Join(docs, "---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "whatif", "--kubeconfig", cluster.Kubeconfig, "-l", harness.LabelScope+"="+s.ID,
		"-f", podsFile, "--config", sched.ConfigPath, "--scheduler-name", profile, "-o", "json")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl gpu whatif: %v\n%s", err, lastLines(errb.String(), 15))
	}
	var list struct {
		Notes []string                    `json:"notes"`
		Items []simulator.WhatIfPlacement `json:"items"`
	}
	if err := json.Unmarshal(out.Bytes(), &list); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	predicted := list.Items
	// Of every node of the cluster (the scope's 113 and others'), not only
	// those -l selects.
	if m := regexp.MustCompile(`first (\d+) feasible nodes of (\d+)`).FindStringSubmatch(strings.Join(list.Notes, "\n")); m == nil {
		t.Errorf("whatif on 113 nodes does not say the scheduler scores only part of them: %q", list.Notes)
	} else if scored, _ := strconv.Atoi(m[1]); scored < 100 {
		t.Errorf("whatif says the scheduler scores %s nodes of %s: %q", m[1], m[2], list.Notes)
	} else if all, _ := strconv.Atoi(m[2]); all < 113 || scored >= all {
		t.Errorf("whatif says the scheduler scores %s nodes of %s: %q", m[1], m[2], list.Notes)
	}
	if n := strings.Join(list.Notes, "\n"); strings.Contains(n, "approximated") || strings.Contains(n, "keeps it as published") || strings.Contains(n, "may differ") {
		t.Errorf("whatif did not go on from the published target: %q", list.Notes)
	}
	if len(predicted) != len(specs) {
		t.Fatalf("whatif placed %d pods, want %d", len(predicted), len(specs))
	}
	// Now for real, in the same order.
	for i, spec := range specs {
		spec.Scheduler = profile
		s.Create(s.Pod(spec))
		var got, why string
		err := wait.PollUntilContextTimeout(s.Ctx, 100*time.Millisecond, bindTimeout, true, func(context.Context) (bool, error) {
			p := s.GetOrNil(spec.Name)
			if p == nil {
				return false, nil
			}
			if p.Spec.NodeName != "" {
				got = p.Annotations[gpu.AnnotationAssignment]
				return got != "", nil
			}
			why = harness.Unschedulable(p)
			return why != "", nil
		})
		if err != nil {
			t.Fatalf("%s: neither bound nor unschedulable", spec.Name)
		}
		want := predicted[i]
		switch {
		case want.Node == "" && got != "":
			t.Errorf("%s: whatif left it pending (%s), the scheduler placed it on %s", spec.Name, want.Reason, got)
		case want.Node != "" && got != want.Devices:
			t.Errorf("%s: whatif placed it on %s, the scheduler on %q (%s)", spec.Name, want.Devices, got, why)
		default:
			t.Logf("%s: %s%s", spec.Name, got, map[bool]string{true: fmt.Sprintf("pending: %s", want.Reason)}[got == ""])
		}
	}
	checkDevices(t)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
