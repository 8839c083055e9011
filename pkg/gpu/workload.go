package gpu

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Task is one kind of typical pod in a target workload, with its share.
type Task struct {
	CPU int64
	// Memory in MiB; 0 leaves memory out of the fit.
	Memory int64
	Milli  int32 // per device; 0 means CPU-only
	Count  int32 // devices; 1 for a shared GPU
	Models ModelSelector
	Weight float64
}

// TaskOf describes a request as a task (memory-denominated requests have no
// node-independent size and are not typical tasks).
func TaskOf(r *Request) (Task, bool) {
	t := Task{CPU: r.CPU, Memory: r.Memory, Models: r.Models}
	switch {
	case r.Count > 0:
		t.Count, t.Milli = r.Count, MilliPerGPU
	case r.Milli > 0:
		t.Count, t.Milli = 1, r.Milli
	case r.MemoryMiB > 0:
		return Task{}, false
	}
	return t, true
}

// MaxTasks bounds a target workload: Frag costs O(tasks) per node, and a
// fixed bound keeps the per-node model mask in the cache entry itself.
const MaxTasks = 128

// maxLearnerKeys bounds the kinds of pod a Learner counts: beyond it, kinds
// that differ only by a few percent of CPU are grouped (coarsen) if that
// halves them, else the lightest half is dropped (they weigh least in the
// target, and old ones have decayed). Pods choose their own model strings,
// so without a bound a flood of distinct ones would grow it without end.
const maxLearnerKeys = 1024

// maxLearnedModels bounds the model selector a learned task keeps, in bytes
// of its String(): a longer one (no real GPU needs it) is learned without it.
const maxLearnedModels = 256

// MaxLearnedTasks bounds a learned workload. The tail beyond the most common
// 64 kinds of pod weighs little in F and would only make scoring slower.
const MaxLearnedTasks = 64

const maskWords = MaxTasks / 64

// Workload is a target workload: the typical tasks, by how often they come.
// Fragmentation is measured against it. It is immutable.
type Workload struct {
	tasks []Task // sorted by Milli ascending, weights sum to 1
	// maxCPU and maxMem are the largest CPU and memory of a GPU task: a
	// node left with at least that much frees no GPU task by CPU or memory.
	maxCPU, maxMem int64
	// ref is the published simulator's view of the same tasks
	// (NewReferenceWorkload); nil otherwise.
	ref []refTask
	// scarce memoises Scarcity for the last fleet asked.
	scarce scarcitySlot
	// restricted: a GPU task restricts its model.
	restricted bool
}

// NewWorkload normalises the weights and orders the tasks for Frag.
func NewWorkload(tasks []Task) (*Workload, error) {
	var sum float64
	for i, t := range tasks {
		if err := checkTask(t); err != nil {
			return nil, fmt.Errorf("task %d: %w", i, err)
		}
		sum += t.Weight
	}
	if len(tasks) == 0 || sum <= 0 {
		return nil, fmt.Errorf("a target workload needs at least one task with a positive weight")
	}
	if len(tasks) > MaxTasks {
		return nil, fmt.Errorf("a target workload has at most %d tasks, not %d", MaxTasks, len(tasks))
	}
	w := &Workload{tasks: make([]Task, len(tasks))}
	copy(w.tasks, tasks)
	for i := range w.tasks {
		w.tasks[i].Weight /= sum
	}
	sort.SliceStable(w.tasks, func(i, j int) bool { return w.tasks[i].Milli < w.tasks[j].Milli })
	for _, t := range w.tasks {
		if t.Milli > 0 {
			w.maxCPU, w.maxMem = max(w.maxCPU, t.CPU), max(w.maxMem, t.Memory)
			w.restricted = w.restricted || !t.Models.Empty()
		}
	}
	return w, nil
}

// checkTask is what every task of a workload must be.
func checkTask(t Task) error {
	switch {
	case !(t.Weight >= 0) || math.IsInf(t.Weight, 1) || t.Milli < 0 || t.Milli > MilliPerGPU || t.Count < 0 || t.CPU < 0:
		return fmt.Errorf("weight, cpu, milli-GPU (0-1000) and count must not be negative")
	case t.Milli > 0 && t.Count == 0:
		return fmt.Errorf("a GPU task needs a device count")
	case t.Milli > 0 && t.Milli < MilliPerGPU && t.Count > 1:
		return fmt.Errorf("a shared GPU task takes one device")
	}
	return nil
}

