// Command gpu-scheduler is the upstream kube-scheduler v1.37.2 with our GPU
// plugins registered. Run it beside the default scheduler; pods that set
// schedulerName: gpu-scheduler are placed by it.
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/featuregate"
	_ "k8s.io/component-base/logs/json/register" // JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	"k8s.io/klog/v2"
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
		checkServer(c)
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

// checkServer reads the API server's version and the optional APIs it
// serves, before the scheduler starts: an unsupported version is logged as
// an error naming the supported ones (the scheduler still starts), and
// GenericWorkload, when on, is turned off where the PodGroup API is not
// served (Kubernetes before 1.37), or the scheduler would wait for it
// forever. Nothing is decided when the server cannot be reached: the
// scheduler reports that itself.
func checkServer(c *cobra.Command) {
	master, kubeconfig := flagValue(c, "master"), flagValue(c, "kubeconfig")
	if kubeconfig == "" {
		if f := flagValue(c, "config"); f != "" {
			if cfg, err := offline.LoadConfigFile(f); err == nil {
				kubeconfig = cfg.ClientConnection.Kubeconfig
			}
		}
	}
	rc, err := clientcmd.BuildConfigFromFlags(master, kubeconfig)
	if err != nil {
		return
	}
	rc.Timeout = 10 * time.Second
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return
	}
	info, err := dc.ServerVersion()
	if err != nil {
		klog.Warningf("could not read the API server's version (%v): gpu-scheduler supports Kubernetes %s", err, version.Supported())
		return
	}
	if err := version.CheckServer(info.Major, info.Minor); err != nil {
		klog.ErrorS(nil, "unsupported Kubernetes version", "apiServer", info.GitVersion, "supported", version.Supported(), "detail", err.Error())
	} else {
		klog.InfoS("API server version supported", "apiServer", info.GitVersion, "supported", version.Supported())
	}
	for _, o := range optionalAPIs {
		if !utilfeature.DefaultFeatureGate.Enabled(o.gate) || serves(dc, o.groupVersion, o.resource) {
			continue
		}
		if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{string(o.gate): false}); err != nil {
			klog.ErrorS(err, "the API server does not serve an API a feature gate needs, and the gate cannot be turned off", "featureGate", o.gate, "api", o.groupVersion+"/"+o.resource)
			continue
		}
		plugins.FeatureDisabled(string(o.gate), o.reason)
		klog.ErrorS(nil, "feature gate turned off: the API server does not serve the API it needs", "featureGate", o.gate,
			"api", o.groupVersion+"/"+o.resource, "apiServer", info.GitVersion, "effect", o.effect)
	}
}

// optionalAPIs are the APIs newer than Kubernetes 1.35 that the scheduler
// watches when a feature gate is on: with the gate on and the API not
// served, its informer never syncs and the scheduler never starts.
var optionalAPIs = []struct {
	gate                   featuregate.Feature
	groupVersion, resource string
	reason, effect         string
}{
	{features.GenericWorkload, "scheduling.k8s.io/v1beta1", "podgroups", "PodGroupAPINotServed",
		"gangs are scheduled pod by pod (the PodGroup API is Kubernetes 1.37's, with GenericWorkload on)"},
	{features.DRADeviceTaintRules, "resource.k8s.io/v1", "devicetaintrules", "DeviceTaintRuleAPINotServed",
		"DeviceTaintRules are not read (resource.k8s.io/v1 serves them from Kubernetes 1.37); taints in ResourceSlices still count"},
}

// serves reports whether the API server serves a resource in a group
// version (an error other than "not found" counts as served: the scheduler
// then reports it).
func serves(dc discovery.DiscoveryInterface, groupVersion, resource string) bool {
	l, err := dc.ServerResourcesForGroupVersion(groupVersion)
	if err != nil {
		return !apierrors.IsNotFound(err)
	}
	for _, r := range l.APIResources {
		if r.Name == resource {
			return true
		}
	}
	return false
}

func flagValue(c *cobra.Command, name string) string {
	if f := c.Flags().Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}
