package gpu

import (
	"fmt"
	"math"
	"math/bits"
)

// Policy is how a node and its devices are chosen among those that fit.
type Policy string

const (
	// Fragmentation minimises the growth of fragmentation against the target
	// workload (FGD, openb-benchmark.md §7).
	Fragmentation Policy = "Fragmentation"
	// BestFit leaves the least CPU and GPU behind.
	BestFit Policy = "BestFit"
	// Packing shares used GPUs first, then fills used nodes, then the
	// smallest idle node.
	Packing Policy = "Packing"
	// Spread keeps the most GPU free on each node and device.
	Spread Policy = "Spread"
)

// Policies lists the valid policies.
var Policies = []Policy{Fragmentation, BestFit, Packing, Spread}

// ParsePolicy validates a policy name.
func ParsePolicy(s string) (Policy, error) {
	for _, p := range Policies {
		if string(p) == s {
			return p, nil
		}
	}
	return "", fmt.Errorf("unknown policy %q, want one of %v", s, Policies)
}

// Scoring is a policy and its refinements. The defaults are what the trace
// replay measured best (docs/benchmarks.md); the others stay for ablation.
type Scoring struct {
	Policy Policy
	// Exact ranks Fragmentation by the fragmentation growth itself. By
	// default it is bucketed as FGD scores it, ⌊100·σ(−ΔF/1000 GPU)⌋, so
	// nodes within about 40 milli-GPU of each other tie and the tie-break
	// decides: placements then concentrate on the same nodes instead of
	// chasing small differences across the cluster.
	Exact bool
	// LeastIdle breaks ties by the idle GPU left on the node (least first).
	LeastIdle bool
	// CPUOnlyLeastIdle breaks ties among GPU nodes for CPU-only pods by the
	// node's idle GPU (least first), before the node order: a node whose
	// GPUs are taken has CPU that no GPU pod will need. The other policies
	// rank CPU-only pods by idle GPU already.
	CPUOnlyLeastIdle bool
	// NodePriority breaks the remaining ties by a stable per-node order.
	// Without it the scheduler's ties fall to its heap order, which
	// scatters equivalent placements.
	NodePriority bool
	// MemoryAware counts a typical pod as fitting only if its memory fits
	// too (FGD looks at CPU and GPUs only).
	MemoryAware bool
	// ReferenceOrder replaces the node order by the published simulator's:
	// the node whose name starts with the smallest number wins (its nodes
	// are renamed %04d-<name> per seed). For reproducing its results only.
	ReferenceOrder bool
	// ExactDevice picks a share's device on a node by the exact growth
	// (then the tighter device), still scoring the node by its bucket.
	ExactDevice bool
	// ReferenceArithmetic computes Fragmentation's F and score as the
	// published simulator does, float rounding included (reference.go),
	// when the workload carries its weights. For reproducing its results
	// only.
	ReferenceArithmetic bool
	// Strand adds, to a GPU pod's fragmentation growth, this multiple of
	// the growth of the node's stranded GPU (stranded): idle GPU that the
	// CPU and memory left cannot serve at the CPU and memory per GPU of the
	// target's tasks the node can run. F looks one typical pod ahead; this
	// looks at the node's balance, so a CPU-heavy pod keeps off a node
	// already short of CPU for its GPUs and a CPU-light one goes there.
	Strand float64
	// Scarce adds, to a GPU pod's fragmentation growth, this multiple of
	// the GPU it takes times how much more loaded the node's model is than
	// the least loaded model the pod allows (Scarcity): pods that can run
	// on many models keep off the ones that restricted pods need. It
	// applies from the pod's view of the fleet (ForPod) on. The floor is
	// not lowered to the models with room left: a framework rescoring one
	// node of a batch compares it with scores of an earlier cycle, which
	// must have had the same floor.
	Scarce float64
	// scarcity and floor are the pod's view of the fleet (ForPod).
	scarcity *Scarcity
	floor    float64
}

// ForPod is the scoring of a pod's cycle: with the fleet's scarcity, and the
// least load among the models the pod allows. A nil c, or no Scarce weight,
// prices no model.
func (sc Scoring) ForPod(c *Scarcity, r *Request) Scoring {
	if sc.Scarce == 0 || c == nil || !r.HasGPU() {
		return sc
	}
	sc.scarcity, sc.floor = c, c.Floor(&r.Models)
	return sc
}

