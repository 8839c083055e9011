package e2e

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpu-scheduler/gpu-scheduler/manifests"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

// Every metric the dashboard and the alert rules read is on the leading
// gpu-scheduler's /metrics once it has scheduled a GPU pod and run a
// resync.
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
			if !exported[m] {
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