// Tasks returns the tasks (do not modify).
func (w *Workload) Tasks() []Task { return w.tasks }

// fragCache memoises a node's baseline fragmentation for one workload.
type fragCache struct {
	wl       *Workload
	memAware bool
	ref      bool              // the base is the original's F (refFrag)
	match    [maskWords]uint64 // task i's model selector allows this node
	base     float64
	// cpuPer and memPer are the CPU and memory per milli-GPU of the GPU
	// tasks this node can run, weighted by how often they come.
	cpuPer, memPer float64
}

type fragSlot struct{ p atomic.Pointer[fragCache] }

func (w *Workload) matchMask(s *NodeState, mask *[maskWords]uint64) {
	for i := range w.tasks {
		t := &w.tasks[i]
		if t.Models.Empty() || t.Models.Matches(s.Model, s.ModelFold) {
			mask[i/64] |= 1 << uint(i%64)
		}
	}
}

// cache returns the node's memoised baseline for this workload.
func (w *Workload) cache(s *NodeState, memAware bool) *fragCache {
	return w.cacheAs(s, memAware, false)
}

// cacheAs is cache, with the base in the original's arithmetic if ref.
func (w *Workload) cacheAs(s *NodeState, memAware, ref bool) *fragCache {
	if c := s.frag.p.Load(); c != nil && c.wl == w && c.memAware == memAware && c.ref == ref {
		return c
	}
	c := &fragCache{wl: w, memAware: memAware, ref: ref}
	w.matchMask(s, &c.match)
	c.cpuPer, c.memPer = w.perMilli(&c.match)
	mem := int64(math.MaxInt64)
	if memAware {
		mem = s.MemFree
	}
	if ref {
		c.base = w.refFrag(s, &s.Free, s.Count, s.CPUFree)
	} else {
		c.base = w.frag(&s.Free, s.Count, s.CPUFree, mem, &c.match)
	}
	s.frag.p.Store(c)
	return c
}

// perMilli is the CPU and memory per milli-GPU of the matching GPU tasks.
func (w *Workload) perMilli(match *[maskWords]uint64) (cpu, mem float64) {
	var gpu, gpuMem float64 // gpuMem: of the tasks that count memory (Memory 0 leaves it out)
	for i := range w.tasks {
		t := &w.tasks[i]
		if t.Milli == 0 || match[i/64]&(1<<uint(i%64)) == 0 {
			continue
		}
		g := t.Weight * float64(t.Milli) * float64(t.Count)
		gpu += g
		cpu += t.Weight * float64(t.CPU)
		if t.Memory > 0 {
			gpuMem += g
			mem += t.Weight * float64(t.Memory)
		}
	}
	if gpu > 0 {
		cpu /= gpu
	}
	if gpuMem > 0 {
		mem /= gpuMem
	}
	return cpu, mem
}

// Frag is the node's fragmentation F_n in milli-GPU: the expected idle GPU that
// a typical task could not use (openb-benchmark.md §5; memory not counted).
func (w *Workload) Frag(s *NodeState) float64 {
	if s.Count == 0 {
		return 0
	}
	return w.cache(s, false).base
}

// frag computes F for a device vector without allocating. memFree is
// math.MaxInt64 when memory is not counted. Tasks are sorted by
// milli, so one pass over the sorted devices gives, per task, the idle GPU on
// devices too small for it and how many devices are large enough.
func (w *Workload) frag(free *[MaxDevices]int32, count int32, cpuFree, memFree int64, match *[maskWords]uint64) float64 {
	var sorted [MaxDevices]int32
	n := int(count)
	var idle int64
	for i := 0; i < n; i++ {
		v := free[i]
		idle += int64(v)
		j := i
		for j > 0 && sorted[j-1] > v {
			sorted[j] = sorted[j-1]
			j--
		}
		sorted[j] = v
	}
	if idle == 0 {
		return 0
	}
	var f float64
	var below int64 // idle GPU on devices smaller than the current task
	j := 0
	for i := range w.tasks {
		t := &w.tasks[i]
		if t.Milli == 0 || match[i/64]&(1<<uint(i%64)) == 0 {
			f += t.Weight * float64(idle)
			continue
		}
		for j < n && sorted[j] < t.Milli {
			below += int64(sorted[j])
			j++
		}
		if int32(n-j) >= t.Count && cpuFree >= t.CPU && memFree >= t.Memory {
			f += t.Weight * float64(below)
		} else {
			f += t.Weight * float64(idle)
		}
	}
	return f
}

