// Package gpuscore is the GPUScore plugin: it ranks the nodes that fit a pod
// by the profile's GPU placement policy (fragmentation-aware by default) and
// keeps CPU-only pods off GPU nodes.
package gpuscore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/scheme"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/validation"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/gpufit"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/internal/shared"
)

// Name is the plugin's name in the registry and in configs.
const Name = "GPUScore"

// GPUScore scores nodes by the GPU placement policy.
type GPUScore struct {
	handle  fwk.Handle
	shared  *shared.Shared
	scoring gpu.Scoring
	// fleet is the cluster's GPUs per model, for Scoring.Scarce.
	fleet  atomic.Pointer[fleetView]
	cycles atomic.Uint64
}

// fleetView is the fleet counted from a snapshot of nodes many nodes long.
type fleetView struct {
	f     *gpu.Fleet
	nodes int
	at    time.Time
}

// A fleet count serves fleetEvery cycles or fleetTTL, whichever ends
// first, while the number of nodes stays the same: what a node's devices
// are changes rarely (a device plugin or GFD reporting a new node's), and
// counting costs a lookup per node.
const (
	fleetEvery = 256
	fleetTTL   = 30 * time.Second
)

var (
	_ fwk.PreScorePlugin = &GPUScore{}
	_ fwk.ScorePlugin    = &GPUScore{}
	_ fwk.SignPlugin     = &GPUScore{}
)

// New builds the plugin from validated args.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	var args *config.GPUScoreArgs
	switch a := obj.(type) {
	case nil:
		args = scheme.DefaultGPUScoreArgs()
	case *config.GPUScoreArgs:
		args = a
	default:
		return nil, fmt.Errorf("want args of type GPUScoreArgs, got %T", obj)
	}
	if err := validation.ValidateGPUScoreArgs(field.NewPath("args"), args); err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	policy, _ := gpu.ParsePolicy(args.Policy)
	sc := gpu.Scoring{
		Policy:           policy,
		Exact:            args.Scoring.Resolution == config.ResolutionExact,
		LeastIdle:        args.Scoring.LeastIdleTieBreak,
		NodePriority:     args.Scoring.NodePriorityTieBreak,
		MemoryAware:      args.Scoring.MemoryAware,
		CPUOnlyLeastIdle: args.Scoring.CPUOnlyLeastIdleTieBreak,
		ReferenceOrder:   args.Scoring.ReferenceNodeOrder,
		ExactDevice:      args.Scoring.ExactDeviceChoice,
		Strand:           float64(args.Scoring.StrandedGPUWeightPercent) / 100,
		Scarce:           float64(args.Scoring.ModelScarcityWeightPercent) / 100,
		// Set by the simulator only, with the trace's pod count.
		ReferenceArithmetic: args.Scoring.ReferenceArithmetic,
	}
	w := args.TargetWorkload
	if sc.ReferenceArithmetic && (w.Mode != config.WorkloadStatic || w.ReferenceTracePods <= 0) {
		return nil, fmt.Errorf("%s: the reference arithmetic needs a static target workload and the trace's pod count", Name)
	}
	if sc.ReferenceArithmetic && (sc.MemoryAware || sc.ExactDevice || sc.Strand != 0 || sc.Scarce != 0 || sc.Policy != gpu.Fragmentation) {
		// It is the published FGD's F, which has none of these.
		return nil, fmt.Errorf("%s: the reference arithmetic is the Fragmentation policy's, without memoryAware, exactDeviceChoice, strandedGPUWeightPercent or modelScarcityWeightPercent", Name)
	}
	s := shared.For(h)
	context.AfterFunc(ctx, func() { shared.Forget(h) })
	if w.Mode == config.WorkloadStatic {
		wl, err := StaticWorkload(w.Tasks)
		if err == nil && sc.ReferenceArithmetic {
			wl, err = gpu.NewReferenceWorkload(staticTasks(w.Tasks), w.ReferenceTracePods)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: args.targetWorkload: %w", Name, err)
		}
		s.SetScoring(sc, nil, wl)
	} else {
		l := gpu.NewLearner(float64(w.CoveragePercent)/100, int(w.HalfLifePods))
		if w.BucketCPU {
			l.BucketCPU()
		}
		s.SetScoring(sc, l, nil)
		if w.PublishTo != "" && h.ClientSet() != nil {
			go newPublisher(h.ClientSet(), w.PublishTo, gpufit.ProfileName(h), shared.LeaderElected(), s.Leading, l.Export).run(ctx)
		}
	}
	return &GPUScore{handle: h, shared: s, scoring: sc}, nil
}