// scarceCost is the Scarce term for a pod taking gpu milli of the node's
// devices.
func (sc Scoring) scarceCost(s *NodeState, gpu int64) float64 {
	if sc.scarcity == nil {
		return 0
	}
	pi, ok := sc.scarcity.Of(s.Model)
	if !ok || pi <= sc.floor {
		return 0
	}
	return sc.Scarce * (pi - sc.floor) * float64(gpu)
}

// refArith reports whether F and its score follow the original's
// arithmetic for this workload.
func (sc Scoring) refArith(wl *Workload) bool {
	return sc.ReferenceArithmetic && wl.Reference()
}

// prio is the node's rank in the last tie-break.
func (sc Scoring) prio(s *NodeState) uint16 {
	if sc.ReferenceOrder {
		return referencePrio(s.Name)
	}
	return s.Prio
}

// referencePrio ranks names by their leading number, smallest first; a
// name without one ranks last.
func referencePrio(name string) uint16 {
	n, digits := 0, 0
	for digits < len(name) && digits < 4 && name[digits] >= '0' && name[digits] <= '9' {
		n = n*10 + int(name[digits]-'0')
		digits++
	}
	if digits == 0 {
		return 0
	}
	return uint16(math.MaxUint16 - n)
}

// DefaultScoring is Fragmentation with the measured defaults.
var DefaultScoring = Scoring{Policy: Fragmentation, NodePriority: true, MemoryAware: true, CPUOnlyLeastIdle: true, Strand: 1, Scarce: 1}

// Reference sizes normalise CPU and GPU left-overs in BestFit, as in the
// published method (the largest node of the openb cluster).
const (
	refCPU = 128000
	refGPU = 8 * MilliPerGPU
)

// Evaluate decides, for a request that fits the node, which devices it takes
// and how good the placement is (a raw score, higher is better, comparable
// across nodes for the same pod). Score and Reserve both call it, so the device
// the score assumed is the device that is reserved. wl may be nil, in which
// case Fragmentation falls back to BestFit. It does not allocate once the
// node's baseline fragmentation is cached.
func (sc Scoring) Evaluate(s *NodeState, r *Request, wl *Workload) (Choice, int64, bool) {
	p := sc.Policy
	if p == Fragmentation && wl == nil {
		p = BestFit
	}
	if !r.HasGPU() {
		return Choice{}, sc.cpuOnlyScore(p, s, r, wl), true
	}
	out, devices, milli, mask := s.fit(r)
	if out != Fits {
		return Choice{}, 0, false
	}
	var sh DeviceShare
	if s.agent != nil {
		_, sh = r.AgentShare()
	}
	after := s.Idle() - int64(devices)*int64(milli)
	if devices > 1 || milli == MilliPerGPU {
		c := lowestIn(mask, devices, milli)
		c.Share = sh
		switch p {
		case Fragmentation:
			return c, sc.fragScore(s, wl, c, r), true
		case Packing:
			return c, sc.key(packingTier(s, devices, milli, c), after, sc.prio(s)), true
		case Spread:
			return c, sc.key(spreadFrac(s, after), -after, sc.prio(s)), true
		default:
			return c, sc.key(bestFit(s, r.CPU, after), after, sc.prio(s)), true
		}
	}
	// A share of one device: which device matters.
	switch p {
	case Fragmentation:
		return sc.bestFragDevice(s, wl, milli, &sh, mask, r)
	case Spread:
		c := Choice{Mask: 1 << uint(mostFree(s, mask)), Milli: milli, Share: sh}
		return c, sc.key(spreadFrac(s, after), -after, sc.prio(s)), true
	case Packing:
		c := Choice{Mask: 1 << uint(tightest(s, mask)), Milli: milli, Share: sh}
		return c, sc.key(packingTier(s, 1, milli, c), after, sc.prio(s)), true
	default:
		c := Choice{Mask: 1 << uint(tightest(s, mask)), Milli: milli, Share: sh}
		return c, sc.key(bestFit(s, r.CPU, after), after, sc.prio(s)), true
	}
}

// Evaluate is DefaultScoring with the given policy (tests and tools).
func Evaluate(p Policy, s *NodeState, r *Request, wl *Workload) (Choice, int64, bool) {
	sc := DefaultScoring
	sc.Policy = p
	return sc.Evaluate(s, r, wl)
}

