// Command gpu-scheduler is the upstream kube-scheduler v1.37.2 with our GPU
// plugins registered. Run it beside the default scheduler; pods that set
// schedulerName: gpu-scheduler are placed by it.
package main

import (
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apiversion "k8s.io/apimachinery/pkg/version"
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

It is the upstream kube-scheduler v1.37.2 with GPU plugins: GPUFit (per-device
filtering, reservations, the assignment annotation; GPUs published through DRA
too), GPUScore (fragmentation-aware placement), LeastRequested (CPU/memory
spread), GPUPreemption (victims device by device) and GPUDynamicResources (the
in-tree DRA plugin, shown our GPUs best fit first). Give it a
KubeSchedulerConfiguration with --config; see manifests/ and docs/api.md.`, version.Version)
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if !leaderElects(c) {
			plugins.SetNoLeaderElection()
		}
		if err := checkServer(c); err != nil {
			return err
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

// checkServer reads the API server's version and the optional APIs it
// serves, before the scheduler starts: an unsupported version is logged as
// an error naming the supported ones (the scheduler still starts), and a
// feature gate whose API is not served is turned off (with the gates that
// depend on it), or the scheduler would wait for its informer forever. It
// retries for a minute while the server cannot answer, then fails: carrying
// on undecided could leave the scheduler waiting, alive and never ready.
func checkServer(c *cobra.Command) error {
	if flagValue(c, "version") != "" && flagValue(c, "version") != "false" {
		return nil // kube-scheduler prints its version and exits
	}
	rc, err := clientcmd.BuildConfigFromFlags(flagValue(c, "master"), schedulerKubeconfig(c))
	if err != nil {
		return nil // the scheduler reports it
	}
	rc.Timeout = 10 * time.Second
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return nil
	}
	var info *apiversion.Info
	var off []optionalAPI
	deadline := time.Now().Add(time.Minute)
	for wait := time.Second; ; wait = min(2*wait, 8*time.Second) {
		if info, err = dc.ServerVersion(); err == nil {
			if off, err = gatesToTurnOff(dc, utilfeature.DefaultFeatureGate.Enabled); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("reading the API server's version and APIs: %w (gpu-scheduler must know them before it starts; it supports Kubernetes %s)", err, version.Supported())
		}
		klog.Warningf("reading the API server's version and APIs (retrying): %v", err)
		time.Sleep(wait)
	}
	if err := version.CheckServer(info.Major, info.Minor); err != nil {
		klog.ErrorS(nil, "unsupported Kubernetes version", "apiServer", info.GitVersion, "supported", version.Supported(), "detail", err.Error())
	} else {
		klog.InfoS("API server version supported", "apiServer", info.GitVersion, "supported", version.Supported())
	}
	for _, o := range off {
		m := map[string]bool{string(o.gate): false}
		for _, d := range o.dependents {
			if utilfeature.DefaultFeatureGate.Enabled(d) {
				m[string(d)] = false
			}
		}
		if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(m); err != nil {
			return fmt.Errorf("the API server (%s) does not serve %s/%s, which feature gate %s needs, and the gate cannot be turned off: %w", info.GitVersion, o.groupVersion, o.resource, o.gate, err)
		}
		plugins.FeatureDisabled(string(o.gate), o.reason)
		klog.ErrorS(nil, "feature gate turned off: the API server does not serve the API it needs", "featureGates", m,
			"api", o.groupVersion+"/"+o.resource, "apiServer", info.GitVersion, "effect", o.effect)
	}
	return nil
}

// schedulerKubeconfig is the kubeconfig the scheduler will use: with
// --config, the file's clientConnection.kubeconfig (kube-scheduler then
// ignores --kubeconfig), else --kubeconfig (empty: in-cluster).
func schedulerKubeconfig(c *cobra.Command) string {
	if f := flagValue(c, "config"); f != "" {
		if cfg, err := offline.LoadConfigFile(f); err == nil {
			return cfg.ClientConnection.Kubeconfig
		}
		return ""
	}
	return flagValue(c, "kubeconfig")
}

// optionalAPI is an API newer than the oldest supported minor that the
// scheduler watches when a feature gate is on: with the gate on and the API
// not served, its informer never syncs and the scheduler never starts.
type optionalAPI struct {
	gate                   featuregate.Feature
	groupVersion, resource string
	// dependents are the gates that need gate: off with it.
	dependents     []featuregate.Feature
	reason, effect string
}

var optionalAPIs = []optionalAPI{
	{features.GenericWorkload, "scheduling.k8s.io/v1beta1", "podgroups",
		[]featuregate.Feature{features.CompositePodGroup, features.DRAWorkloadResourceClaims, features.PodGroupPreemptionPolicy,
			features.TopologyAwareWorkloadScheduling, features.WorkloadWithJob},
		"PodGroupAPINotServed", "gangs are scheduled pod by pod (the PodGroup API is Kubernetes 1.37's, with GenericWorkload on)"},
	{features.CompositePodGroup, "scheduling.k8s.io/v1alpha3", "compositepodgroups", nil,
		"CompositePodGroupAPINotServed", "composite pod groups are not read"},
	{features.DRADeviceTaintRules, "resource.k8s.io/v1", "devicetaintrules", nil,
		"DeviceTaintRuleAPINotServed", "DeviceTaintRules are not read (resource.k8s.io/v1 serves them from Kubernetes 1.37); taints in ResourceSlices still count"},
}

// gatesToTurnOff lists the optional APIs whose gate is on and whose API the
// server does not serve. An error other than "not found" is returned:
// nothing is decided from a server that did not answer.
func gatesToTurnOff(dc discovery.DiscoveryInterface, enabled func(featuregate.Feature) bool) ([]optionalAPI, error) {
	var off []optionalAPI
	for _, o := range optionalAPIs {
		if !enabled(o.gate) || slices.ContainsFunc(off, func(p optionalAPI) bool { return slices.Contains(p.dependents, o.gate) }) {
			continue
		}
		ok, err := serves(dc, o.groupVersion, o.resource)
		if err != nil {
			return nil, err
		}
		if !ok {
			off = append(off, o)
		}
	}
	return off, nil
}

// serves reports whether the API server serves a resource in a group
// version.
func serves(dc discovery.DiscoveryInterface, groupVersion, resource string) (bool, error) {
	l, err := dc.ServerResourcesForGroupVersion(groupVersion)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, r := range l.APIResources {
		if r.Name == resource {
			return true, nil
		}
	}
	return false, nil
}

func flagValue(c *cobra.Command, name string) string {
	if f := c.Flags().Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}