// stranded is the idle GPU (milli) on a node that the CPU and memory it has
// left cannot serve at cpuPer and memPer (the CPU and memory a typical pod
// asks per milli-GPU): what typical pods would leave idle once the node
// runs out of CPU or memory. memFree is math.MaxInt64 when memory is not
// counted.
func stranded(idle, cpuFree, memFree int64, cpuPer, memPer float64) float64 {
	var s float64
	if cpuPer > 0 {
		s = float64(idle) - float64(max(cpuFree, 0))/cpuPer
	}
	if memPer > 0 && memFree != math.MaxInt64 {
		s = max(s, float64(idle)-float64(max(memFree, 0))/memPer)
	}
	return max(s, 0)
}

// Learner learns the target workload online from the requests the scheduler
// sees, which is all a live cluster can know. Old observations decay, so the
// target follows a changing mix. Kinds of pod are told apart by their exact
// CPU, as the trace's typical pods are; where requests vary so finely by CPU
// that the most common MaxLearnedTasks kinds cover under half of coverage,
// or the kinds reach maxLearnerKeys, they are grouped by cpuBucket from then
// on (coarsenIfItHalves).
type Learner struct {
	mu       sync.Mutex
	coverage float64
	halfLife float64
	counts   map[taskKey]*learned
	scale    float64 // weight of the next observation; grows to implement decay
	total    float64
	pending  float64 // weight observed since the last rebuild
	seen     map[string]struct{}
	seenRing []string
	seenNext int
	current  atomic.Pointer[Workload]
	// bucketed keys kinds by cpuBucket of their CPU.
	bucketed bool
	// resumed: the counts are another learner's export (Resume).
	resumed bool
}

type taskKey struct {
	cpu    int64
	milli  int32
	count  int32
	models string
}

type learned struct {
	task   Task
	weight float64
	// cpuSum and memSum accumulate weight·request: a key's CPU and memory
	// are their means, within the members' range. cpuSum is 0 for exact
	// keys (TypicalTasks).
	cpuSum, memSum float64
	// The members' range, exact: a kind whose members all ask the same
	// takes that, not a weighted mean that float rounding may put a
	// millicore above every member (which would call a node that fits them
	// all too small).
	cpuMin, cpuMax, memMin, memMax int64
}

func (e *learned) add(w float64, cpu, mem int64) {
	if e.weight == 0 {
		e.cpuMin, e.cpuMax, e.memMin, e.memMax = cpu, cpu, mem, mem
	}
	e.weight += w
	e.cpuSum += w * float64(cpu)
	e.memSum += w * float64(mem)
	e.cpuMin, e.cpuMax = min(e.cpuMin, cpu), max(e.cpuMax, cpu)
	e.memMin, e.memMax = min(e.memMin, mem), max(e.memMax, mem)
}

// merge folds o into e (coarsening to buckets).
func (e *learned) merge(o *learned) {
	if e.weight == 0 {
		*e = *o
		return
	}
	e.weight += o.weight
	e.cpuSum += o.cpuSum
	e.memSum += o.memSum
	e.cpuMin, e.cpuMax = min(e.cpuMin, o.cpuMin), max(e.cpuMax, o.cpuMax)
	e.memMin, e.memMax = min(e.memMin, o.memMin), max(e.memMax, o.memMax)
}

// NewLearner keeps the most common tasks that together make up coverage of
// the pods, with observations losing half their weight every halfLife pods.
func NewLearner(coverage float64, halfLife int) *Learner {
	return &Learner{
		coverage: coverage,
		halfLife: float64(halfLife),
		counts:   map[taskKey]*learned{},
		scale:    1,
		seen:     map[string]struct{}{},
		seenRing: make([]string, 1<<16),
	}
}