// key orders by primary, then (with LeastIdle) by less idle GPU left, then
// (with NodePriority) by the node's priority. |primary| < 2^26: fragPrimary
// clamps the exact growth (the stranded-GPU term at its largest weight is
// 11 × 64,000 milli × 64, under the clamp; the model-scarcity term has no
// bound of its own).
func (sc Scoring) key(primary, idleAfter int64, prio uint16) int64 {
	k := primary << 37
	if sc.LeastIdle {
		k += (1<<20 - min(idleAfter, 1<<20-1)) << 16
	}
	if sc.NodePriority {
		k += int64(prio)
	}
	return k
}

// lowestIn takes the lowest devices of the mask (the devices that fit).
func lowestIn(mask uint64, devices, milli int32) Choice {
	c := Choice{Milli: milli}
	for ; devices > 0 && mask != 0; devices-- {
		low := mask & -mask
		c.Mask |= low
		mask &^= low
	}
	return c
}

// tightest is the device of the mask with the least room (best fit).
func tightest(s *NodeState, mask uint64) int {
	best := -1
	for i := 0; i < int(s.Count); i++ {
		if mask&(1<<uint(i)) != 0 && (best < 0 || s.Free[i] < s.Free[best]) {
			best = i
		}
	}
	return best
}

func mostFree(s *NodeState, mask uint64) int {
	best := -1
	for i := 0; i < int(s.Count); i++ {
		if mask&(1<<uint(i)) != 0 && (best < 0 || s.Free[i] > s.Free[best]) {
			best = i
		}
	}
	return best
}

// bestFit is minus the CPU and GPU left, each normalised by the largest node.
func bestFit(s *NodeState, cpu, gpuAfter int64) int64 {
	cpuAfter := max(s.CPUFree-cpu, 0)
	left := 0.5*float64(cpuAfter)/refCPU + 0.5*float64(gpuAfter)/refGPU
	return -int64(left * 1e6)
}

// spreadFrac is the node's free GPU fraction after placement, in 1/1000.
func spreadFrac(s *NodeState, after int64) int64 {
	return after * 1000 / (int64(s.Count) * MilliPerGPU)
}

// packingTier ranks as the published GpuPacking: a share on a used GPU first
// (tighter is better), then a node already in use (fewer fresh devices is
// better), then an idle node (smaller is better).
func packingTier(s *NodeState, devices, milli int32, c Choice) int64 {
	if s.FullyFree() == s.Count {
		return int64(max(33-s.Count, s.Count))
	}
	var fresh int32
	var left int32
	for i := 0; i < int(s.Count); i++ {
		if c.Mask&(1<<uint(i)) != 0 {
			if s.Free[i] == MilliPerGPU {
				fresh++
			}
			left = s.Free[i]
		}
	}
	if fresh > 0 {
		return int64(max(50-fresh, 33))
	}
	return int64(max(100-left/100, 50))
}

// deltaScale keeps 1/64 milli-GPU of resolution in an exact fragmentation
// delta.
const deltaScale = 64

// maxExactGrowth bounds an exact primary so that key cannot overflow, with
// a CPU-only pod's offset (cpuNodeTop) too.
const maxExactGrowth = 1<<26 - 1 - cpuNodeTop

// fragPrimary ranks a fragmentation growth ΔF (milli-GPU): bucketed as FGD's
// score, or exact.
func (sc Scoring) fragPrimary(delta float64) int64 {
	if sc.Exact {
		return -int64(math.Round(max(-maxExactGrowth, min(delta*deltaScale, maxExactGrowth))))
	}
	return int64(100 / (1 + math.Exp(delta/MilliPerGPU)))
}

// memFree is the memory the fragmentation fit sees: unlimited unless
// memory-aware.
func (sc Scoring) memFree(s *NodeState, mem int64) int64 {
	return sc.memLeft(s.MemFree, mem)
}

func (sc Scoring) memLeft(free, mem int64) int64 {
	if !sc.MemoryAware {
		return math.MaxInt64
	}
	return free - mem
}

func (sc Scoring) fragScore(s *NodeState, wl *Workload, c Choice, r *Request) int64 {
	ref := sc.refArith(wl)
	fc := wl.cacheAs(s, sc.MemoryAware, ref)
	after := s.Free
	var taken int64 // what the devices lose, which a node agent's share can make differ from the request
	for i := 0; i < int(s.Count); i++ {
		if c.Mask&(1<<uint(i)) != 0 {
			after[i] = s.freeAfter(i, c.Milli, &c.Share)
			taken += int64(s.Free[i] - after[i])
		}
	}
	var primary int64
	if ref {
		primary = refScore(fc.base, wl.refFrag(s, &after, s.Count, s.CPUFree-r.CPU))
	} else {
		f := wl.frag(&after, s.Count, s.CPUFree-r.CPU, sc.memFree(s, r.Memory), &fc.match)
		primary = sc.fragPrimary(f - fc.base + sc.strandGrowth(s, fc, taken, r) + sc.scarceCost(s, taken))
	}
	return sc.key(primary, s.Idle()-int64(c.Milli)*int64(popcount(c.Mask)), sc.prio(s))
}

