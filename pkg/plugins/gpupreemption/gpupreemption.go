// Package gpupreemption is the GPUPreemption plugin: the upstream
// DefaultPreemption, whose dry run evicts the fewest GPU pods at the device
// level, and which holds the freed devices for the preemptor while it is
// nominated.
//
// Upstream removes every lower-priority pod from a copy of the node, then
// reprieves them one by one, most important first, while the preemptor
// still fits. Which pods stay victims depends on that order, not on the
// devices: a whole-GPU preemptor could evict the shares of two devices, a
// 500m share two pods where one 600m share was enough. GPUPreemption plans
// the eviction device by device (gpu.Tracker.PlanEviction) and orders the
// reprieve so that the planned victims come last. Everything else is
// upstream's: the filters still decide every reprieve, PodDisruptionBudgets
// are kept as upstream keeps them, and the node is chosen among the
// candidates as upstream chooses it.
package gpupreemption

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"

	v1 "k8s.io/api/core/v1"
	policy "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/defaultpreemption"
	plfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/preemption"
	schedutil "k8s.io/kubernetes/pkg/scheduler/util"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/scheme"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/validation"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/internal/shared"
)

// Name is the plugin's name in the registry and in configs.
const Name = "GPUPreemption"

// GPUPreemption is DefaultPreemption with device-level victims. It replaces
// DefaultPreemption in a profile (both at once would preempt twice).
type GPUPreemption struct {
	*defaultpreemption.DefaultPreemption
	handle fwk.Handle
	shared *shared.Shared
	// plans holds, per node, the eviction planned for the pod whose
	// preemption runs (one at a time; nodes are dry-run in parallel).
	plans sync.Map
}

type plan struct {
	preemptor types.UID
	victims   map[types.UID]bool
	// freed is set once the dry run chose the victims: the devices the
	// preemptor is to get.
	freed gpu.Choice
	ok    bool
}

var (
	_ fwk.PostFilterPlugin         = &GPUPreemption{}
	_ fwk.PreEnqueuePlugin         = &GPUPreemption{}
	_ fwk.EnqueueExtensions        = &GPUPreemption{}
	_ preemption.Interface         = &GPUPreemption{}
	_ fwk.PodGroupPostFilterPlugin = &GPUPreemption{}
)

// New builds the plugin from validated args.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	var args *config.GPUPreemptionArgs
	switch a := obj.(type) {
	case nil:
		args = scheme.DefaultGPUPreemptionArgs()
	case *config.GPUPreemptionArgs:
		args = a
	default:
		return nil, fmt.Errorf("want args of type GPUPreemptionArgs, got %T", obj)
	}
	if err := validation.ValidateGPUPreemptionArgs(field.NewPath("args"), args); err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	fts := plfeature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	dp, err := defaultpreemption.New(ctx, &schedconfig.DefaultPreemptionArgs{
		MinCandidateNodesPercentage: args.MinCandidateNodesPercentage,
		MinCandidateNodesAbsolute:   args.MinCandidateNodesAbsolute,
	}, h, fts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	pl := &GPUPreemption{DefaultPreemption: dp, handle: h, shared: shared.For(h)}
	context.AfterFunc(ctx, func() { shared.Forget(h) })
	upstream := dp.MoreImportantVictim
	dp.MoreImportantVictim = func(a, b preemption.Victim) bool {
		// Planned victims are reprieved last: whatever else fits stays.
		if ia, ib := pl.planned(a), pl.planned(b); ia != ib {
			return ib
		}
		return upstream(a, b)
	}
	// The evaluator calls back into this plugin for the dry run.
	dp.Evaluator = preemption.NewEvaluator(Name, h, pl, dp.Executor)
	return pl, nil
}

// Name returns the plugin's name.
func (pl *GPUPreemption) Name() string { return Name }

