package requeue

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
	"unsafe"
	"weak"

	v1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"
	v1helper "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// nodeView is what the reconciler knows of a node: its GPU state (pods and
// reservations, from the informers) and the CPU, memory and pod slots left.
// Bookings change it: mu guards the mutable part.
type nodeView struct {
	node *v1.Node

	mu      sync.Mutex
	gpu     *gpu.NodeState
	cpuFree int64
	memFree int64
	podFree int64
}

// view is the cluster, as of one moment. Activations book into it, so that
// one freed device wakes one pod, not every pod waiting for it. Checks run
// in parallel; each node has its own lock.
type view struct {
	nodes []*nodeView
	built time.Time
	// groups bound what any node of a model could give, so that a pod that
	// fits nowhere is told so without visiting every node. Bookings only
	// take capacity: the bounds stay upper bounds.
	groups map[string]*capacityGroup
	// shapes holds the verdicts of pods no node could take, by what the
	// verdict depends on: a backlog of replicas is judged once per view.
	// Bookings only take capacity, so a verdict of no room stays true.
	shapes sync.Map
}

// capacityGroup is the most any node of one GPU model has free (agent
// nodes form one group: their devices carry their own models).
type capacityGroup struct {
	model, fold  string
	agent        bool
	maxFullyFree int32
	maxFree      int32
	// idle is the group's idle milli-GPU, as built.
	idle int64
}

func newView() *view { return &view{built: time.Now(), groups: map[string]*capacityGroup{}} }

// add puts a node in the view and in its capacity group.
func (v *view) add(nv *nodeView) {
	v.nodes = append(v.nodes, nv)
	st := nv.gpu
	if st.Count == 0 || st.Overcommitted {
		return
	}

	key, agent := st.Model, st.Devices != nil
	if agent {
		key = "\x00agent"
	}
	g := v.groups[key]
	if g == nil {
		g = &capacityGroup{model: st.Model, fold: st.ModelFold, agent: agent}
		v.groups[key] = g
	}
	g.maxFullyFree = max(g.maxFullyFree, st.FullyFree())
	g.idle += st.Idle()
	for i := int32(0); i < st.Count; i++ {
		g.maxFree = max(g.maxFree, st.Free[i])
	}
}

// fitsNowhere reports, from the capacity groups alone, that no node can
// take the request's GPUs now: too few free devices on any node of an
// allowed model, or no free capacity at all. False means: look closer.
func (v *view) fitsNowhere(req *gpu.Request) bool {
	for _, g := range v.groups {
		if g.agent {
			// Their projection rounds a little memory down to no milli:
			// no bound from it.
			return false
		}
		if !req.Models.Empty() && !req.Models.Matches(g.model, g.fold) {
			continue
		}
		switch {
		case req.Count > 0:
			if g.maxFullyFree >= req.Count {
				return false
			}
		case req.Milli > 0:
			if g.maxFree >= req.Milli {
				return false
			}
		default:
			if g.maxFree > 0 {
				return false
			}
		}
	}
	return true
}

// podRequests is the pod's effective CPU (milli) and memory (bytes).
func podRequests(p *v1.Pod) (int64, int64) {
	r := resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{})
	return r.Cpu().MilliValue(), r.Memory().Value()
}

// baseNode is a node as a view starts from: its GPU state and the CPU,
// memory and pod slots its pods leave. Views are rebuilt every few seconds
// and on every GPU event; at 5,000 nodes computing every state again is
// most of a rebuild, while between two rebuilds only some nodes' pods
// change, and GPU Feature Discovery's label rewrites change no state. So a
// base is kept while everything it was computed from is the same.
type baseNode struct {
	tr   *gpu.Tracker
	node *v1.Node
	// pods are the objects it was computed from, by address (weak
	// pointers, in address order): the informer replaces an object on
	// every change and never edits one, and the versions it replaced are
	// not kept alive for this comparison.
	pods                      []weak.Pointer[v1.Pod]
	st                        *gpu.NodeState
	cpuFree, memFree, podFree int64
}