// strandGrowth is Strand times the growth of the node's stranded GPU when
// the pod takes gpu milli of its idle GPU, its CPU and its memory.
func (sc Scoring) strandGrowth(s *NodeState, fc *fragCache, gpu int64, r *Request) float64 {
	if sc.Strand == 0 {
		return 0
	}
	idle := s.Idle()
	mem, memAfter := int64(math.MaxInt64), int64(math.MaxInt64)
	if sc.MemoryAware {
		mem, memAfter = s.MemFree, s.MemFree-r.Memory
	}
	return sc.Strand * (stranded(idle-gpu, s.CPUFree-r.CPU, memAfter, fc.cpuPer, fc.memPer) -
		stranded(idle, s.CPUFree, mem, fc.cpuPer, fc.memPer))
}

// bestFragDevice tries the devices a share fits on. Bucketed, the first
// device of the best bucket wins (FGD's choice); exact, the smallest growth,
// then the tighter device. Devices with the same free milli give the same
// fragmentation and are tried once. The device is chosen by fragmentation
// alone: the stranded-GPU term is about the node (it differs between devices
// only through what an agent's share takes), and added before the bucketing
// it would move bucket edges and with them the device.
func (sc Scoring) bestFragDevice(s *NodeState, wl *Workload, milli int32, sh *DeviceShare, mask uint64, r *Request) (Choice, int64, bool) {
	ref := sc.refArith(wl)
	fc := wl.cacheAs(s, sc.MemoryAware, ref)
	cpu, mem := s.CPUFree-r.CPU, sc.memFree(s, r.Memory)
	best := -1
	var bestF float64
	var bestP int64
	var bestAfter int32
	// Devices with the same room before and after give the same
	// fragmentation (the device vectors are permutations): each pair once.
	var tried [MaxDevices][2]int32
	nTried := 0
	for i := 0; i < int(s.Count); i++ {
		v := s.Free[i]
		if mask&(1<<uint(i)) == 0 {
			continue
		}
		pair := [2]int32{v, s.freeAfter(i, milli, sh)}
		dup := false
		for k := 0; k < nTried; k++ {
			if tried[k] == pair {
				dup = true
				break
			}
		}
		if dup {
			continue
		}
		tried[nTried] = pair
		nTried++
		after := s.Free
		after[i] = pair[1]
		var f float64
		var p int64
		if ref {
			f = wl.refFrag(s, &after, s.Count, cpu)
			p = refScore(fc.base, f)
		} else {
			f = wl.frag(&after, s.Count, cpu, mem, &fc.match)
			p = sc.fragPrimary(f - fc.base)
		}
		better := best < 0 || p > bestP
		switch {
		case best < 0:
		case sc.ExactDevice:
			better = f < bestF || (f == bestF && v < s.Free[best])
		case sc.Exact && !better && p == bestP && v < s.Free[best]:
			better = true
		}
		if better {
			best, bestF, bestP, bestAfter = i, f, p, pair[1]
		}
	}
	if best < 0 {
		return Choice{}, 0, false
	}
	if !ref && (sc.Strand != 0 || sc.scarcity != nil) {
		taken := int64(s.Free[best] - bestAfter)
		bestP = sc.fragPrimary(bestF - fc.base + sc.strandGrowth(s, fc, taken, r) + sc.scarceCost(s, taken))
	}
	return Choice{Mask: 1 << uint(best), Milli: milli, Share: *sh}, sc.key(bestP, s.Idle()-int64(milli), sc.prio(s)), true
}