// PostFilter runs upstream's preemption; when it nominates a node, the
// devices its victims free are held for the pod there until it is bound.
func (pl *GPUPreemption) PostFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, m fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	pl.plans.Clear()
	defer pl.plans.Clear()
	t := pl.shared.Tracker()
	res, status := pl.DefaultPreemption.PostFilter(ctx, state, pod, m)
	if res == nil || res.NominatingInfo.Mode() == fwk.ModeNoop {
		// No change (a victim on the nominated node is still terminating,
		// or the preemption failed): the pod stays nominated there, and
		// the very devices its victims free stay held for it, not the
		// tightest free ones the nominee fallback would pick. (Its own
		// record is not read in its dry run: it is no nominee of its own.)
		return res, status
	}
	if t != nil {
		// Whatever an earlier preemption freed for it no longer holds.
		t.Denominate(pod.UID)
	}
	if res.NominatedNodeName == "" {
		return res, status
	}
	if t != nil {
		if v, ok := pl.plans.Load(res.NominatedNodeName); ok {
			if p := v.(*plan); p.preemptor == pod.UID && p.ok {
				t.Nominate(pod.UID, res.NominatedNodeName, p.freed)
				klog.FromContext(ctx).V(4).Info("GPUs held for the preemptor", "pod", klog.KObj(pod), "node", res.NominatedNodeName, "devices", p.freed.Devices(), "milli", p.freed.Milli)
			}
		}
	}
	return res, status
}

// SelectVictimsOnNode is upstream's, with the GPU pods the plan evicts
// reprieved last. Pods that request no GPU, and profiles without GPUFit,
// get upstream's order.
func (pl *GPUPreemption) SelectVictimsOnNode(ctx context.Context, cs fwk.CycleState, preemptor *v1.Pod, nodeInfo fwk.NodeInfo,
	all []*preemption.DomainVictim, pdbs []*policy.PodDisruptionBudget) ([]*v1.Pod, int, *fwk.Status) {
	node := nodeInfo.Node()
	t := pl.shared.Tracker()
	req, err := shared.ReadRequest(cs)
	if t == nil || err != nil || !req.HasGPU() {
		pl.plans.Delete(node.Name)
		return pl.DefaultPreemption.SelectVictimsOnNode(ctx, cs, preemptor, nodeInfo, all, pdbs)
	}
	before := shared.PodsOf(nodeInfo)
	var eligible []*preemption.DomainVictim
	prio := corev1helpers.PodPriority(preemptor)
	for _, dv := range all {
		if dv.Priority() < prio && pl.eligible(dv, preemptor) {
			eligible = append(eligible, dv)
		}
	}
	allowed := make([]int32, len(pdbs))
	for i, b := range pdbs {
		allowed[i] = b.Status.DisruptionsAllowed
	}
	candidates := map[types.UID]gpu.Victim{}
	for _, dv := range eligible {
		for _, p := range dv.Pods() {
			if pod := p.GetPod(); pod.Spec.NodeName == node.Name {
				// A group is evicted whole, on every node it spans.
				candidates[pod.UID] = gpu.Victim{Priority: dv.Priority(), Pods: len(dv.Pods()), Budgets: budgetsOf(pod, pdbs)}
			}
		}
	}
	// The other nominees as important count in, as in the filters of the
	// dry run: the devices held for them are not the preemptor's to free.
	in := before
	for _, np := range pl.handle.NominatedPodsForNode(node.Name) {
		o := np.GetPod()
		if o.UID == preemptor.UID || o.Spec.NodeName != "" || corev1helpers.PodPriority(o) < prio {
			continue
		}
		// The accounting counts a pod as a nominee by its status or by
		// what a preemption held for it.
		if _, held := t.Nominated(o.UID, node.Name); held || o.Status.NominatedNodeName == node.Name {
			if len(in) == len(before) {
				in = slices.Clone(before)
			}
			in = append(in, o)
		}
	}
	p := &plan{preemptor: preemptor.UID}
	e, planned := t.PlanEviction(node, in, req, candidates, allowed)
	if planned {
		p.victims = make(map[types.UID]bool, len(e.UIDs))
		for _, uid := range e.UIDs {
			p.victims[uid] = true
		}
	}
	pl.plans.Store(node.Name, p)

	pods, violations, status := pl.DefaultPreemption.SelectVictimsOnNode(ctx, cs, preemptor, nodeInfo, all, pdbs)
	if !status.IsSuccess() || len(pods) == 0 {
		return pods, violations, status
	}
	chosen := make(map[types.UID]bool, len(pods))
	for _, v := range pods {
		chosen[v.UID] = true
	}
	if planned {
		// The reprieve order charged the budgets to the pods it tried last
		// (ours): count the breaks of the victims alone, as they are what
		// is evicted. And the victims in upstream's order, most important
		// first: the node is ranked by its first victim's priority.
		var final []*preemption.DomainVictim
		for _, dv := range eligible {
			if in := dv.Pods(); len(in) > 0 && chosen[in[0].GetPod().UID] {
				final = append(final, dv)
			}
		}
		violating, _ := preemption.FilterVictimsWithPDBViolation(final, pdbs)
		violations = 0
		for _, v := range violating {
			violations += v.ViolateCount
		}
		sort.SliceStable(pods, func(i, j int) bool { return schedutil.MoreImportantPod(pods[i], pods[j]) })
	}
	// nodeInfo is now the node without the victims. Devices already held
	// for other nominees as important go to them.
	var taken uint64
	for _, np := range pl.handle.NominatedPodsForNode(node.Name) {
		if o := np.GetPod(); o.UID != preemptor.UID && corev1helpers.PodPriority(o) >= prio {
			if c, here := t.Nominated(o.UID, node.Name); here {
				taken |= c.Mask
			}
		}
	}
	p.freed, p.ok = t.FreedFor(node, shared.PodsOf(nodeInfo), req, t.HeldBy(node, before, chosen), taken)
	if logger := klog.FromContext(ctx).V(4); logger.Enabled() {
		why := "no GPU eviction planned: upstream's order"
		if planned {
			why = e.Why
		}
		logger.Info("GPU preemption victims on node", "pod", klog.KObj(preemptor), "node", node.Name,
			"victims", klog.KObjSlice(pods), "plan", why, "followed", planned && sameSet(p.victims, chosen), "devices", p.freed.Devices())
	}
	return pods, violations, status
}