func newBaseNode(t *gpu.Tracker, n *v1.Node, pods []*v1.Pod) *baseNode {
	sortByAddress(pods)
	b := &baseNode{tr: t, node: n, pods: make([]weak.Pointer[v1.Pod], len(pods)),
		cpuFree: n.Status.Allocatable.Cpu().MilliValue(),
		memFree: n.Status.Allocatable.Memory().Value(),
		podFree: n.Status.Allocatable.Pods().Value(),
	}
	for i, p := range pods {
		b.pods[i] = weak.Make(p)
		cpu, mem := podRequests(p)
		b.cpuFree -= cpu
		b.memFree -= mem
		b.podFree--
	}
	// The device choice (Evaluate) weighs the CPU and memory left, as
	// Score does (shared.memFree: MiB).
	b.st = t.Compute(n, pods, b.cpuFree, b.memFree>>20, "", false)
	return b
}

// reusable reports whether the base still is the node's: the same tracker
// and pods, the same node or one whose devices and allocatable are the
// same (the same node object, not one deleted and created again), and
// nothing else the tracker counts that changed (Tracker.Unchanged). It
// sorts pods.
func (b *baseNode) reusable(gs GPUState, n *v1.Node, pods []*v1.Pod, now time.Time) bool {
	if b == nil || len(b.pods) != len(pods) || b.tr != gs.Tracker() {
		return false
	}
	if b.node != n && (b.node.UID != n.UID || !gs.SameDevices(b.node, n) || !sameAllocatable(b.node, n)) {
		return false
	}
	sortByAddress(pods)
	for i := range pods {
		if b.pods[i].Value() != pods[i] {
			return false
		}
	}
	return gs.Tracker().Unchanged(n.Name, b.st, now)
}

// sameAllocatable compares what a base's CPU, memory and pod slots come from.
func sameAllocatable(a, b *v1.Node) bool {
	for _, r := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory, v1.ResourcePods} {
		qa, oka := a.Status.Allocatable[r]
		qb, okb := b.Status.Allocatable[r]
		if oka != okb || qa.Cmp(qb) != 0 {
			return false
		}
	}
	return true
}

func sortByAddress(pods []*v1.Pod) {
	slices.SortFunc(pods, func(a, b *v1.Pod) int {
		return cmp.Compare(uintptr(unsafe.Pointer(a)), uintptr(unsafe.Pointer(b)))
	})
}

// view starts a view's node from the base. Bookings change that copy: they
// replace its state with a clone (book), so the base's is never written.
func (b *baseNode) view(n *v1.Node) *nodeView {
	return &nodeView{node: n, gpu: b.st, cpuFree: b.cpuFree, memFree: b.memFree, podFree: b.podFree}
}

// reason categories, in the order a node is checked.
const (
	catCordoned = iota
	catTaint
	catAffinity
	catResources
	catGPU
	numCats
)

// verdict is the outcome of checking one pod against the view.
type verdict struct {
	fits    *nodeView
	choice  gpu.Choice
	message string
	// class is why it waits, for the pending-pods metric (Class*).
	class string
}

// Classes of pending GPU pods (the reason label of
// gpu_scheduler_pending_gpu_pods).
const (
	// ClassFragmented: the GPUs block it, and the nodes it could use (model,
	// taints, affinity, CPU and memory allow it) have as much idle GPU in
	// total as it asks for: no one node has it in the right shape.
	ClassFragmented = "fragmented"
	// ClassCapacity: the GPUs block it and there is not that much idle GPU.
	ClassCapacity = "gpu_capacity"
	// ClassUnsuitable: no node has GPUs it could ever use (model,
	// identity, memory, count, a device plugin that delivers shares).
	ClassUnsuitable = "gpu_unsuitable"
	// ClassOther: CPU, memory, taints, affinity or cordons block it.
	ClassOther = "other"
	// ClassInvalid: its GPU request is invalid.
	ClassInvalid = "invalid_request"
)

