package gpu

import (
	"fmt"
	"math"
)

// The published FGD simulator's arithmetic, for reproducing its results
// bit for bit (gpu-sim --tie-order reference, policy fgd-pure). Its F is a
// float sum kept per fragment class (hkust-adsl/kubernetes-scheduler-
// simulator at 8f3d641, pkg/utils/frag.go: NodeGpuShareFragAmount), in its
// own task order and with its own weights, so that moving a task from one
// class to another (a CPU-only pod crossing a CPU-only task's request) can
// change F by 1e-13 where F is mathematically unchanged, and the score
// ⌊100·σ(ΔF/1000)⌋ from 50 to 49. The shipped scorer does not do this: it
// is what its replay must do to land on the published placements.

// refTask is a typical task with the original's weight.
type refTask struct {
	Task
	w float64
}

// NewReferenceWorkload is NewWorkload, plus the tasks in the given order
// (the original's: most frequent first) weighted as the original weights
// them: each task's count over all the trace's pods, over the share of
// pods the kept tasks cover ((c/T)/(C/T), which is not always c/C in
// floating point). Weights are counts here.
func NewReferenceWorkload(tasks []Task, tracePods int64) (*Workload, error) {
	if tracePods <= 0 {
		return nil, fmt.Errorf("the original's weights need the trace's pod count")
	}
	if len(tasks) >= MaxTasks {
		// TypicalTasks stops at MaxTasks; the original keeps as many as its
		// coverage takes, so its weights would differ.
		return nil, fmt.Errorf("%d typical tasks: the original may keep more than the %d kept here", len(tasks), MaxTasks)
	}
	w, err := NewWorkload(tasks)
	if err != nil {
		return nil, err
	}
	total := float64(tracePods)
	var cum float64
	for _, t := range tasks {
		cum += t.Weight
	}
	for _, t := range tasks {
		p := t.Weight / total
		if cum != total { // the original renormalises only after a cut
			p /= cum / total
		}
		w.ref = append(w.ref, refTask{Task: t, w: p})
	}
	return w, nil
}

// Reference reports whether the workload carries the original's weights.
func (w *Workload) Reference() bool { return w != nil && w.ref != nil }

// The original's fragment classes, in the order it sums them
// (FragRatioDataMap); q3 is the part a task can use and is left out of F.
const (
	q1LackBoth = iota
	q2LackGPU
	q3Satisfied
	q4LackCPU
	xlSatisfied
	xrLackCPU
	noAccess
	classes
)

// refFrag is F as the original computes it, for a node of this model.
func (w *Workload) refFrag(s *NodeState, free *[MaxDevices]int32, count int32, cpuFree int64) float64 {
	var idle int64
	for i := 0; i < int(count); i++ {
		idle += int64(free[i])
	}
	var d [classes]float64
	for i := range w.ref {
		t := &w.ref[i]
		// Each product is rounded on its own (the explicit conversion
		// forbids a fused multiply-add, which arm64 or GOAMD64=v3 may
		// use), as the original's amd64 build did. math.Exp (the score's
		// sigmoid) is assembly on some architectures and may differ there
		// by an ulp: the published figures were reproduced on amd64.
		whole := float64(t.w * float64(idle))
		if t.Milli == 0 {
			if cpuFree >= t.CPU {
				d[xlSatisfied] += whole
			} else {
				d[xrLackCPU] += whole
			}
			continue
		}
		if !t.Models.Empty() && !t.Models.Matches(s.Model, s.ModelFold) {
			d[noAccess] += whole
			continue
		}
		var fits int32
		var small int64
		for k := 0; k < int(count); k++ {
			if free[k] >= t.Milli {
				fits++
			} else {
				small += int64(free[k])
			}
		}
		switch {
		case fits >= t.Count && cpuFree >= t.CPU:
			d[q2LackGPU] += float64(t.w * float64(small))
			d[q3Satisfied] += float64(t.w * float64(idle-small))
		case fits >= t.Count:
			d[q4LackCPU] += whole
		case cpuFree >= t.CPU:
			d[q2LackGPU] += whole
		default:
			d[q1LackBoth] += whole
		}
	}
	var f float64
	for k := range d {
		if k != q3Satisfied {
			f += d[k]
		}
	}
	return f
}

// refScore is the original's score from F before and after:
// int64(sigmoid((before−after)/1000)·100).
func refScore(before, after float64) int64 {
	return int64(1.0 / (1.0 + math.Exp(-((before - after) / MilliPerGPU))) * float64(100))
}
