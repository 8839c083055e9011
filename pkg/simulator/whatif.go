package simulator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"

	ourconfig "github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/offline"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/gpufit"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/gpuscore"
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
	noPublishing(prof)
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
	// The copy has no queue, and its informers none of the pods: the
	// requeue reconciler would only sweep away, as their pods' gone, the
	// reservations that hold what it placed.
	prof = prof.DeepCopy()
	for _, pc := range prof.PluginConfig {
		if a, ok := pc.Args.(*ourconfig.GPUFitArgs); ok {
			a.Requeue.Enabled = false
		}
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
	d := &Deployed{fw: fw, cluster: cluster, cancel: cancel}
	d.Observe(ctx, seen)
	return d, nil
}

// Observe has a learned target workload learn pods' requests, in order, as
// the scheduler does when it first tries each.
func (d *Deployed) Observe(ctx context.Context, pods []*v1.Pod) {
	for _, p := range pods {
		// PreFilter is where GPUFit observes a request.
		d.fw.RunPreFilterPlugins(ctx, framework.NewCycleState(), p)
	}
}

// PinFleet has the profile count f as the cluster's GPUs per model, in
// place of the copy's nodes (gpuscore.PinFleet).
func (d *Deployed) PinFleet(f *gpu.Fleet) { gpuscore.PinFleet(d.fw, f) }

// AddDRA gives the profile's accounting the GPUs DRA drivers publish and
// the claims on them.
func (d *Deployed) AddDRA(slices []*resourceapi.ResourceSlice, claims []*resourceapi.ResourceClaim) {
	x := gpufit.ClaimsOf(d.fw)
	if x == nil {
		return
	}
	for _, s := range slices {
		x.SliceChanged(nil, s)
	}
	for _, c := range claims {
		x.ClaimChanged(nil, c)
	}
}

// Close stops the plugins.
func (d *Deployed) Close() {
	d.fw.Close()
	d.cancel()
}

// Tracker is the profile's GPU accounting: how it reads nodes and requests.
func (d *Deployed) Tracker() *gpu.Tracker { return gpufit.TrackerOf(d.fw) }

// PinWorkload makes wl the target workload, in place of the one learned
// from the pods seen (the scheduler's own, as it published it).
func (d *Deployed) PinWorkload(wl *gpu.Workload) { gpufit.PinWorkload(d.fw, wl) }

// ResumeWorkload goes on learning from the target the scheduler published,
// as the scheduler will; where it cannot (see gpufit.ResumeWorkload), it
// pins the target as published. pods are the profile's pods that exist,
// oldest first: those the export stands for are taken as seen, and those
// the scheduler learned since (or will) are learned here, in order.
func (d *Deployed) ResumeWorkload(ctx context.Context, e gpu.ExportedWorkload, pods []*v1.Pod) (resumed bool, why string, err error) {
	resumed, why, err = gpufit.ResumeWorkload(d.fw, e)
	if !resumed || err != nil {
		return resumed, why, err
	}
	before, after := SinceExport(e, pods)
	uids := make([]string, len(before))
	for i, p := range before {
		uids[i] = string(p.UID)
	}
	d.Learner().MarkSeen(uids...)
	d.Observe(ctx, after)
	return true, "", nil
}