// needMilli is the GPU a request asks for in all, in milli-GPU (1 for a
// memory-sized share: any idle GPU could be it).
func needMilli(req *gpu.Request) int64 {
	if n := req.TotalMilli(); n > 0 {
		return n
	}
	return 1
}

// gpuClass tells fragmentation from a lack of GPU from the capacity groups
// alone (a pod no node of an allowed model could take): whether their idle
// GPU would cover the request, were it in one place.
func (v *view) gpuClass(req *gpu.Request) string {
	need := needMilli(req)
	var idle int64
	for _, g := range v.groups {
		if g.agent || req.Models.Empty() || req.Models.Matches(g.model, g.fold) {
			idle += g.idle
		}
	}
	if idle >= need {
		return ClassFragmented
	}
	return ClassCapacity
}

// checkShape is check, once per pod shape and view for pods that fit
// nowhere.
func (v *view) checkShape(logger klog.Logger, pod *v1.Pod, req *gpu.Request, sc gpu.Scoring, wl *gpu.Workload, book bool) verdict {
	if v.fitsNowhere(req) {
		return verdict{message: gpuShortMessage(req, len(v.nodes)), class: v.gpuClass(req)}
	}
	key, ok := shapeKey(pod)
	if ok {
		if vd, hit := v.shapes.Load(key); hit {
			return vd.(verdict)
		}
	}
	vd := v.check(logger, pod, req, sc, wl, book)
	if ok && vd.fits == nil {
		v.shapes.Store(key, vd)
	}
	return vd
}

// shape is everything check reads of a pod: its GPU request (annotations
// and resources), CPU and memory, tolerations, and node selection.
type shape struct {
	Annotations  map[string]string           `json:"a,omitempty"`
	Resources    []v1.ResourceRequirements   `json:"r"`
	Init         []v1.ContainerRestartPolicy `json:"i,omitempty"`
	PodLevel     *v1.ResourceRequirements    `json:"p,omitempty"`
	Overhead     v1.ResourceList             `json:"o,omitempty"`
	Tolerations  []v1.Toleration             `json:"t,omitempty"`
	NodeSelector map[string]string           `json:"s,omitempty"`
	NodeAffinity *v1.NodeAffinity            `json:"n,omitempty"`
}

func shapeKey(pod *v1.Pod) (string, bool) {
	sh := shape{Tolerations: pod.Spec.Tolerations, NodeSelector: pod.Spec.NodeSelector, Overhead: pod.Spec.Overhead, PodLevel: pod.Spec.Resources}
	if pod.Spec.Affinity != nil {
		sh.NodeAffinity = pod.Spec.Affinity.NodeAffinity
	}
	for _, k := range gpu.RequestAnnotations {
		if val, ok := pod.Annotations[k]; ok {
			if sh.Annotations == nil {
				sh.Annotations = map[string]string{}
			}
			sh.Annotations[k] = val
		}
	}
	for _, c := range pod.Spec.InitContainers {
		sh.Resources = append(sh.Resources, c.Resources)
		sh.Init = append(sh.Init, ptr.Deref(c.RestartPolicy, ""))
	}
	for _, c := range pod.Spec.Containers {
		sh.Resources = append(sh.Resources, c.Resources)
	}
	b, err := json.Marshal(sh)
	return string(b), err == nil
}

