package gpu

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"
)

// AnnotationTargetWorkload holds, on the scheduler's lease, the target
// workload each profile holds: what it learned (which remembers deleted
// pods), for kubectl gpu to read as the scheduler holds it. A JSON object
// of ExportedWorkload by profile name.
const AnnotationTargetWorkload = Prefix + "target-workload"

// ExportedWorkload is a target workload as published.
type ExportedWorkload struct {
	// At is when it was published.
	At time.Time `json:"at"`
	// Holder is the lease's holder when it was published (its leader);
	// "" for a scheduler without leader election. An entry whose holder
	// no longer holds the lease is a former leader's.
	Holder string         `json:"holder,omitempty"`
	Tasks  []ExportedTask `json:"tasks"`
	// What a reader needs to go on learning as the learner does
	// (Learner.Resume); absent, it can only keep the tasks as they are.
	// SeenPods is the weight of every pod the learner counts, and
	// PendingPods of those since its target was last rebuilt, in pods as
	// the next one weighs (old ones decay). Kinds are the heaviest kinds it
	// counts (at most MaxExportedKinds), their weights in the same unit.
	// GroupedCPU: it groups kinds by CPU. Recent are the UIDs of the last
	// pods it observed, oldest first.
	SeenPods    float64        `json:"seenPods,omitempty"`
	PendingPods float64        `json:"pendingPods,omitempty"`
	GroupedCPU  bool           `json:"groupedCPU,omitempty"`
	Kinds       []ExportedTask `json:"kinds,omitempty"`
	Recent      []string       `json:"recent,omitempty"`
	// Trimmed: kinds or pods named were left out to fit the lease (Trim).
	Trimmed bool `json:"trimmed,omitempty"`
}

// ExportedTask is one typical pod of an exported workload.
type ExportedTask struct {
	CPUMilli  int64 `json:"cpuMilli"`
	MemoryMiB int64 `json:"memoryMiB,omitempty"`
	GPUMilli  int32 `json:"gpuMilli,omitempty"`
	GPUCount  int32 `json:"gpuCount,omitempty"`
	// Models are the model selector's exact names, and its HAMi-style
	// substrings to include and exclude.
	Models        []string `json:"models,omitempty"`
	ModelsInclude []string `json:"modelsInclude,omitempty"`
	ModelsExclude []string `json:"modelsExclude,omitempty"`
	Weight        float64  `json:"weight"`
}

// Export is the workload as published: its tasks (Learner.Export adds
// what a reader needs to go on learning).
func (w *Workload) Export(at time.Time) ExportedWorkload {
	out := ExportedWorkload{At: at.UTC().Truncate(time.Second), Tasks: make([]ExportedTask, 0, len(w.tasks))}
	for _, t := range w.tasks {
		out.Tasks = append(out.Tasks, exportTask(t))
	}
	return out
}

func exportTask(t Task) ExportedTask {
	return ExportedTask{CPUMilli: t.CPU, MemoryMiB: t.Memory, GPUMilli: t.Milli, GPUCount: t.Count,
		Models: slices.Clone(t.Models.Exact), ModelsInclude: slices.Clone(t.Models.Include), ModelsExclude: slices.Clone(t.Models.Exclude),
		Weight: t.Weight}
}

func importTask(t ExportedTask) Task {
	return Task{CPU: t.CPUMilli, Memory: t.MemoryMiB, Milli: t.GPUMilli, Count: t.GPUCount,
		Models: ModelSelector{Exact: t.Models, Include: t.ModelsInclude, Exclude: t.ModelsExclude}, Weight: t.Weight}
}

// Workload is the exported workload as a workload again.
func (e ExportedWorkload) Workload() (*Workload, error) {
	if len(e.Tasks) == 0 {
		return nil, fmt.Errorf("no tasks")
	}
	tasks := make([]Task, 0, len(e.Tasks))
	for _, t := range e.Tasks {
		tasks = append(tasks, importTask(t))
	}
	return NewWorkload(tasks)
}

