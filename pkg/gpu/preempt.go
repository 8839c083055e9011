package gpu

import (
	"cmp"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Victim is a pod that may be evicted to make room for a preemptor.
type Victim struct {
	Priority int32
	// Budgets are the PodDisruptionBudgets that count its eviction
	// (indices into PlanEviction's allowed).
	Budgets []int
	// Pods is how many pods its eviction takes (a pod group's, on every
	// node; 0 counts as 1).
	Pods int
}

// Eviction is a plan: the GPU pods to evict from a node so that a request
// fits there, and why these.
type Eviction struct {
	UIDs []types.UID
	Why  string
}

// evictCost orders plans: fewest PodDisruptionBudgets broken, then the
// lowest priority evicted (as the scheduler ranks nodes), the fewest pods,
// the least GPU taken from running pods.
type evictCost struct {
	violations int
	maxPrio    int32
	pods       int
	milli      int64
}

func (a evictCost) compare(b evictCost) int {
	if c := cmp.Compare(a.violations, b.violations); c != 0 {
		return c
	}
	if c := cmp.Compare(a.maxPrio, b.maxPrio); c != 0 {
		return c
	}
	if c := cmp.Compare(a.pods, b.pods); c != 0 {
		return c
	}
	return cmp.Compare(a.milli, b.milli)
}

// exhaustiveSets bounds the device sets costed one by one; past it, the
// devices are chosen greedily.
const exhaustiveSets = 4096

// PlanEviction chooses the fewest of the given victims whose eviction lets
// the request's GPUs fit on the node (its pods as the scheduler sees them):
// for a share, the smallest set on one device (one pod where one frees
// enough); for whole GPUs, the devices that are cheapest to clear, a device
// held by a pod that is no victim never. Victims that hold no GPU are not
// its concern (the scheduler's filters judge the rest). allowed is each
// PodDisruptionBudget's disruptions allowed. ok is false when no eviction
// of the victims makes room, or when the node's GPUs need none. pods may
// include other pods nominated to the node (unbound, as important as the
// preemptor: the scheduler's filters count them in): what is held for them
// is no one's to free.
func (t *Tracker) PlanEviction(node *v1.Node, pods []*v1.Pod, r *Request, victims map[types.UID]Victim, allowed []int32) (Eviction, bool) {
	hs, st := t.Explain(node, pods)
	out, devices, milli, fitsNow := st.fit(r)
	if out == Fits || out.Unresolvable() || out == Overcommitted {
		return Eviction{}, false
	}
	var on [MaxDevices][]int // the holdings on each device
	var blocked uint64       // devices a pod that is no victim holds
	for _, p := range pods {
		// The devices a preemption freed for another nominee are its, even
		// while its victims still hold them. A nominee without that record
		// holds wherever it fits now, which may change: verify judges it.
		if p.Spec.NodeName == "" {
			if c, here := t.Nominated(p.UID, node.Name); here {
				blocked |= c.Mask
			}
		}
	}
	for k := range hs {
		_, victim := victims[hs[k].UID]
		for m := hs[k].Mask; m != 0; m &= m - 1 {
			i := bits.TrailingZeros64(m)
			on[i] = append(on[i], k)
			if !victim {
				blocked |= 1 << uint(i)
			}
		}
	}
	verify := func(set map[types.UID]bool) bool {
		rest := make([]*v1.Pod, 0, len(pods))
		for _, p := range pods {
			if !set[p.UID] {
				rest = append(rest, p)
			}
		}
		o, _, _, _ := t.Compute(node, rest, 0, 0, "", false).fit(r)
		return o == Fits
	}
	used := make([]int32, len(allowed))
	costOf := func(set map[types.UID]bool) evictCost {
		c := evictCost{maxPrio: math.MinInt32}
		clear(used)
		for k := range hs {
			if !set[hs[k].UID] {
				continue
			}
			v := victims[hs[k].UID]
			c.pods += max(v.Pods, 1)
			c.milli += int64(hs[k].Milli) * int64(max(bits.OnesCount64(hs[k].Mask), 1))
			c.maxPrio = max(c.maxPrio, v.Priority)
			for _, b := range v.Budgets {
				if used[b]++; used[b] > allowed[b] {
					c.violations++
				}
			}
		}
		return c
	}
	plan := func(set map[types.UID]bool, why string) Eviction {
		e := Eviction{Why: why}
		for uid := range set {
			e.UIDs = append(e.UIDs, uid)
		}
		slices.Sort(e.UIDs)
		return e
	}

	if devices == 1 && milli < MilliPerGPU {
		// A share: one pod if one frees enough, the one that costs least.
		var best map[types.UID]bool
		var bestCost evictCost
		var bestWhy string
		try := func(set map[types.UID]bool, why string) {
			if c := costOf(set); (best == nil || c.compare(bestCost) < 0) && verify(set) {
				best, bestCost, bestWhy = set, c, why
			}
		}
		for k := range hs {
			if _, victim := victims[hs[k].UID]; victim && hs[k].Mask != 0 {
				try(map[types.UID]bool{hs[k].UID: true}, fmt.Sprintf("one pod holding %d milli frees enough on device %s", hs[k].Milli, maskString(hs[k].Mask)))
			}
		}
		// And sets of several pods on one device, costed in the same order:
		// two pods of priority 0 beat one of priority 100. For each
		// priority a set may reach, the fewest pods up to it (fewest
		// budgets first, then the largest).
		for i := 0; i < int(st.Count); i++ {
			if !st.couldHost(i, r) {
				continue
			}
			var ks []int
			var prios []int32
			for _, k := range on[i] {
				if v, victim := victims[hs[k].UID]; victim {
					ks = append(ks, k)
					prios = append(prios, v.Priority)
				}
			}
			if len(ks) < 2 {
				continue
			}
			slices.SortFunc(ks, func(a, b int) int {
				va, vb := victims[hs[a].UID], victims[hs[b].UID]
				if c := cmp.Compare(len(va.Budgets), len(vb.Budgets)); c != 0 {
					return c
				}
				if c := cmp.Compare(hs[b].Milli, hs[a].Milli); c != 0 {
					return c
				}
				return cmp.Compare(va.Priority, vb.Priority)
			})
			slices.Sort(prios)
			for _, top := range slices.Compact(prios) {
				set := map[types.UID]bool{}
				for _, k := range ks {
					if victims[hs[k].UID].Priority > top {
						continue
					}
					set[hs[k].UID] = true
					if verify(set) {
						if len(set) > 1 { // one alone was tried above
							try(set, fmt.Sprintf("%d pods on device %d", len(set), i))
						}
						break
					}
				}
			}
		}
		if best == nil {
			return Eviction{}, false
		}
		return plan(best, bestWhy), true
	}

	// Whole devices (or a share on each of several): the devices cheapest
	// to clear. A pod on several devices frees them all, so the cost is of
	// the set: every choice of devices where there are few, else greedy.
	ready := fitsNow
	var eligible []int
	for i := 0; i < int(st.Count); i++ {
		if ready&(1<<uint(i)) == 0 && blocked&(1<<uint(i)) == 0 && st.couldHost(i, r) {
			eligible = append(eligible, i)
		}
	}
	need := int(devices) - bits.OnesCount64(ready)
	if need > len(eligible) {
		return Eviction{}, false
	}
	if len(eligible) <= exhaustiveDevices && binomial(len(eligible), need) <= exhaustiveSets {
		// Each device as a bit set of the holdings on it: a choice's
		// victims are the union, costed without maps.
		words := (len(hs) + 63) / 64
		onBits := make([][]uint64, st.Count)
		for _, i := range eligible {
			onBits[i] = make([]uint64, words)
			for _, k := range on[i] {
				onBits[i][k/64] |= 1 << uint(k%64)
			}
		}
		union := make([]uint64, words)
		vs := make([]Victim, len(hs))
		milli := make([]int64, len(hs))
		for k := range hs {
			vs[k] = victims[hs[k].UID]
			milli[k] = int64(hs[k].Milli) * int64(max(bits.OnesCount64(hs[k].Mask), 1))
		}
		costBits := func() evictCost {
			c := evictCost{maxPrio: math.MinInt32}
			clear(used)
			for w, x := range union {
				for ; x != 0; x &= x - 1 {
					k := w*64 + bits.TrailingZeros64(x)
					v := &vs[k]
					c.pods += max(v.Pods, 1)
					c.milli += milli[k]
					c.maxPrio = max(c.maxPrio, v.Priority)
					for _, b := range v.Budgets {
						if used[b]++; used[b] > allowed[b] {
							c.violations++
						}
					}
				}
			}
			return c
		}
		var best []int
		var bestCost evictCost
		combinations(eligible, need, func(pick []int) {
			clear(union)
			for _, i := range pick {
				for w, x := range onBits[i] {
					union[w] |= x
				}
			}
			if c := costBits(); best == nil || c.compare(bestCost) < 0 {
				best, bestCost = slices.Clone(pick), c
			}
		})
		set := map[types.UID]bool{}
		for _, i := range best {
			for _, k := range on[i] {
				set[hs[k].UID] = true
			}
		}
		if len(set) == 0 || !verify(set) {
			return Eviction{}, false
		}
		return plan(set, fmt.Sprintf("clears device(s) %s, held by %d pod(s)", intsString(best), len(set))), true
	}
	set := map[types.UID]bool{}
	var cleared []int
	for int32(bits.OnesCount64(ready)) < devices {
		best := -1
		var bestCost evictCost
		for i := 0; i < int(st.Count); i++ {
			if ready&(1<<uint(i)) != 0 || blocked&(1<<uint(i)) != 0 || !st.couldHost(i, r) {
				continue
			}
			more := maps(set)
			for _, k := range on[i] {
				more[hs[k].UID] = true
			}
			if c := costOf(more); best < 0 || c.compare(bestCost) < 0 {
				best, bestCost = i, c
			}
		}
		if best < 0 {
			return Eviction{}, false
		}
		for _, k := range on[best] {
			set[hs[k].UID] = true
		}
		ready |= 1 << uint(best)
		cleared = append(cleared, best)
		// A pod evicted for this device may have held others.
		for i := 0; i < int(st.Count); i++ {
			if ready&(1<<uint(i)) != 0 || blocked&(1<<uint(i)) != 0 || !st.couldHost(i, r) || len(on[i]) == 0 {
				continue
			}
			all := true
			for _, k := range on[i] {
				all = all && set[hs[k].UID]
			}
			if all {
				ready |= 1 << uint(i)
				cleared = append(cleared, i)
			}
		}
	}
	if len(set) == 0 || !verify(set) {
		return Eviction{}, false
	}
	slices.Sort(cleared)
	return plan(set, fmt.Sprintf("clears device(s) %s, held by %d pod(s)", intsString(cleared), len(set))), true
}

// exhaustiveDevices bounds the devices whose every choice is costed:
// C(16,8) = 12,870 sets at most.
const exhaustiveDevices = 16

// binomial is C(n, k), saturating past exhaustiveSets.
func binomial(n, k int) int {
	c := 1
	for i := 0; i < k; i++ {
		c = c * (n - i) / (i + 1)
		if c > exhaustiveSets {
			return exhaustiveSets + 1
		}
	}
	return c
}

// combinations calls f with every choice of k of the items, in order.
func combinations(items []int, k int, f func([]int)) {
	pick := make([]int, 0, k)
	var rec func(from int)
	rec = func(from int) {
		if len(pick) == k {
			f(pick)
			return
		}
		for i := from; i <= len(items)-(k-len(pick)); i++ {
			pick = append(pick, items[i])
			rec(i + 1)
			pick = pick[:len(pick)-1]
		}
	}
	rec(0)
}

// FreedFor is the devices a nominated preemptor is to get on a node once
// the victims are gone: where its request fits without them, those the
// victims held first (victimMask), tightest first; devices held for other
// nominees (taken) only if nothing else is left.
func (t *Tracker) FreedFor(node *v1.Node, rest []*v1.Pod, r *Request, victimMask, taken uint64) (Choice, bool) {
	st := t.Compute(node, rest, 0, 0, "", false)
	out, devices, milli, mask := st.fit(r)
	if out != Fits {
		return Choice{}, false
	}
	if int32(bits.OnesCount64(mask&^taken)) >= devices {
		mask &^= taken
	}
	_, sh := r.AgentShare()
	c := Choice{Milli: milli, Share: sh}
	for n := int32(0); n < devices; n++ {
		best := -1
		for m := mask &^ c.Mask; m != 0; m &= m - 1 {
			i := bits.TrailingZeros64(m)
			mine, bestMine := victimMask&(1<<uint(i)) != 0, best >= 0 && victimMask&(1<<uint(best)) != 0
			if best < 0 || (mine && !bestMine) || (mine == bestMine && st.Free[i] < st.Free[best]) {
				best = i
			}
		}
		if best < 0 {
			return Choice{}, false
		}
		c.Mask |= 1 << uint(best)
	}
	return c, true
}

// HeldBy is the devices the given pods hold on the node.
func (t *Tracker) HeldBy(node *v1.Node, pods []*v1.Pod, uids map[types.UID]bool) uint64 {
	hs, _ := t.Explain(node, pods)
	var m uint64
	for _, h := range hs {
		if uids[h.UID] {
			m |= h.Mask
		}
	}
	return m
}

// couldHost reports whether device i could take the request were it empty.
func (s *NodeState) couldHost(i int, r *Request) bool {
	if i >= int(s.Count) {
		return false
	}
	if s.agent == nil {
		return true
	}
	d := &s.agent.devs[i]
	_, sh := r.AgentShare()
	return d.Healthy && !d.Cordoned && s.agent.allowed(i, r) && sh.MemoryOn(d.MemoryMiB) <= d.MemoryMiB && sh.Cores <= d.Cores && d.Slots > 0
}

func maps(m map[types.UID]bool) map[types.UID]bool {
	c := make(map[types.UID]bool, len(m)+4)
	for k, v := range m {
		c[k] = v
	}
	return c
}

func maskString(m uint64) string {
	var is []int
	for ; m != 0; m &= m - 1 {
		is = append(is, bits.TrailingZeros64(m))
	}
	return intsString(is)
}

func intsString(is []int) string {
	s := make([]string, len(is))
	for k, i := range is {
		s[k] = fmt.Sprint(i)
	}
	return strings.Join(s, ",")
}