// check decides whether some node could take the pod now, and otherwise
// explains why none can: which resource is short, and on how many nodes
// each constraint failed. The message names no node and no free amount, so
// that it changes only when the cluster does, not on every pass. With book,
// the node found takes the pod's share in the view.
func (v *view) check(logger klog.Logger, pod *v1.Pod, req *gpu.Request, sc gpu.Scoring, wl *gpu.Workload, book bool) verdict {
	if v.fitsNowhere(req) {
		return verdict{message: gpuShortMessage(req, len(v.nodes)), class: v.gpuClass(req)}
	}
	cpu, mem := podRequests(pod)
	affinity := nodeaffinity.GetRequiredNodeAffinity(pod)
	var cats [numCats]int
	var outcomes [numOutcomes]int
	// The idle GPU of the nodes the pod could use but for its GPUs: what
	// tells fragmentation from a lack of GPU.
	var reachable int64
	for _, nv := range v.nodes {
		if nv.node.Spec.Unschedulable {
			cats[catCordoned]++
			continue
		}
		if _, untolerated := v1helper.FindMatchingUntoleratedTaint(logger, nv.node.Spec.Taints, pod.Spec.Tolerations, doNotSchedule, false); untolerated {
			cats[catTaint]++
			continue
		}
		if ok, err := affinity.Match(nv.node); err != nil || !ok {
			cats[catAffinity]++
			continue
		}
		nv.mu.Lock()
		if nv.cpuFree < cpu || nv.memFree < mem || nv.podFree < 1 {
			nv.mu.Unlock()
			cats[catResources]++
			continue
		}
		out, _, _ := nv.gpu.Fit(req)
		if out == gpu.Fits {
			if c, _, ok := sc.Evaluate(nv.gpu, req, wl); ok {
				if book {
					nv.book(cpu, mem, c)
				}
				nv.mu.Unlock()
				return verdict{fits: nv, choice: c}
			}
			out = gpu.TooFewFreeDevices
		}
		if out == gpu.NoDeviceWithShare || out == gpu.TooFewFreeDevices {
			reachable += nv.gpu.Idle()
		}
		nv.mu.Unlock()
		cats[catGPU]++
		if int(out) < numOutcomes {
			outcomes[out]++
		}
	}

	var parts []string
	if req.Shared() && outcomes[gpu.NoDeviceWithShare] > 0 {
		parts = append(parts, shareShortMessage(req))
	}
	if outcomes[gpu.TooFewFreeDevices] > 0 {
		devices, _, _ := req.PerDevice(0)
		parts = append(parts, fmt.Sprintf("needs %d free GPU%s on one node", devices, plural(int(devices))))
	}
	add := func(n int, format string) {
		if n > 0 {
			parts = append(parts, fmt.Sprintf(format, n, plural(n)))
		}
	}
	add(outcomes[gpu.Overcommitted], "GPUs overcommitted by the pods bound there on %d node%s")
	add(outcomes[gpu.TooManyDevices], "more than 64 GPUs (not tracked) on %d node%s")
	add(outcomes[gpu.ModelNotAllowed], "GPU model not allowed on %d node%s")
	add(outcomes[gpu.TooFewDevices], "fewer GPUs than requested on %d node%s")
	add(outcomes[gpu.ShareTooLarge], "GPUs with less memory than requested on %d node%s")
	add(outcomes[gpu.MemoryUnknown], "GPU memory not reported on %d node%s")
	add(outcomes[gpu.NoGPU], "no GPU on %d node%s")
	add(outcomes[gpu.NoShareDelivery], "no device plugin that delivers GPU shares (HAMi's) on %d node%s: a share needs nvidia.com/gpu: 1 and such a node")
	add(outcomes[gpu.DeviceNotAllowed], "none of the GPUs the pod allows (nvidia.com/use-gpuuuid, nouse-gpuuuid) on %d node%s")
	add(outcomes[gpu.AgentUnregistered], "a device plugin that has not registered its GPUs yet (HAMi's) on %d node%s")
	add(cats[catResources], "not enough CPU, memory or pod slots on %d node%s")
	add(cats[catAffinity], "node selector or affinity not matched on %d node%s")
	add(cats[catTaint], "untolerated taints on %d node%s")
	add(cats[catCordoned], "cordoned: %d node%s")
	if len(v.nodes) == 0 {
		parts = append(parts, "no nodes")
	}
	class := ClassUnsuitable
	switch {
	case outcomes[gpu.NoDeviceWithShare]+outcomes[gpu.TooFewFreeDevices]+outcomes[gpu.Overcommitted] > 0:
		class = ClassCapacity
		if reachable >= needMilli(req) {
			class = ClassFragmented
		}
	case cats[catResources]+cats[catAffinity]+cats[catTaint]+cats[catCordoned] > 0 || len(v.nodes) == 0:
		class = ClassOther
	}
	return verdict{message: strings.Join(parts, "; "), class: class}
}

