package gpu

import (
	"fmt"
	"math"
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
func Evaluate(p Policy, s *NodeState, r *Request, wl *Workload) (Choice, int64, bool) {
	if p == Fragmentation && wl == nil {
		p = BestFit
	}
	if !r.HasGPU() {
		return Choice{}, cpuOnlyScore(p, s, r, wl), true
	}
	out, devices, milli := s.Fit(r)
	if out != Fits {
		return Choice{}, 0, false
	}
	idle := s.Idle()
	after := idle - int64(devices)*int64(milli)
	if devices > 1 || milli == MilliPerGPU {
		c := lowestFree(s, devices, milli)
		switch p {
		case Fragmentation:
			return c, fragScore(s, wl, c, r.CPU), true
		case Packing:
			return c, lex(packingTier(s, devices, milli, c), -after), true
		case Spread:
			return c, spreadScore(s, after), true
		default:
			return c, bestFitScore(s, r.CPU, after), true
		}
	}
	// A share of one device: which device matters.
	switch p {
	case Fragmentation:
		return bestFragDevice(s, wl, milli, r.CPU)
	case Spread:
		c := Choice{Mask: 1 << uint(mostFree(s, milli)), Milli: milli}
		return c, spreadScore(s, after), true
	case Packing:
		c := Choice{Mask: 1 << uint(tightest(s, milli)), Milli: milli}
		return c, lex(packingTier(s, 1, milli, c), -after), true
	default:
		c := Choice{Mask: 1 << uint(tightest(s, milli)), Milli: milli}
		return c, bestFitScore(s, r.CPU, after), true
	}
}

// lex orders by primary, then secondary (|secondary| < 2^20).
func lex(primary, secondary int64) int64 {
	return primary<<21 + secondary + 1<<20
}

func lowestFree(s *NodeState, devices, milli int32) Choice {
	c := Choice{Milli: milli}
	for i := int32(0); i < s.Count && devices > 0; i++ {
		if s.Free[i] >= milli {
			c.Mask |= 1 << uint(i)
			devices--
		}
	}
	return c
}

// tightest is the device with the least room that still fits (best fit).
func tightest(s *NodeState, milli int32) int {
	best := -1
	for i := 0; i < int(s.Count); i++ {
		if s.Free[i] >= milli && (best < 0 || s.Free[i] < s.Free[best]) {
			best = i
		}
	}
	return best
}

func mostFree(s *NodeState, milli int32) int {
	best := -1
	for i := 0; i < int(s.Count); i++ {
		if s.Free[i] >= milli && (best < 0 || s.Free[i] > s.Free[best]) {
			best = i
		}
	}
	return best
}

func bestFitScore(s *NodeState, cpu, gpuAfter int64) int64 {
	cpuAfter := max(s.CPUFree-cpu, 0)
	left := 0.5*float64(cpuAfter)/refCPU + 0.5*float64(gpuAfter)/refGPU
	return -int64(left * 1e6)
}

func spreadScore(s *NodeState, after int64) int64 {
	frac := after * 1000 / (int64(s.Count) * MilliPerGPU)
	return lex(frac, after)
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

// deltaScale keeps 1/64 milli-GPU of resolution in the fragmentation delta.
const deltaScale = 64

func fragScore(s *NodeState, wl *Workload, c Choice, cpu int64) int64 {
	fc := wl.cache(s)
	after := s.Free
	for i := 0; i < int(s.Count); i++ {
		if c.Mask&(1<<uint(i)) != 0 {
			after[i] -= c.Milli
		}
	}
	f := wl.frag(&after, s.Count, s.CPUFree-cpu, fc.match)
	return fragLex(f-fc.base, s.Idle()-int64(c.Milli)*int64(popcount(c.Mask)))
}

func fragLex(delta float64, idleAfter int64) int64 {
	d := int64(math.Round(delta * deltaScale))
	// Ties in fragmentation go to the node left with less idle GPU, which
	// keeps whole nodes free for large requests.
	return lex(-d, -idleAfter)
}

// bestFragDevice tries each distinct free level once: devices with the same
// free milli give the same fragmentation.
func bestFragDevice(s *NodeState, wl *Workload, milli int32, cpu int64) (Choice, int64, bool) {
	fc := wl.cache(s)
	idle := s.Idle()
	best := -1
	var bestF float64
	var tried [MaxDevices]int32
	nTried := 0
	for i := 0; i < int(s.Count); i++ {
		v := s.Free[i]
		if v < milli {
			continue
		}
		dup := false
		for k := 0; k < nTried; k++ {
			if tried[k] == v {
				dup = true
				break
			}
		}
		if dup {
			continue
		}
		tried[nTried] = v
		nTried++
		after := s.Free
		after[i] -= milli
		f := wl.frag(&after, s.Count, s.CPUFree-cpu, fc.match)
		// Lower fragmentation wins; then the tighter device; then the lower index.
		if best < 0 || f < bestF-1e-9 || (math.Abs(f-bestF) <= 1e-9 && v < s.Free[best]) {
			best, bestF = i, f
		}
	}
	if best < 0 {
		return Choice{}, 0, false
	}
	return Choice{Mask: 1 << uint(best), Milli: milli}, fragLex(bestF-fc.base, idle-int64(milli)), true
}

// cpuOnlyScore keeps CPU-only pods off GPU nodes: the idle GPU a node has is a
// penalty, and under Fragmentation so is the fragmentation the CPU use adds.
func cpuOnlyScore(p Policy, s *NodeState, r *Request, wl *Workload) int64 {
	idle := s.Idle()
	if p == Fragmentation && s.Count > 0 {
		fc := wl.cache(s)
		f := wl.frag(&s.Free, s.Count, s.CPUFree-r.CPU, fc.match)
		return fragLex(f-fc.base, idle)
	}
	return lex(-idle, 0)
}

func popcount(x uint32) int {
	n := 0
	for x != 0 {
		x &= x - 1
		n++
	}
	return n
}
