package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gpu-scheduler/gpu-scheduler/manifests"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

func startScheduler(t *testing.T) *harness.InProcess {
	t.Helper()
	// These tests are of the accounting, with shares on nodes without a
	// device agent (hami_test.go has the delivered shares).
	s, err := harness.StartInProcessWith(context.Background(), cluster.Config, manifests.SchedulerConfig, harness.InProcessOptions{FitArgs: harness.AccountingOnly})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Shares and whole GPUs are placed with assignments that fit the devices,
// and a share too large for any single device waits with a reason.
func TestPlacement(t *testing.T) {
	sched := startScheduler(t)
	defer sched.Stop()
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "t4x2", CPU: "32", Memory: "128Gi", GPUs: 2, Model: "Tesla-T4", MemoryMiB: 15360})
	s.Create(s.Pod(harness.PodSpec{Name: "w", GPUs: 1}),
		s.Pod(harness.PodSpec{Name: "s1", Milli: 600}),
		s.Pod(harness.PodSpec{Name: "s2", Milli: 300}))
	bound := s.WaitBound(30*time.Second, "w", "s1", "s2")
	use, err := harness.CheckDevices(s.Ctx, cluster.Client)
	if err != nil {
		t.Fatal(err)
	}
	n := s.Node("t4x2")
	if use[n][0]+use[n][1] != 1900 {
		t.Errorf("booked %v", use[n])
	}
	for name, p := range bound {
		if _, err := gpu.ParseAssignment(p.Annotations[gpu.AnnotationAssignment]); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// 100 milli is left, on one device: 200 fits nowhere.
	s.Create(s.Pod(harness.PodSpec{Name: "s3", Milli: 200}))
	if msg := s.WaitUnschedulable(30*time.Second, "s3"); !strings.Contains(msg, "no single GPU with enough free milli-GPU") {
		t.Errorf("reason: %q", msg)
	}
}

// After a restart, accounting is rebuilt from the annotations alone: a new
// scheduler never hands out a device the old one assigned.
func TestRestartRebuildsAccounting(t *testing.T) {
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "a", CPU: "64", Memory: "256Gi", GPUs: 4, Model: "NVIDIA-L4", MemoryMiB: 23034})
	first := startScheduler(t)
	var names []string
	for i := 0; i < 5; i++ {
		names = append(names, fmt.Sprintf("old-%d", i))
		s.Create(s.Pod(harness.PodSpec{Name: names[i], Milli: 400}))
	}
	s.WaitBound(30*time.Second, names...)
	first.Stop()

	second := startScheduler(t)
	defer second.Stop()
	// 5 x 400 on 4 devices: at most 2 per device, so at least 2 devices are
	// partly used; fill what is left with shares of 600 and 200.
	var more []string
	for i := 0; i < 6; i++ {
		name := fmt.Sprintf("new-%d", i)
		milli := 600
		if i%2 == 1 {
			milli = 200
		}
		s.Create(s.Pod(harness.PodSpec{Name: name, Milli: milli}))
		more = append(more, name)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		settled := 0
		for _, n := range more {
			if p := s.Get(n); p.Spec.NodeName != "" || harness.Unschedulable(p) != "" {
				settled++
			}
		}
		if settled == len(more) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	use, err := harness.CheckDevices(s.Ctx, cluster.Client)
	if err != nil {
		t.Fatal(err)
	}
	var total int32
	for _, m := range use[s.Node("a")] {
		total += m
	}
	if total <= 2000 {
		t.Errorf("the second scheduler placed nothing: %v", use)
	}
}
