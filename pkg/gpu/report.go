package gpu

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
)

// FragAt is the node's fragmentation against the workload with the given
// CPU (milli) left on it: the idle milli-GPU the workload's typical tasks
// could not use, expected by their shares (memory not counted, as in the
// published metric). With needsDelivery, shares cannot use a node whose
// agent does not deliver them, as the scheduler places them.
func FragAt(w *Workload, s *NodeState, cpuFree int64, needsDelivery bool) float64 {
	if s.Count == 0 {
		return 0
	}
	var match [maskWords]uint64
	w.matchMask(s, &match)
	if needsDelivery && !s.Delivers() {
		for i := range w.tasks {
			if t := &w.tasks[i]; t.Count == 1 && t.Milli > 0 && t.Milli < MilliPerGPU {
				match[i/64] &^= 1 << uint(i%64)
			}
		}
	}
	return w.frag(&s.Free, s.Count, cpuFree, math.MaxInt64, &match)
}

// Room is how many more pods of a GPU task the node could take on its own:
// shares by device (and by the agent's free slots), whole GPUs by free
// devices, bounded by the CPU (milli) and memory (MiB) left. With
// needsDelivery, as the scheduler places shares (accountingOnlySharing
// off), a node whose agent does not deliver shares takes none.
func (s *NodeState) Room(t *Task, cpuFree, memFreeMiB int64, needsDelivery bool) int64 {
	if t.Milli == 0 || t.Count == 0 || s.Count == 0 || s.Overcommitted {
		return 0
	}
	share := t.Count == 1 && t.Milli < MilliPerGPU
	if share && needsDelivery && !s.Delivers() {
		return 0
	}
	var n int64
	whole := int64(0)
	for i := 0; i < int(s.Count); i++ {
		model, fold := s.Model, s.ModelFold
		if s.agent != nil {
			d := &s.agent.devs[i]
			model, fold = d.Model, d.modelFold
		}
		if !t.Models.Empty() && !t.Models.Matches(model, fold) {
			continue
		}
		if share {
			k := int64(s.Free[i] / t.Milli)
			if s.agent != nil {
				k = min(k, int64(max(s.agent.devs[i].Slots-s.agent.slots[i], 0)))
			}
			n += k
		} else if s.Free[i] == MilliPerGPU {
			whole++
		}
	}
	if !share {
		n = whole / int64(t.Count)
	}
	if t.CPU > 0 {
		n = min(n, max(cpuFree, 0)/t.CPU)
	}
	if t.Memory > 0 {
		n = min(n, max(memFreeMiB, 0)/t.Memory)
	}
	return n
}

// TopGPUTasks is the workload's n most common GPU tasks, heaviest first, one
// per kind (TaskKind).
func TopGPUTasks(w *Workload, n int) []Task {
	var out []Task
	for _, t := range w.Tasks() {
		if t.Milli > 0 {
			out = append(out, t)
		}
	}
	slices.SortStableFunc(out, func(a, b Task) int { return cmp.Compare(b.Weight, a.Weight) })
	seen := map[string]bool{}
	kept := out[:0]
	for _, t := range out {
		if k := TaskKind(t); !seen[k] && len(kept) < n {
			seen[k] = true
			kept = append(kept, t)
		}
	}
	return kept
}

// TaskKind names a task for people and metric labels: devices x milli per
// device, CPU, memory when counted, and the models it allows, for example
// "1x500m 4cpu" or "2x1000m 16cpu 64Gi NVIDIA-A100-SXM4-80GB".
func TaskKind(t Task) string {
	// A learned task's CPU is a mean: two decimals of a core.
	s := fmt.Sprintf("%dx%dm %scpu", t.Count, t.Milli, strconv.FormatFloat(math.Round(float64(t.CPU)/10)/100, 'f', -1, 64))
	if t.Memory > 0 {
		if t.Memory%1024 == 0 {
			s += fmt.Sprintf(" %dGi", t.Memory/1024)
		} else {
			s += fmt.Sprintf(" %dMi", t.Memory)
		}
	}
	if !t.Models.Empty() {
		s += " " + t.Models.String()
	}
	return s
}
