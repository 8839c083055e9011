// Command gpu-scheduler is the upstream kube-scheduler v1.37.2 with our GPU
// plugins registered. Run it beside the default scheduler; pods that set
// schedulerName: gpu-scheduler are placed by it.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register" // JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	// leader_election_master_status (name="kube-scheduler"): whether this
	// process holds the lease (shared.Leading reads it).
	_ "k8s.io/component-base/metrics/prometheus/clientgo/leaderelection"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/pkg/features"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/offline"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/version"
)

func main() {
	// On by default here (alpha upstream in v1.37): GPUFit uses it to keep
	// a backlog of pods that wait for GPUs out of the queue's walk on every
	// bound pod that comes or goes (docs/api.md). The --feature-gates flag,
	// parsed later, still decides: SchedulerPreQueueingHints=false.
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{string(features.SchedulerPreQueueingHints): true}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cmd := app.NewSchedulerCommand(plugins.Options()...)
	cmd.Use = "gpu-scheduler"
	cmd.Short = "GPU-aware secondary scheduler (kube-scheduler v1.37.2 with GPU plugins)"
	cmd.Long = fmt.Sprintf(`gpu-scheduler %s places pods that set schedulerName: gpu-scheduler.

It is the upstream kube-scheduler v1.37.2 with three plugins: GPUFit (per-device
filtering, reservations, the assignment annotation), GPUScore (fragmentation-aware
placement) and LeastRequested (CPU/memory spread). Give it a
KubeSchedulerConfiguration with --config; see manifests/ and docs/api.md.`, version.Version)
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if !leaderElects(c) {
			plugins.SetNoLeaderElection()
		}
		return run(c, args)
	}
	os.Exit(cli.Run(cmd))
}

// leaderElects reads, as kube-scheduler does, whether leader election runs:
// --leader-elect when given, else the configuration file's, else on. A
// configuration that does not load is left for kube-scheduler to report.
func leaderElects(c *cobra.Command) bool {
	if f := c.Flags().Lookup("leader-elect"); f != nil && f.Changed {
		return f.Value.String() == "true"
	}
	if f := c.Flags().Lookup("config"); f != nil && f.Value.String() != "" {
		if cfg, err := offline.LoadConfigFile(f.Value.String()); err == nil {
			return cfg.LeaderElection.LeaderElect
		}
	}
	return true
}
