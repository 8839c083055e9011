package e2e

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpu-scheduler/gpu-scheduler/manifests"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

// conditionalMetrics have series only while their condition holds; the
// named test checks each where the condition is made.
var conditionalMetrics = map[string]string{
	"gpu_scheduler_node_overcommitted": "TestOvercommitByAnotherScheduler",
}

// Every metric the dashboard and the alert rules read is on the leading
// gpu-scheduler's /metrics once it has scheduled a GPU pod and run a
// resync (those of conditionalMetrics once their condition holds).
func TestMonitoringMetricsExported(t *testing.T) {
	if procs == nil {
		t.Skip("process mode only (a deployed cluster's scheduler is scraped by its own Prometheus)")
	}
	want, err := manifests.MonitoringMetrics()
	if err != nil {
		t.Fatal(err)
	}
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "n", CPU: "16", Memory: "64Gi", GPUs: 2, Model: "Tesla-T4", MemoryMiB: 15360})
	s.Create(s.Pod(harness.PodSpec{Name: "a", Milli: 300}))
	s.WaitBound(bindTimeout, "a")
	leader, err := procs.WaitLeader(s.Ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	// The GPU gauges come with the reconciler's resync (30 s).
	err = wait.PollUntilContextTimeout(s.Ctx, time.Second, 75*time.Second, true, func(ctx context.Context) (bool, error) {
		_, body, err := leader.Get(ctx, "/metrics")
		if err != nil {
			return false, nil
		}
		exported := map[string]bool{}
		for _, line := range strings.Split(body, "\n") {
			if f := strings.Fields(line); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" {
				exported[f[2]] = true
			} else if len(f) >= 2 && !strings.HasPrefix(line, "#") {
				name := f[0]
				if i := strings.IndexByte(name, '{'); i >= 0 {
					name = name[:i]
				}
				exported[name] = true
			}
		}
		missing = missing[:0]
		for m := range want {
			if !exported[m] && conditionalMetrics[m] == "" {
				missing = append(missing, m+" (used by "+want[m]+")")
			}
		}
		return len(missing) == 0, nil
	})
	if err != nil {
		sort.Strings(missing)
		t.Fatalf("not exported by the leading gpu-scheduler:\n%s", strings.Join(missing, "\n"))
	}
	t.Logf("%d metrics of the dashboard and the alert rules are exported", len(want))
}

// Without leader election (one replica, leaderElect: false), the scheduler
// leads from the start: gpu_scheduler_leader is 1 and the GPU gauges are
// published before it has scheduled anything (else the no-leader alert
// fires on an idle cluster).
func TestLeadsWithoutLeaderElection(t *testing.T) {
	if !cluster.Local() {
		t.Skip("needs the local control plane")
	}
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "n", CPU: "16", Memory: "64Gi", GPUs: 2, Model: "Tesla-T4", MemoryMiB: 15360})
	profile := "gpu-scheduler-noelection"
	sched, err := harness.StartProfile(context.Background(), cluster, filepath.Join(harness.BinDir(), "gpu-scheduler"), profile, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sched.Stop(5 * time.Second)
	var last string
	err = wait.PollUntilContextTimeout(s.Ctx, time.Second, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		_, body, err := sched.Get(ctx, "/metrics")
		if err != nil {
			return false, nil
		}
		last = ""
		lead, capacity := false, false
		for _, line := range strings.Split(body, "\n") {
			switch {
			case line == "gpu_scheduler_leader 1":
				lead = true
			case strings.HasPrefix(line, "gpu_scheduler_capacity_milli{"):
				capacity = true
			case strings.HasPrefix(line, "gpu_scheduler_leader"):
				last = line
			}
		}
		return lead && capacity, nil
	})
	if err != nil {
		t.Fatalf("an idle gpu-scheduler without leader election does not lead (%q) or publishes no GPU capacity", last)
	}
}

// The scheduler turns off the feature gates whose APIs the API server does
// not serve (DRADeviceTaintRules before 1.37: resource.k8s.io/v1
// devicetaintrules), says so in its log, and exports it; on 1.37 it turns
// off nothing.
func TestFeatureGatesFollowTheAPIServer(t *testing.T) {
	if procs == nil {
		t.Skip("process mode only")
	}
	s := cluster.NewScope(t)
	leader, err := procs.WaitLeader(s.Ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	const sample = `gpu_scheduler_feature_disabled{feature="DRADeviceTaintRules",reason="DeviceTaintRuleAPINotServed"}`
	v, ok := leader.Metric(s.Ctx, sample)
	log, err := os.ReadFile(leader.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	logged := strings.Contains(string(log), "feature gate turned off: the API server does not serve the API it needs")
	if cluster.Minor() < 37 {
		if !ok || v != "1" || !logged {
			t.Errorf("on 1.%d: %s = %q (exported %v), logged %v; want 1, and the log line", cluster.Minor(), sample, v, ok, logged)
		}
		return
	}
	if ok || logged {
		t.Errorf("on 1.%d a gate was turned off: %s = %q, logged %v", cluster.Minor(), sample, v, logged)
	}
}