// budgetsOf is the PodDisruptionBudgets that count a pod's eviction, as
// upstream matches them (FilterVictimsWithPDBViolation).
func budgetsOf(pod *v1.Pod, pdbs []*policy.PodDisruptionBudget) []int {
	if len(pod.Labels) == 0 {
		return nil
	}
	var out []int
	for i, b := range pdbs {
		if b.Namespace != pod.Namespace {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		if _, done := b.Status.DisruptedPods[pod.Name]; done {
			continue
		}
		out = append(out, i)
	}
	return out
}

// planned reports whether a victim is in the eviction planned on its node.
func (pl *GPUPreemption) planned(v preemption.Victim) bool {
	for _, pi := range v.Pods() {
		pod := pi.GetPod()
		if x, ok := pl.plans.Load(pod.Spec.NodeName); ok && x.(*plan).victims[pod.UID] {
			return true
		}
	}
	return false
}

// eligible is upstream's IsEligiblePod on every node the victim spans.
func (pl *GPUPreemption) eligible(dv *preemption.DomainVictim, preemptor *v1.Pod) bool {
	for _, ni := range dv.AffectedNodes() {
		if !pl.IsEligiblePod(ni, dv, preemptor) {
			return false
		}
	}
	return true
}

func sameSet(a, b map[types.UID]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

// PodGroupPostFilter is upstream's pod group preemption with each pod's
// devices planned as the single-pod path plans them. Upstream removes every
// lower-priority victim, places the group, then reprieves the victims most
// important first while every pod still passes its filters. Here each pod
// is pinned, in that dry run, to the devices its plan frees (GPUFit's
// Filter and Reserve then take those and no others): a victim on them stays
// evicted, every other is reprieved. The pins are checked first as the
// reprieve will see them with every victim gone; where any GPU pod has no
// plan, or a pinned pod would not pass, nothing is pinned and upstream's
// order decides. The devices are held for the pods while they are
// nominated, as for a single preemptor.
func (pl *GPUPreemption) PodGroupPostFilter(ctx context.Context, state fwk.PodGroupCycleState, pgInfo fwk.PodGroupInfo, run fwk.PodGroupSchedulingFunc) (*fwk.PodGroupPostFilterResult, *fwk.Status) {
	t := pl.shared.Tracker()
	if t == nil {
		return pl.DefaultPreemption.PodGroupPostFilter(ctx, state, pgInfo, run)
	}
	g := pl.newGroupPlan(t, pgInfo.GetUnscheduledPods())
	pinned := func(ctx context.Context) (*fwk.PodGroupAssignments, *fwk.Status) {
		a, s := run(ctx)
		if s.IsSuccess() && a != nil {
			pl.pinGroup(ctx, t, g, a.ProposedAssignments)
		}
		return a, s
	}
	res, status := pl.DefaultPreemption.PodGroupPostFilter(ctx, state, pgInfo, pinned)
	switch {
	case !g.planned:
		// An ongoing preemption (victims still terminating) or none: what
		// is held for the pods stays held.
	case !status.IsSuccess() || res == nil:
		g.restore(t, nil)
	default:
		for _, m := range g.members {
			ni, nominated := res.NominatingInfos[types.NamespacedName{Namespace: m.Namespace, Name: m.Name}]
			p := g.pins[m.UID]
			switch {
			case !nominated || ni == nil:
				// Not placed: it keeps its nomination, and what was held.
				g.restore(t, m)
			case p != nil && ni.NominatedNodeName == p.Node:
				t.Nominate(m.UID, p.Node, p.Choice)
				klog.FromContext(ctx).V(4).Info("GPUs held for the pod group's preemptor", "pod", klog.KObj(m), "node", p.Node, "devices", p.Choice.Devices(), "milli", p.Choice.Milli)
			default:
				t.Denominate(m.UID)
			}
		}
	}
	return res, status
}

// groupPlan is one pod group preemption's device plan.
type groupPlan struct {
	members []*v1.Pod
	member  map[types.UID]bool
	// saved is what was held for the members before: put back if the
	// preemption fails.
	saved map[types.UID]savedHold
	// before is the snapshot's nodes as they were before upstream removed
	// the victims (its mutations work on clones).
	before  []fwk.NodeInfo
	pins    map[types.UID]*shared.Pin
	planned bool
}

type savedHold struct {
	node   string
	choice gpu.Choice
}

func (pl *GPUPreemption) newGroupPlan(t *gpu.Tracker, members []*v1.Pod) *groupPlan {
	g := &groupPlan{members: members, member: make(map[types.UID]bool, len(members)), saved: map[types.UID]savedHold{}}
	for _, m := range members {
		g.member[m.UID] = true
		if n, c, ok := t.Nomination(m.UID); ok {
			g.saved[m.UID] = savedHold{node: n, choice: c}
		}
	}
	g.before, _ = pl.handle.SnapshotSharedLister().NodeInfos().List()
	return g
}

// restore puts back what was held for one member (all when m is nil).
func (g *groupPlan) restore(t *gpu.Tracker, m *v1.Pod) {
	for _, p := range g.members {
		if m != nil && p.UID != m.UID {
			continue
		}
		if h, ok := g.saved[p.UID]; ok {
			t.Nominate(p.UID, h.node, h.choice)
		} else {
			t.Denominate(p.UID)
		}
	}
}

// pinGroup plans, pod by pod in the group's order, the devices each pod's
// victims free on the node upstream placed it, as the single-pod path
// plans them (gpu.Tracker.PlanEviction): with the victims planned for
// earlier pods gone (a victim group that is evicted whole, on every node),
// the budgets they break spent, and the devices planned for earlier pods
// held; and pins each pod's cycle state to its devices, once all are
// planned and checked.
func (pl *GPUPreemption) pinGroup(ctx context.Context, t *gpu.Tracker, g *groupPlan, as []fwk.ProposedAssignment) {
	g.planned = true
	g.pins = map[types.UID]*shared.Pin{}
	for _, m := range g.members {
		t.Denominate(m.UID)
	}
	logger := klog.FromContext(ctx)
	lister := pl.handle.SnapshotSharedLister()
	pgs := lister.PodGroups()
	var pdbs []*policy.PodDisruptionBudget
	if l := pl.handle.SharedInformerFactory().Policy().V1().PodDisruptionBudgets().Lister(); l != nil {
		pdbs, _ = l.List(labels.Everything())
	}
	allowed := make([]int32, len(pdbs))
	for i, b := range pdbs {
		allowed[i] = b.Status.DisruptionsAllowed
	}
	before := map[string]fwk.NodeInfo{}
	for _, a := range as {
		before[a.GetNodeName()] = nil
	}
	for _, ni := range g.before {
		if n := ni.Node(); n != nil {
			if _, want := before[n.Name]; want {
				before[n.Name] = ni
			}
		}
	}
	units := victimUnits{pgs: pgs, nodes: g.before}
	gone := map[types.UID]bool{}          // the victims planned so far
	placed := map[string][]*v1.Pod{}      // the group's pods planned on each node
	pinned := map[types.UID]*shared.Pin{} // by pod, until all are checked
	states := map[types.UID]fwk.CycleState{}
	unplanned := ""
	for _, a := range as {
		node, m, cs := a.GetNodeName(), a.GetPod(), a.GetCycleState()
		if node == "" || cs == nil {
			continue
		}
		req, err := shared.ReadRequest(cs)
		if err != nil || !req.HasGPU() {
			continue
		}
		ni, err := lister.NodeInfos().Get(node)
		orig := before[node]
		if err != nil || ni.Node() == nil || orig == nil {
			unplanned = m.Name
			break
		}
		// The pod's own priority: the scheduler's filters count the
		// nominees at least as important as the pod, not its group.
		prio := corev1helpers.PodPriority(m)
		now := make(map[types.UID]bool, len(ni.GetPods()))
		for _, pi := range ni.GetPods() {
			now[pi.GetPod().UID] = true
		}
		candidates := map[types.UID]gpu.Victim{}
		var in []*v1.Pod
		seen := map[types.UID]bool{}
		for _, pi := range orig.GetPods() {
			p := pi.GetPod()
			if gone[p.UID] || g.member[p.UID] {
				continue
			}
			in = append(in, p)
			seen[p.UID] = true
			if !now[p.UID] {
				// Upstream removed it: a victim.
				if units.composite(p) {
					// Upstream costs and evicts it with its composite
					// group, which the plan does not model.
					unplanned = m.Name
					break
				}
				candidates[p.UID] = gpu.Victim{Priority: preemption.GetPodPriority(p, pgs, nil), Pods: units.size(p), Budgets: budgetsOf(p, pdbs)}
			}
		}
		if unplanned != "" {
			break
		}
		// The group's pods planned here hold their devices (their records);
		// the nominees the filters add (any, the group's own with a
		// nomination from before among them) hold what the accounting
		// gives them.
		for _, p := range placed[node] {
			in = append(in, p)
			seen[p.UID] = true
		}
		var taken uint64
		for _, np := range pl.handle.NominatedPodsForNode(node) {
			o := np.GetPod()
			if o.UID == m.UID || seen[o.UID] || o.Spec.NodeName != "" || corev1helpers.PodPriority(o) < prio {
				continue
			}
			c, held := t.Nominated(o.UID, node)
			if !held && gpu.UsesGPU(o, t.RequestOptions()) {
				// A nominee without devices of its own is laid down where
				// it fits as victims come back: it could land on a pinned
				// device and make upstream evict a victim the plan spares.
				unplanned = m.Name
				break
			}
			in = append(in, o)
			seen[o.UID] = true
			taken |= c.Mask
		}
		if unplanned != "" {
			break
		}
		e, planned := t.PlanEviction(ni.Node(), in, req, candidates, allowed)
		victims := map[types.UID]bool{}
		if planned {
			for _, uid := range e.UIDs {
				victims[uid] = true
			}
		}
		rest := make([]*v1.Pod, 0, len(in))
		for _, p := range in {
			if !victims[p.UID] {
				rest = append(rest, p)
			}
		}
		choice, ok := t.FreedFor(ni.Node(), rest, req, t.HeldBy(ni.Node(), in, victims), taken)
		if !ok {
			unplanned = m.Name
			break
		}
		for uid := range victims {
			v := candidates[uid]
			for _, b := range v.Budgets {
				allowed[b]--
			}
			for _, u := range units.of(uid, orig) {
				gone[u] = true
			}
		}
		// Held while the rest of the group is planned: later pods on the
		// node plan around it.
		t.Nominate(m.UID, node, choice)
		if m.Spec.NodeName != "" {
			c := *m
			c.Spec.NodeName = ""
			m = &c
		}
		placed[node] = append(placed[node], m)
		pinned[m.UID] = &shared.Pin{Node: node, Choice: choice}
		states[m.UID] = cs
		why := "no GPU eviction needed"
		if planned {
			why = e.Why
		}
		logger.V(4).Info("pod group preemption: GPUs planned", "pod", klog.KObj(m), "node", node, "devices", choice.Devices(), "milli", choice.Milli, "plan", why)
	}
	if unplanned != "" {
		logger.V(4).Info("pod group preemption: no GPU plan for one of its pods, upstream's order for all", "pod", unplanned)
		for _, m := range g.members {
			t.Denominate(m.UID)
		}
		for uid := range pinned {
			t.Denominate(uid)
		}
		return
	}
	for uid, p := range pinned {
		_ = shared.WritePin(states[uid], p)
	}
	if !pl.pinsPass(ctx, as) {
		logger.V(4).Info("pod group preemption: the planned devices do not pass the filters, upstream's order for all")
		for uid := range pinned {
			_ = shared.WritePin(states[uid], nil)
			t.Denominate(uid)
		}
		return
	}
	g.pins = pinned
}

// pinsPass runs the group's pods through their filters and reservations, in
// order, as upstream's reprieve does, on the snapshot without any victim:
// a pin that fails there would fail for every victim, and upstream would
// then evict them all.
func (pl *GPUPreemption) pinsPass(ctx context.Context, as []fwk.ProposedAssignment) bool {
	lister := pl.handle.MutableSnapshotSharedLister()
	logger := klog.FromContext(ctx)
	var undo []func()
	defer func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}()
	for _, a := range as {
		node, pod, cs := a.GetNodeName(), a.GetPod(), a.GetCycleState()
		if node == "" || cs == nil {
			continue
		}
		ni, err := lister.NodeInfos().Get(node)
		if err != nil {
			return false
		}
		if s := pl.handle.RunFilterPluginsWithNominatedPods(ctx, cs, pod, ni); !s.IsSuccess() {
			logger.V(4).Info("pod group preemption: a pinned pod does not pass", "pod", klog.KObj(pod), "node", node, "status", s)
			return false
		}
		if err := lister.AddPod(a.GetPodInfo(), node); err != nil {
			return false
		}
		s := pl.handle.RunReservePluginsReserve(ctx, cs, pod, node)
		undo = append(undo, func() {
			pl.handle.RunReservePluginsUnreserve(ctx, cs, pod, node)
			_ = lister.RemovePod(logger, pod, node)
		})
		if !s.IsSuccess() {
			return false
		}
	}
	return true
}

// victimUnits are the victims as upstream evicts them: a pod alone, or the
// pods of a pod group whose disruption mode is All, together, on every
// node.
type victimUnits struct {
	pgs   fwk.PodGroupLister
	nodes []fwk.NodeInfo
	all   map[string][]types.UID // the pods of each All group, cluster-wide
}

// group is the pod's All group ("" when it is evicted alone).
func (u *victimUnits) group(p *v1.Pod) string {
	sg := p.Spec.SchedulingGroup
	if sg == nil || sg.PodGroupName == nil || u.pgs == nil {
		return ""
	}
	pg, err := u.pgs.Get(p.Namespace, *sg.PodGroupName)
	if err != nil || pg == nil || pg.Spec.DisruptionMode == nil || pg.Spec.DisruptionMode.All == nil {
		return ""
	}
	return p.Namespace + "/" + *sg.PodGroupName
}

// composite reports whether p's pod group belongs to a composite pod group.
func (u *victimUnits) composite(p *v1.Pod) bool {
	sg := p.Spec.SchedulingGroup
	if sg == nil || sg.PodGroupName == nil || u.pgs == nil {
		return false
	}
	pg, err := u.pgs.Get(p.Namespace, *sg.PodGroupName)
	return err == nil && pg != nil && pg.Spec.ParentCompositePodGroupName != nil
}

func (u *victimUnits) members(key string) []types.UID {
	if u.all == nil {
		u.all = map[string][]types.UID{}
		for _, ni := range u.nodes {
			for _, pi := range ni.GetPods() {
				if k := u.group(pi.GetPod()); k != "" {
					u.all[k] = append(u.all[k], pi.GetPod().UID)
				}
			}
		}
	}
	return u.all[key]
}

// size is how many pods evicting p takes.
func (u *victimUnits) size(p *v1.Pod) int {
	if k := u.group(p); k != "" {
		return max(len(u.members(k)), 1)
	}
	return 1
}

// of is the pods evicted with the victim uid (on node orig).
func (u *victimUnits) of(uid types.UID, orig fwk.NodeInfo) []types.UID {
	for _, pi := range orig.GetPods() {
		if p := pi.GetPod(); p.UID == uid {
			if k := u.group(p); k != "" {
				return u.members(k)
			}
			break
		}
	}
	return []types.UID{uid}
}