// StaticWorkload turns configured tasks into a workload.
func StaticWorkload(tasks []config.WorkloadTask) (*gpu.Workload, error) {
	return gpu.NewWorkload(staticTasks(tasks))
}

func staticTasks(tasks []config.WorkloadTask) []gpu.Task {
	var out []gpu.Task
	for _, t := range tasks {
		out = append(out, gpu.Task{CPU: t.CPUMilli, Memory: t.MemoryMiB, Milli: t.GPUMilli, Count: t.GPUCount,
			Models: gpu.ModelSelector{Exact: slices.Clone(t.Models)}, Weight: float64(t.Weight)})
	}
	return out
}

// Name returns the plugin's name.
func (pl *GPUScore) Name() string { return Name }

// SignPod: the score depends on the parsed GPU request (and on the cluster,
// which signatures do not cover by design).
func (pl *GPUScore) SignPod(_ context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	return gpufit.Sign(pod, pl.shared.Tracker().RequestOptions())
}

type preScoreState struct {
	req gpu.Request
	wl  *gpu.Workload
	sc  gpu.Scoring // the profile's, with the pod's view of the fleet
	// A CPU-only pod's nodes, and their device states looked up at once
	// on the cycle's second Score call (cpuOnly): the framework's
	// opportunistic batching runs PreScore over every cached candidate to
	// score one node again, and must not pay a lookup per candidate.
	nodes   []fwk.NodeInfo
	calls   atomic.Int32
	once    sync.Once
	cpuOnly *shared.States
}

func (s *preScoreState) Clone() fwk.StateData { return s }

const preScoreStateKey fwk.StateKey = "PreScore" + Name

// PreScore pins the request and the target workload for this cycle.
func (pl *GPUScore) PreScore(_ context.Context, cs fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	req, err := shared.ReadRequest(cs)
	if err != nil {
		// GPUFit is not in the profile: parse here.
		r, perr := gpu.ParseRequest(pod, pl.shared.Tracker().RequestOptions())
		if perr != nil {
			return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, perr.Error())
		}
		req = &r
	}
	s := &preScoreState{req: *req, wl: pl.shared.Workload(), sc: pl.scoring}
	if pl.scoring.Scarce != 0 && s.req.HasGPU() && s.wl != nil && s.wl.RestrictsModels() {
		// The floor is the pod's and the fleet's, not the cycle's nodes':
		// opportunistic batching scores one node again against the raw
		// scores of a cycle before, which must share it.
		s.sc = pl.scoring.ForPod(s.wl.Scarcity(pl.fleetOf()), &s.req)
	}
	if !s.req.HasGPU() && len(nodes) > 1 {
		s.nodes = nodes
	}
	cs.Write(preScoreStateKey, s)
	return nil
}

// PinFleet has h's profile count f as the cluster's GPUs, in place of its
// snapshot's nodes (kubectl gpu whatif -l: the scheduler counts every node,
// whatif's copy only those selected).
func PinFleet(h fwk.Handle, f *gpu.Fleet) { shared.For(h).PinFleet(f) }