// numOutcomes bounds gpu.Outcome values counted by check.
const numOutcomes = 32

// shareShortMessage says what share no device has free.
func shareShortMessage(req *gpu.Request) string {
	_, milli, _ := req.PerDevice(0)
	what := fmt.Sprintf("%d milli", milli)
	switch {
	case req.MemoryMiB > 0:
		what = fmt.Sprintf("%d MiB of memory", req.MemoryMiB)
	case req.ShareCount > 0 && req.Share.MemoryMiB > 0:
		what = fmt.Sprintf("%d MiB of memory and %d%% of the SMs", req.Share.MemoryMiB, req.Share.Cores)
	case req.ShareCount > 0:
		what = fmt.Sprintf("%d%% of the memory and %d%% of the SMs", req.Share.Permille/10, req.Share.Cores)
	}
	return fmt.Sprintf("no node has a GPU with %s free", what)
}

// gpuShortMessage explains a pod that the capacity groups rule out.
func gpuShortMessage(req *gpu.Request, nodes int) string {
	if nodes == 0 {
		return "no nodes"
	}
	if req.Count > 0 {
		return fmt.Sprintf("needs %d free GPU%s on one node; no node of an allowed model has that many free", req.Count, plural(int(req.Count)))
	}
	return shareShortMessage(req)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func doNotSchedule(t *v1.Taint) bool {
	return t.Effect == v1.TaintEffectNoSchedule || t.Effect == v1.TaintEffectNoExecute
}

// book takes the pod's share of the node in the view (nv.mu held).
func (nv *nodeView) book(cpu, mem int64, c gpu.Choice) {
	nv.cpuFree -= cpu
	nv.memFree -= mem
	nv.podFree--
	st := nv.gpu.Clone()
	st.TakeChoice(c)
	st.CPUFree, st.MemFree = nv.cpuFree, nv.memFree>>20
	nv.gpu = st
}

// rechecks reports whether every plugin that rejected the pod's nodes is one
// whose condition the view re-checks exactly: GPUFit, cordon, taints, node
// affinity, and NodeResourcesFit for a pod that asks only for CPU, memory
// and GPUs.
func rechecks(pod *v1.Pod, plugins []string, opts gpu.RequestOptions) bool {
	for _, p := range plugins {
		switch p {
		case GPUFitName, names.NodeUnschedulable, names.TaintToleration, names.NodeAffinity:
		case names.NodeResourcesFit, NodeResourcesFitFastName:
			if !onlyModelledResources(pod, opts) {
				return false
			}
		case names.DynamicResources, GPUDynamicResourcesName:
			// Without claims of its own, the pod asks DRA only for its
			// GPUs (an extended resource a DeviceClass maps): whether
			// they are free is what the view counts, claims included.
			if len(pod.Spec.ResourceClaims) > 0 || !onlyModelledResources(pod, opts) {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// GPUFitName is the plugin's name (the framework's status names it).
const GPUFitName = "GPUFit"

// NodeResourcesFitFastName is the in-tree NodeResourcesFit as the shipped
// profile runs it (pkg/plugins/fitfast: the same verdicts).
const NodeResourcesFitFastName = "NodeResourcesFitFast"

// GPUDynamicResourcesName is the in-tree DynamicResources plugin as the
// shipped profile runs it (pkg/plugins/gpudra).
const GPUDynamicResourcesName = "GPUDynamicResources"

func onlyModelledResources(pod *v1.Pod, opts gpu.RequestOptions) bool {
	reqs := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	for name := range reqs {
		switch {
		case name == v1.ResourceCPU || name == v1.ResourceMemory || name == v1.ResourcePods:
		case slices.Contains(opts.ResourceNames, name) || strings.HasPrefix(string(name), "nvidia.com/gpu"):
		default:
			return false
		}
	}
	return true
}

// sortedNames lists node names (stable messages and tests).
func (v *view) sortedNames() []string {
	var out []string
	for _, nv := range v.nodes {
		out = append(out, nv.node.Name)
	}
	sort.Strings(out)
	return out
}