// BucketCPU groups kinds by cpuBucket of their CPU from now on (an ablation
// of the simulator's, from the first pod: the learner's grouping before
// exact keys).
func (l *Learner) BucketCPU() *Learner {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.coarsen()
	return l
}

// Observe counts a pod once, however often it is retried.
func (l *Learner) Observe(uid string, r *Request) {
	t, ok := TaskOf(r)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if uid != "" && !l.see(uid) {
		return
	}
	// Where CPU requests vary finely (coarsen), pods that differ by a few
	// percent of CPU are one kind, with their mean CPU.
	models := t.Models.String()
	if len(models) > maxLearnedModels {
		t.Models, models = ModelSelector{}, ""
	}
	k := taskKey{cpu: t.CPU, milli: t.Milli, count: t.Count, models: models}
	if l.bucketed {
		k.cpu = cpuBucket(t.CPU)
	}
	e := l.counts[k]
	if e == nil {
		if len(l.counts) >= maxLearnerKeys && l.coarsenIfItHalves() {
			k.cpu = cpuBucket(t.CPU)
			e = l.counts[k]
		}
		if e == nil && len(l.counts) >= maxLearnerKeys {
			l.prune()
		}
		if e == nil {
			e = &learned{task: t}
			l.counts[k] = e
		}
	}
	e.add(l.scale, t.CPU, t.Memory)
	l.total += l.scale
	l.pending += l.scale
	if l.halfLife > 0 {
		l.scale *= math.Exp2(1 / l.halfLife)
		if l.scale > 1e100 { // renormalise long before overflow
			for _, c := range l.counts {
				c.weight /= l.scale
				c.cpuSum /= l.scale
				c.memSum /= l.scale
			}
			l.total /= l.scale
			l.pending /= l.scale
			l.scale = 1
		}
	}
	// Rebuild when the new weight is a noticeable part of the whole: often
	// while the mix is being learned, rarely once it is known.
	if l.current.Load() == nil || l.pending >= l.total/100 {
		l.rebuild()
		l.pending = 0
	}
}

// see records a pod as seen; false if it was already.
func (l *Learner) see(uid string) bool {
	if _, dup := l.seen[uid]; dup || uid == "" {
		return false
	}
	if old := l.seenRing[l.seenNext]; old != "" {
		delete(l.seen, old)
	}
	l.seenRing[l.seenNext] = uid
	l.seenNext = (l.seenNext + 1) % len(l.seenRing)
	l.seen[uid] = struct{}{}
	return true
}

// coarsen regroups the kinds by cpuBucket of their CPU, for good: requests
// this varied are better learned as groups of nearly the same size than cut
// down to the heaviest exact ones.
func (l *Learner) coarsen() {
	if l.bucketed {
		return
	}
	old := make([]taskKey, 0, len(l.counts))
	for k := range l.counts {
		old = append(old, k)
	}
	// In key order, so that the merged sums, and the target, do not depend
	// on the map's.
	sort.Slice(old, func(i, j int) bool { return keyLess(old[i], old[j]) })
	counts := make(map[taskKey]*learned, len(old))
	for _, k := range old {
		e := l.counts[k]
		k.cpu = cpuBucket(k.cpu)
		if c := counts[k]; c != nil {
			c.merge(e)
		} else {
			counts[k] = e
		}
	}
	l.counts, l.bucketed = counts, true
}

// coarsenIfItHalves coarsens if that at least halves the kinds: kinds that
// differ by more than CPU (models, shares) are not what grouping is for.
func (l *Learner) coarsenIfItHalves() bool {
	if l.bucketed || l.resumed {
		return false
	}
	seen := make(map[taskKey]struct{}, len(l.counts))
	for k := range l.counts {
		k.cpu = cpuBucket(k.cpu)
		seen[k] = struct{}{}
	}
	if len(seen) > len(l.counts)/2 {
		return false
	}
	l.coarsen()
	return true
}