// fleetOf is the cluster's GPUs per model; nil without a snapshot.
func (pl *GPUScore) fleetOf() *gpu.Fleet {
	if f := pl.shared.PinnedFleet(); f != nil {
		return f
	}
	lister := pl.handle.SnapshotSharedLister()
	if lister == nil {
		return nil
	}
	infos, err := lister.NodeInfos().List()
	if err != nil {
		return nil
	}
	n := pl.cycles.Add(1)
	prev := pl.fleet.Load()
	if prev != nil && prev.nodes == len(infos) && n%fleetEvery != 0 && time.Since(prev.at) < fleetTTL {
		return prev.f
	}
	var b gpu.FleetBuilder
	t := pl.shared.Tracker()
	for _, ni := range infos {
		st := t.Known(ni.Node().Name)
		if st == nil {
			st = pl.shared.State(ni)
		}
		b.Add(st)
	}
	var pf *gpu.Fleet
	if prev != nil {
		pf = prev.f
	}
	v := &fleetView{f: b.Fleet(pf), nodes: len(infos), at: time.Now()}
	pl.fleet.Store(v)
	return v.f
}

// cpuOnlyState is the node's device state from the cycle's lookups, nil
// before the second Score call or when the lookups did not find it.
func (s *preScoreState) cpuOnlyState(pl *GPUScore, nodeInfo fwk.NodeInfo) *gpu.NodeState {
	if s.nodes == nil || s.calls.Add(1) < 2 {
		return nil
	}
	s.once.Do(func() { s.cpuOnly = pl.shared.CPUOnlyStates(pl.scoring, s.nodes, s.wl) })
	return s.cpuOnly.Get(nodeInfo)
}

// Score is the policy's raw score; NormalizeScore ranks it into 0-100.
func (pl *GPUScore) Score(_ context.Context, cs fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	d, err := cs.Read(preScoreStateKey)
	if err != nil {
		return 0, fwk.AsStatus(fmt.Errorf("reading %q: %w", preScoreStateKey, err))
	}
	s := d.(*preScoreState)
	if !s.req.HasGPU() {
		return pl.shared.CPUOnlyScoreFrom(pl.scoring, nodeInfo, s.cpuOnlyState(pl, nodeInfo), &s.req, s.wl), nil
	}
	st := pl.shared.ForPod(pl.handle, nodeInfo, pod, false)
	_, raw, ok := s.sc.Evaluate(st, &s.req, s.wl)
	if !ok {
		return minRaw, nil
	}
	return raw, nil
}

// minRaw ranks last: a node that passed Filter but cannot take the pod's
// devices (only when GPUFit is not in the profile).
const minRaw = -1 << 62

// ScoreExtensions returns the normaliser.
func (pl *GPUScore) ScoreExtensions() fwk.ScoreExtensions { return pl }

// NormalizeScore ranks the raw scores: the best distinct value gets 100, the
// next 99, and so on. Raw scores are fine-grained (fragmentation in 1/64
// milli-GPU), so ranking keeps exact ties only, instead of lumping near-best
// nodes together as min-max scaling to 0-100 would.
func (pl *GPUScore) NormalizeScore(_ context.Context, _ fwk.CycleState, _ *v1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	NormalizeByRank(scores)
	return nil
}

// NormalizeByRank maps raw scores to 100 minus their dense rank, floored at 0.
func NormalizeByRank(scores fwk.NodeScoreList) {
	if len(scores) == 0 {
		return
	}
	bp := rankBufs.Get().(*[]int64)
	raws := (*bp)[:0]
	for i := range scores {
		raws = append(raws, scores[i].Score)
	}
	slices.Sort(raws)
	raws = slices.Compact(raws)
	for i := range scores {
		idx, _ := slices.BinarySearch(raws, scores[i].Score)
		rank := int64(len(raws) - 1 - idx)
		scores[i].Score = max(fwk.MaxNodeScore-rank, fwk.MinNodeScore)
	}
	*bp = raws
	rankBufs.Put(bp)
}

// rankBufs keeps NormalizeByRank's buffers: one per cycle would be garbage
// as large as the nodes scored.
var rankBufs = sync.Pool{New: func() any { return new([]int64) }}