// scheduled is the pod's PodScheduled condition, nil if the scheduler has
// not said whether it fits: a gated pod's (reason SchedulingGated) is the
// API server's, and stays until the scheduler tries the pod.
func scheduled(p *v1.Pod) *v1.PodCondition {
	for i, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Reason != v1.PodReasonSchedulingGated {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// tried: the scheduler has said whether the pod fits.
func tried(p *v1.Pod) bool { return scheduled(p) != nil }

// firstTried is when the scheduler first found the pod would not fit (the
// condition turned False then, and stays so while it waits; for a pod that
// was gated, when the gate came: the time of its first try is lost); ok
// false if it has not said so.
func firstTried(p *v1.Pod) (at time.Time, ok bool) {
	if c := scheduled(p); c != nil && c.Status == v1.ConditionFalse {
		return c.LastTransitionTime.Time, true
	}
	return time.Time{}, false
}

// exportSlack is how long before an export a pod may have been created and
// not yet observed by the scheduler (the export's time and creation times
// have second precision, and a pod is tried moments after it is created).
const exportSlack = 2 * time.Second

// SinceExport splits the profile's pods (oldest first) into those an export
// stands for and those the scheduler observed after it, or has yet to. A
// pod the export names among the last observed is before it. A pending pod
// the scheduler never tried is after it; one it tried and found no room
// for is split by when it was first tried, any other by when it was
// created: after the export's time less exportSlack is after it. A pod
// held by scheduling gates, or deleted before it was tried, is in neither:
// the scheduler will not try it. The split is by the API server's clock
// against the scheduler's, within exportSlack.
func SinceExport(e gpu.ExportedWorkload, pods []*v1.Pod) (before, after []*v1.Pod) {
	recent := make(map[string]bool, len(e.Recent))
	for _, uid := range e.Recent {
		recent[uid] = true
	}
	for _, p := range pods {
		at := p.CreationTimestamp.Time
		if t, ok := firstTried(p); ok && p.Spec.NodeName == "" && t.After(at) {
			at = t
		}
		switch {
		case recent[string(p.UID)]:
			before = append(before, p)
		case len(p.Spec.SchedulingGates) > 0 || p.Spec.NodeName == "" && !tried(p) && p.DeletionTimestamp != nil:
		case p.Spec.NodeName == "" && !tried(p):
			after = append(after, p) // in the queue still, or in flight
		case at.Before(e.At.Add(-exportSlack)):
			before = append(before, p)
		default:
			after = append(after, p)
		}
	}
	return before, after
}

// noPublishing: a simulation publishes no target on any lease.
func noPublishing(prof *config.KubeSchedulerProfile) {
	for _, pc := range prof.PluginConfig {
		if a, ok := pc.Args.(*ourconfig.GPUScoreArgs); ok {
			a.TargetWorkload.PublishTo = ""
		}
	}
}

// Learner is the profile's learner, nil for a static target workload.
func (d *Deployed) Learner() *gpu.Learner { return gpufit.LearnerOf(d.fw) }

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
	return d.Place(ctx, pods, nil)
}

// Place places pods, one after the other, as WhatIf says; each placed pod
// stays assumed on the copy. The members of a pod group (a gang:
// spec.schedulingGroup.podGroupName) are placed together, at the place of
// the first, all or nothing: need says how many of a group's given members
// must fit (nil, or -1: all of them), and whether the group is a gang at
// all; if fewer fit, none is placed and their devices are free for the
// pods after them.
func (d *Deployed) Place(ctx context.Context, pods []*v1.Pod, need func(namespace, group string) (int, bool)) ([]WhatIfPlacement, error) {
	out := make([]WhatIfPlacement, len(pods))
	done := make([]bool, len(pods))
	for i, p := range pods {
		if done[i] {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ns, group := namespaceOf(p), groupOf(p)
		want, gang := -1, group != ""
		if gang && need != nil {
			want, gang = need(ns, group)
		}
		if !gang {
			pl, _, err := d.placeOne(ctx, i, p)
			if err != nil {
				return nil, err
			}
			out[i], done[i] = pl, true
			continue
		}
		var members []int
		for j := i; j < len(pods); j++ {
			if !done[j] && groupOf(pods[j]) == group && namespaceOf(pods[j]) == ns {
				members = append(members, j)
			}
		}
		if want < 0 {
			want = len(members)
		}
		var placed []undo
		for _, j := range members {
			pl, u, err := d.placeOne(ctx, j, pods[j])
			if err != nil {
				return nil, err
			}
			out[j], done[j] = pl, true
			if u != nil {
				placed = append(placed, *u)
			}
		}
		if len(placed) >= want {
			continue
		}
		// Not enough: as the scheduler's gang, nothing binds, and what the
		// members held is released.
		for _, u := range placed {
			d.fw.RunReservePluginsUnreserve(ctx, u.state, u.pod, u.pod.Spec.NodeName)
			if err := d.cluster.Remove(u.pod); err != nil {
				return nil, err
			}
		}
		why := fmt.Sprintf("gang %s: %d of its %d members given would fit, and it needs %d; none is placed (all or nothing)", group, len(placed), len(members), want)
		for _, j := range members {
			own := out[j].Reason
			out[j].Node, out[j].Devices, out[j].Reason = "", "", why
			if own != "" {
				out[j].Reason += "; this one: " + own
			}
		}
	}
	return out, nil
}

// undo is what takes a placed pod back.
type undo struct {
	pod   *v1.Pod
	state fwk.CycleState
}

func namespaceOf(p *v1.Pod) string {
	if p.Namespace == "" {
		return "default"
	}
	return p.Namespace
}

func groupOf(p *v1.Pod) string {
	if g := p.Spec.SchedulingGroup; g != nil && g.PodGroupName != nil {
		return *g.PodGroupName
	}
	return ""
}

// placeOne schedules one pod on the copy and, if it fits, reserves and
// assumes it, as the scheduler's cache holds it until the bind: its
// reservation counts for the pods after it.
func (d *Deployed) placeOne(ctx context.Context, i int, p *v1.Pod) (WhatIfPlacement, *undo, error) {
	fw, cluster := d.fw, d.cluster
	pod := p.DeepCopy()
	pod.Spec.SchedulerName = fw.ProfileName()
	pod.Spec.NodeName = ""
	pod.Namespace = namespaceOf(p)
	if pod.UID == "" {
		pod.UID = types.UID(fmt.Sprintf("whatif-%d-%s", i, pod.Name))
	}
	pl := WhatIfPlacement{Namespace: pod.Namespace, Name: pod.Name}
	res := offline.Schedule(ctx, fw, cluster, pod)
	if res.Node == "" {
		if res.Err == nil {
			return pl, nil, fmt.Errorf("pod %s: no node and no reason", pod.Name)
		}
		if _, fit := res.Err.(*framework.FitError); !fit {
			return pl, nil, fmt.Errorf("pod %s: %w", pod.Name, res.Err)
		}
		pl.Reason = strings.TrimSpace(res.Err.Error())
		return pl, nil, nil
	}
	assumed := pod.DeepCopy()
	assumed.Spec.NodeName = res.Node
	if st := fw.RunReservePluginsReserve(ctx, res.State, assumed, res.Node); !st.IsSuccess() {
		fw.RunReservePluginsUnreserve(ctx, res.State, assumed, res.Node)
		pl.Reason = "reserve: " + st.Message()
		return pl, nil, nil
	}
	pl.Node = res.Node
	if t := gpufit.TrackerOf(fw); t != nil {
		if _, r, ok := t.Reserved(assumed.UID); ok {
			pl.Devices = gpu.NewAssignment(res.Node, r.Choice).String()
		}
	}
	if err := cluster.Bind(assumed); err != nil {
		return pl, nil, err
	}
	return pl, &undo{pod: assumed, state: res.State}, nil
}

// NodesScored is how many feasible nodes the scheduler finds before it
// scores, out of numAllNodes (kube-scheduler's numFeasibleNodesToFind,
// v1.37.2): all of them below 100; else the profile's
// percentageOfNodesToScore, else the configuration's, where 0 is adaptive
// (50% less 1% per 125 nodes, at least 5%); never fewer than 100. It looks
// for them from a start that rotates with every pod it schedules.
func NodesScored(profile *int32, global int32, numAllNodes int) int {
	const minNodes, minPercentage = 100, 5
	if numAllNodes < minNodes {
		return numAllNodes
	}
	percentage := global
	if profile != nil {
		percentage = *profile
	}
	if percentage == 0 {
		percentage = max(int32(50)-int32(numAllNodes/125), minPercentage)
	}
	return max(numAllNodes*int(percentage)/100, minNodes)
}