// ExportedWorkloads reads the annotation: the workload of each profile.
func ExportedWorkloads(annotation string) (map[string]ExportedWorkload, error) {
	out := map[string]ExportedWorkload{}
	if annotation == "" {
		return out, nil
	}
	if err := json.Unmarshal([]byte(annotation), &out); err != nil {
		return nil, fmt.Errorf("%s: %w", AnnotationTargetWorkload, err)
	}
	return out, nil
}

// SimilarTasks reports whether two exports hold the same kinds of task,
// each weighing within a hundredth of its share the same.
func (e ExportedWorkload) SimilarTasks(o ExportedWorkload) bool {
	return slices.EqualFunc(e.Tasks, o.Tasks, func(a, b ExportedTask) bool {
		w := a.Weight
		a.Weight = b.Weight
		return sameTask(a, b) && math.Abs(w-b.Weight) <= 0.01+1e-9
	})
}

// minTrimmedRecent is how many of the pods named a trimmed export keeps
// while it has kinds to drop: they tell the pods created in the export's
// last seconds that the learner had observed.
const minTrimmedRecent = 32

// Trim shrinks the export to at most budget bytes of JSON, or as near as it
// can, marking it Trimmed: it drops the pods named but the newest
// minTrimmedRecent, then the lightest kinds that are none of the tasks',
// then the rest of the pods named. The tasks, and the kinds they were
// learned as, stay. Annotations share a limit, and the lease is written
// at every renewal.
func (e *ExportedWorkload) Trim(budget int) {
	size := func() int {
		b, err := json.Marshal(e)
		if err != nil {
			return 0
		}
		return len(b)
	}
	for size() > budget {
		switch {
		case len(e.Recent) > minTrimmedRecent:
			e.Recent = e.Recent[len(e.Recent)-max(minTrimmedRecent, len(e.Recent)/2):] // keep the newest
		case e.dropLightKinds():
		case len(e.Recent) > 0:
			e.Recent = e.Recent[len(e.Recent)-len(e.Recent)/2:]
		default:
			return
		}
		e.Trimmed = true
	}
}

// dropLightKinds drops the lightest quarter (at least one) of the kinds
// that are none of the tasks'; false if there are none.
func (e *ExportedWorkload) dropLightKinds() bool {
	key := func(t ExportedTask) ExportedTask {
		if e.GroupedCPU {
			t.CPUMilli = cpuBucket(t.CPUMilli)
		}
		t.MemoryMiB, t.Weight = 0, 0 // a kind's mean memory moves after its task was built
		return t
	}
	isTask := make([]bool, len(e.Kinds))
	n := 0
	for i, k := range e.Kinds {
		isTask[i] = slices.ContainsFunc(e.Tasks, func(t ExportedTask) bool { return sameTask(key(t), key(k)) })
		if !isTask[i] {
			n++
		}
	}
	if n == 0 {
		return false
	}
	drop := make([]bool, len(e.Kinds))
	for i, left := len(e.Kinds)-1, max(1, n/4); i >= 0 && left > 0; i-- { // the lightest last
		if !isTask[i] {
			drop[i] = true
			left--
		}
	}
	var kept []ExportedTask
	for i, k := range e.Kinds {
		if !drop[i] {
			kept = append(kept, k)
		}
	}
	e.Kinds = kept
	return true
}

// SameWeights reports whether two exports were learned from the same pods,
// as far as their weights tell.
func (e ExportedWorkload) SameWeights(o ExportedWorkload) bool {
	return e.SeenPods == o.SeenPods && e.PendingPods == o.PendingPods && e.GroupedCPU == o.GroupedCPU
}

// SameTasks reports whether two exports hold the same tasks.
func (e ExportedWorkload) SameTasks(o ExportedWorkload) bool {
	return slices.EqualFunc(e.Tasks, o.Tasks, sameTask)
}

func sameTask(a, b ExportedTask) bool {
	return a.CPUMilli == b.CPUMilli && a.MemoryMiB == b.MemoryMiB && a.GPUMilli == b.GPUMilli && a.GPUCount == b.GPUCount &&
		a.Weight == b.Weight && slices.Equal(a.Models, b.Models) && slices.Equal(a.ModelsInclude, b.ModelsInclude) &&
		slices.Equal(a.ModelsExclude, b.ModelsExclude)
}
