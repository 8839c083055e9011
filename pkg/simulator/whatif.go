package simulator

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"

	ourconfig "github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/offline"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/gpufit"
)

// WhatIfPlacement is where one pod of a what-if would go.
type WhatIfPlacement struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Node is empty when the pod would stay pending, and Reason says why.
	Node string `json:"node,omitempty"`
	// Devices are the GPUs it would get, as its assignment would read
	// ("<node>:<index>=<milli>,...").
	Devices string `json:"devices,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// WhatIfProfile is the profile of a scheduler configuration, with every
// node scored (as a cluster of at most 100 nodes is) and, if policy is not
// empty, GPUScore's policy replaced.
func WhatIfProfile(data []byte, schedulerName, policy string) (*config.KubeSchedulerProfile, error) {
	cfg, err := offline.LoadConfig(data)
	if err != nil {
		return nil, err
	}
	prof, err := offline.Profile(cfg, schedulerName)
	if err != nil {
		return nil, err
	}
	prof.PercentageOfNodesToScore = ptr.To[int32](100)
	if policy != "" {
		p, err := gpu.ParsePolicy(policy)
		if err != nil {
			return nil, err
		}
		found := false
		for _, pc := range prof.PluginConfig {
			if a, ok := pc.Args.(*ourconfig.GPUScoreArgs); ok {
				a.Policy, found = string(p), true
			}
		}
		if !found {
			return nil, fmt.Errorf("the profile %q has no GPUScore to set the policy of", schedulerName)
		}
	}
	return prof, nil
}

// Deployed is a scheduler profile's plugins on a copy of a cluster (its
// nodes and the pods bound to them): what the deployed scheduler counts and
// learns, without a scheduler. Close it when done.
type Deployed struct {
	fw      framework.Framework
	cluster *offline.Cluster
	cancel  context.CancelFunc
}

// NewDeployed builds prof's plugins over the cluster. seen are pods whose
// requests the scheduler has already seen (the cluster's pods, oldest
// first): a learned target workload learns them first.
func NewDeployed(ctx context.Context, prof *config.KubeSchedulerProfile, nodes []*v1.Node, bound, seen []*v1.Pod) (*Deployed, error) {
	cluster, err := offline.NewCluster(nodes, bound)
	if err != nil {
		return nil, err
	}
	client, _ := newClient()
	// Quiet: a command's output is not the place for the framework's logs
	// (its errors come back as errors).
	ctx, cancel := context.WithCancel(klog.NewContext(ctx, logr.Discard()))
	fw, _, err := offline.NewFramework(ctx, prof, cluster, client, offline.Options{})
	if err != nil {
		cancel()
		return nil, err
	}
	if !slices.ContainsFunc(fw.ListPlugins().Filter.Enabled, func(p config.Plugin) bool { return p.Name == gpufit.Name }) {
		fw.Close()
		cancel()
		return nil, fmt.Errorf("the profile %q has no %s", prof.SchedulerName, gpufit.Name)
	}
	for _, p := range seen {
		// PreFilter is where GPUFit observes a request.
		fw.RunPreFilterPlugins(ctx, framework.NewCycleState(), p)
	}
	return &Deployed{fw: fw, cluster: cluster, cancel: cancel}, nil
}

// Close stops the plugins.
func (d *Deployed) Close() {
	d.fw.Close()
	d.cancel()
}

// Tracker is the profile's GPU accounting: how it reads nodes and requests.
func (d *Deployed) Tracker() *gpu.Tracker { return gpufit.TrackerOf(d.fw) }

// Workload is the target workload GPUScore measures fragmentation against
// (its static tasks, or what it learned from the pods seen); nil if none.
func (d *Deployed) Workload() *gpu.Workload { return gpufit.WorkloadOf(d.fw) }

// WhatIf places pods, one after the other, on a copy of a cluster (its nodes
// and the pods bound to them) through the real framework profile, and says
// where each would go and which stay pending. Nothing is written anywhere:
// a placed pod is reserved and added to the copy, as the scheduler assumes
// it before binding. seen are as in NewDeployed.
func WhatIf(ctx context.Context, prof *config.KubeSchedulerProfile, nodes []*v1.Node, bound, seen, pods []*v1.Pod) ([]WhatIfPlacement, error) {
	d, err := NewDeployed(ctx, prof, nodes, bound, seen)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.Place(ctx, pods)
}

// Place places pods, one after the other, as WhatIf says; each placed pod
// stays assumed on the copy.
func (d *Deployed) Place(ctx context.Context, pods []*v1.Pod) ([]WhatIfPlacement, error) {
	fw, cluster, prof := d.fw, d.cluster, d.fw.ProfileName()
	out := make([]WhatIfPlacement, 0, len(pods))
	for i, p := range pods {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		pod := p.DeepCopy()
		pod.Spec.SchedulerName = prof
		pod.Spec.NodeName = ""
		if pod.Namespace == "" {
			pod.Namespace = "default"
		}
		if pod.UID == "" {
			pod.UID = types.UID(fmt.Sprintf("whatif-%d-%s", i, pod.Name))
		}
		pl := WhatIfPlacement{Namespace: pod.Namespace, Name: pod.Name}
		res := offline.Schedule(ctx, fw, cluster, pod)
		if res.Node == "" {
			if res.Err == nil {
				return nil, fmt.Errorf("pod %s: no node and no reason", pod.Name)
			}
			if _, fit := res.Err.(*framework.FitError); !fit {
				return nil, fmt.Errorf("pod %s: %w", pod.Name, res.Err)
			}
			pl.Reason = strings.TrimSpace(res.Err.Error())
			out = append(out, pl)
			continue
		}
		assumed := pod.DeepCopy()
		assumed.Spec.NodeName = res.Node
		if st := fw.RunReservePluginsReserve(ctx, res.State, assumed, res.Node); !st.IsSuccess() {
			fw.RunReservePluginsUnreserve(ctx, res.State, assumed, res.Node)
			pl.Reason = "reserve: " + st.Message()
			out = append(out, pl)
			continue
		}
		pl.Node = res.Node
		if t := gpufit.TrackerOf(fw); t != nil {
			if _, r, ok := t.Reserved(assumed.UID); ok {
				pl.Devices = gpu.NewAssignment(res.Node, r.Choice).String()
			}
		}
		// Assumed, as the scheduler's cache holds it until the bind: its
		// reservation counts for the pods after it.
		if err := cluster.Bind(assumed); err != nil {
			return nil, err
		}
		out = append(out, pl)
	}
	return out, nil
}