// prune keeps the heavier half of the kinds counted. Their total stays as
// it was: the dropped weight was the tail the coverage cut leaves out.
func (l *Learner) prune() {
	ws := make([]float64, 0, len(l.counts))
	for _, e := range l.counts {
		ws = append(ws, e.weight)
	}
	sort.Float64s(ws)
	cut := ws[len(ws)/2]
	for k, e := range l.counts {
		if e.weight < cut || (e.weight == cut && len(l.counts) > maxLearnerKeys/2) {
			delete(l.counts, k)
		}
	}
}

// Kinds is how many kinds of pod the learner counts (tests, metrics).
func (l *Learner) Kinds() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.counts)
}

func (l *Learner) rebuild() {
	entries := sortedKinds(l.counts)
	tasks := topTasks(entries, l.total, l.coverage, MaxLearnedTasks)
	if !l.bucketed && len(tasks) == MaxLearnedTasks && len(entries) > MaxLearnedTasks {
		var covered float64
		for _, t := range tasks {
			covered += t.Weight
		}
		// So many exact kinds that the most common ones describe less
		// than half of what the target should: group them, if CPU is
		// what tells them apart.
		if covered < l.coverage*l.total/2 && l.coarsenIfItHalves() {
			l.rebuild()
			return
		}
	}
	if wl, err := NewWorkload(tasks); err == nil {
		l.current.Store(wl)
	}
}

// sortedKinds is counts' kinds, the heaviest first (ties by the larger key).
func sortedKinds(counts map[taskKey]*learned) []*learned {
	entries := make([]*learned, 0, len(counts))
	keys := make(map[*learned]taskKey, len(counts))
	for k, e := range counts {
		entries = append(entries, e)
		keys[e] = k
	}
	sort.Slice(entries, func(i, j int) bool {
		if entries[i].weight != entries[j].weight {
			return entries[i].weight > entries[j].weight
		}
		return keyLess(keys[entries[j]], keys[entries[i]])
	})
	return entries
}

// MaxExportedKinds bounds the kinds an export carries: the learned target's
// at most, and as many past its coverage cut.
const MaxExportedKinds = 2 * MaxLearnedTasks

// maxExportedRecent bounds the pods an export names as the last observed.
const maxExportedRecent = 128

// Export is the current target as published (nil before any pod), with
// what a reader needs to go on learning as this learner does (Resume): the
// heaviest kinds counted, the weight of every pod counted and of those since
// the last rebuild, and the last pods observed. It changes nothing: the
// learner rebuilds when it would have.
func (l *Learner) Export(at time.Time) (*Workload, ExportedWorkload) {
	l.mu.Lock()
	defer l.mu.Unlock()
	wl := l.current.Load()
	if wl == nil {
		return nil, ExportedWorkload{}
	}
	e := wl.Export(at)
	e.SeenPods, e.PendingPods, e.GroupedCPU = l.total/l.scale, l.pending/l.scale, l.bucketed
	entries := sortedKinds(l.counts)
	for _, t := range topTasks(entries[:min(len(entries), MaxExportedKinds)], math.Inf(1), 1, MaxExportedKinds) {
		x := exportTask(t)
		x.Weight = t.Weight / l.scale
		e.Kinds = append(e.Kinds, x)
	}
	for i := 1; i <= len(l.seenRing) && len(e.Recent) < maxExportedRecent; i++ {
		uid := l.seenRing[(l.seenNext-i+len(l.seenRing))%len(l.seenRing)]
		if uid == "" {
			break
		}
		e.Recent = append(e.Recent, uid)
	}
	slices.Reverse(e.Recent)
	return wl, e
}