// cpuOnlyScore keeps CPU-only pods off GPU nodes: the idle GPU a node has is
// a penalty, and under Fragmentation so is the fragmentation the CPU use adds.
// Nodes without GPUs all tie, so the other plugins (LeastRequested) spread
// CPU pods among them. GPU nodes that tie go to the least idle GPU
// (CPUOnlyLeastIdle), then by the node order, as FGD does: CPU pods pile
// onto the same few and the rest keep their CPU for GPU pods (spreading them
// instead cost 4.5 and 9.4 points of allocation on the openb default and
// cpu250 replays).
func (sc Scoring) cpuOnlyScore(p Policy, s *NodeState, r *Request, wl *Workload) int64 {
	if score, ok := sc.cpuOnlyQuick(p, s.IsGPUNode(), sc.prio(s), s.CPUFree, s.MemFree, r, wl); ok {
		return score
	}
	idle := s.Idle()
	if p == Fragmentation {
		primary := sc.fragPrimary(0)
		if sc.refArith(wl) {
			fc := wl.cacheAs(s, sc.MemoryAware, true)
			primary = refScore(fc.base, wl.refFrag(s, &s.Free, s.Count, s.CPUFree-r.CPU))
		} else if !sc.leavesRoom(s.CPUFree, s.MemFree, r, wl) {
			fc := wl.cache(s, sc.MemoryAware)
			f := wl.frag(&s.Free, s.Count, s.CPUFree-r.CPU, sc.memFree(s, r.Memory), &fc.match)
			primary = sc.fragPrimary(f - fc.base)
		}
		k := sc
		k.LeastIdle = sc.LeastIdle || sc.CPUOnlyLeastIdle
		// Any GPU node ranks below every node without GPUs.
		return k.key(primary-cpuNodeTop, idle, sc.prio(s))
	}
	return sc.key(-idle, idle, sc.prio(s))
}

// CPUOnlyQuick scores a CPU-only pod from the node's own accounting
// (whether it has GPUs, its free CPU and memory in MiB) when that decides,
// as it usually does. The score is the one Evaluate gives; without the
// device state, the scheduler skips a per-node lookup. ok is false when the
// device state is needed.
func (sc Scoring) CPUOnlyQuick(hasGPU bool, node string, cpuFree, memFree int64, r *Request, wl *Workload) (score int64, ok bool) {
	if r.HasGPU() {
		return 0, false
	}
	p := sc.Policy
	if p == Fragmentation && wl == nil {
		p = BestFit // as Evaluate
	}
	if hasGPU && sc.needsIdle(p) { // before hashing the name
		return 0, false
	}
	prio := nodePrio(node)
	if sc.ReferenceOrder {
		prio = referencePrio(node)
	}
	return sc.cpuOnlyQuick(p, hasGPU, prio, cpuFree, memFree, r, wl)
}

// CPUOnlyNeedsState reports whether a CPU-only pod's score on a GPU node
// reads the device state (its idle GPU), so that asking CPUOnlyQuick first
// would be wasted.
func (sc Scoring) CPUOnlyNeedsState(wl *Workload) bool {
	p := sc.Policy
	if p == Fragmentation && wl == nil {
		p = BestFit
	}
	return sc.needsIdle(p)
}

// cpuOnlyQuick is the part of cpuOnlyScore that needs no device state: a
// node without GPUs, or, under Fragmentation, a GPU node where every GPU
// task still fits in the CPU and memory the pod leaves, so that F is
// unchanged (the common case; nothing to compute).
func (sc Scoring) cpuOnlyQuick(p Policy, hasGPU bool, prio uint16, cpuFree, memFree int64, r *Request, wl *Workload) (int64, bool) {
	if !hasGPU {
		return sc.key(cpuNodeTop, 0, 0), true
	}
	if sc.needsIdle(p) || sc.refArith(wl) || !sc.leavesRoom(cpuFree, memFree, r, wl) {
		return 0, false
	}
	return sc.key(sc.fragPrimary(0)-cpuNodeTop, 0, prio), true
}

// needsIdle reports whether a CPU-only pod's score on a GPU node depends on
// the node's idle GPU, which only the device state knows.
func (sc Scoring) needsIdle(p Policy) bool {
	return p != Fragmentation || sc.LeastIdle || sc.CPUOnlyLeastIdle
}

// leavesRoom reports whether every GPU task still fits in the CPU and memory
// the pod leaves, so that the pod does not change F.
func (sc Scoring) leavesRoom(cpuFree, memFree int64, r *Request, wl *Workload) bool {
	return cpuFree-r.CPU >= wl.maxCPU && sc.memLeft(memFree, r.Memory) >= wl.maxMem
}

// cpuNodeTop ranks nodes without GPUs above every GPU node for CPU-only pods.
const cpuNodeTop = 1 << 24

func popcount(x uint64) int { return bits.OnesCount64(x) }