// Resume makes the learner go on from a target another learner exported
// (kubectl gpu whatif: the scheduler's, which then learns from each pod it
// places, as the scheduler will): its target, its kinds and weights, and
// where it stood between rebuilds. What the learner counted and saw before
// is dropped (MarkSeen tells it the pods the export stands for). Kinds past
// the exported ones are not known: their weight stays in the total, as the
// exporter's did; and a resumed learner never groups kinds by CPU on its
// own, since it would decide from a part of what the exporter counts.
func (l *Learner) Resume(e ExportedWorkload) error {
	if !(e.SeenPods > 0 && e.SeenPods < 1e15) || !(e.PendingPods >= 0 && e.PendingPods <= e.SeenPods) || len(e.Kinds) == 0 {
		return fmt.Errorf("the target was published without what the scheduler learned it from (its kinds and their weight)")
	}
	if e.At.IsZero() {
		return fmt.Errorf("the target was published without its time")
	}
	wl, err := e.Workload()
	if err != nil {
		return err
	}
	counts := make(map[taskKey]*learned, len(e.Kinds))
	for i, x := range e.Kinds {
		t := importTask(x)
		if err := checkTask(t); err != nil {
			return fmt.Errorf("kind %d: %w", i, err)
		}
		if !(x.Weight >= 0 && x.Weight <= e.SeenPods*(1+1e-9)) {
			return fmt.Errorf("kind %d weighs %v pods of the %v counted", i, x.Weight, e.SeenPods)
		}
		k := taskKey{cpu: t.CPU, milli: t.Milli, count: t.Count, models: t.Models.String()}
		if e.GroupedCPU {
			k.cpu = cpuBucket(t.CPU)
		}
		c := counts[k]
		if c == nil {
			c = &learned{task: t}
			counts[k] = c
		}
		c.add(x.Weight, t.CPU, t.Memory)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.counts, l.bucketed, l.resumed = counts, e.GroupedCPU, true
	l.scale, l.total, l.pending = 1, e.SeenPods, e.PendingPods
	clear(l.seen)
	clear(l.seenRing)
	l.seenNext = 0
	l.current.Store(wl)
	return nil
}

// MarkSeen has the learner take pods as observed, without counting them
// (after Resume: those the export stands for).
func (l *Learner) MarkSeen(uids ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, uid := range uids {
		l.see(uid)
	}
}

// topTasks keeps the leading tasks until they cover the given share, or
// until there are limit of them.
func topTasks(entries []*learned, total, coverage float64, limit int) []Task {
	var tasks []Task
	var cum float64
	for _, e := range entries {
		if len(tasks) == limit {
			break
		}
		t := e.task
		t.Weight = e.weight
		if e.weight > 0 {
			t.Memory = min(max(int64(e.memSum/e.weight), e.memMin), e.memMax)
			if e.cpuSum > 0 {
				t.CPU = min(max(int64(math.Ceil(e.cpuSum/e.weight)), e.cpuMin), e.cpuMax)
			}
		}
		tasks = append(tasks, t)
		cum += e.weight
		if cum >= coverage*total-1e-9 {
			break
		}
	}
	return tasks
}

func keyLess(a, b taskKey) bool {
	if a.cpu != b.cpu {
		return a.cpu < b.cpu
	}
	if a.milli != b.milli {
		return a.milli < b.milli
	}
	if a.count != b.count {
		return a.count < b.count
	}
	return a.models < b.models
}

// Workload returns the current learned target, or nil before any pod.
func (l *Learner) Workload() *Workload { return l.current.Load() }

// TypicalTasks builds the paper's target workload from a whole trace: tasks
// grouped by (cpu, milli, count, models), most frequent first (ties by the
// larger key), until coverage of the pods is reached.
func TypicalTasks(reqs []Request, coverage float64) []Task {
	counts := map[taskKey]*learned{}
	var total float64
	for i := range reqs {
		t, ok := TaskOf(&reqs[i])
		if !ok {
			continue
		}
		k := taskKey{cpu: t.CPU, milli: t.Milli, count: t.Count, models: t.Models.String()}
		e := counts[k]
		if e == nil {
			e = &learned{task: t, cpuMin: t.CPU, cpuMax: t.CPU, memMin: t.Memory, memMax: t.Memory}
			counts[k] = e
		}
		e.weight++
		e.memSum += float64(t.Memory)
		e.memMin, e.memMax = min(e.memMin, t.Memory), max(e.memMax, t.Memory)
		total++
	}
	return topTasks(sortedKinds(counts), total, coverage, MaxTasks)
}

// cpuBucket rounds a CPU request up to three significant bits (at most 12.5%
// more), so that a learned workload groups requests of nearly the same size.
func cpuBucket(milli int64) int64 {
	if milli <= 8 {
		return milli
	}
	step := int64(1) << (bits.Len64(uint64(milli)) - 4)
	return (milli + step - 1) / step * step
}
