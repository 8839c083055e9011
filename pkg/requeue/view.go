package requeue

import (
	"fmt"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"
	v1helper "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// nodeView is what the reconciler knows of a node: its GPU state (pods and
// reservations, from the informers) and the CPU, memory and pod slots left.
type nodeView struct {
	node    *v1.Node
	gpu     *gpu.NodeState
	cpuFree int64
	memFree int64
	podFree int64
}

// view is the cluster, as of one moment. Activations book into it, so that
// one freed device wakes one pod, not every pod waiting for it.
type view struct {
	nodes []*nodeView
}

// podRequests is the pod's effective CPU (milli) and memory (bytes).
func podRequests(p *v1.Pod) (int64, int64) {
	r := resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{})
	return r.Cpu().MilliValue(), r.Memory().Value()
}

func newNodeView(n *v1.Node, st *gpu.NodeState, pods []*v1.Pod) *nodeView {
	nv := &nodeView{node: n, gpu: st,
		cpuFree: n.Status.Allocatable.Cpu().MilliValue(),
		memFree: n.Status.Allocatable.Memory().Value(),
		podFree: n.Status.Allocatable.Pods().Value(),
	}
	for _, p := range pods {
		cpu, mem := podRequests(p)
		nv.cpuFree -= cpu
		nv.memFree -= mem
		nv.podFree--
	}
	return nv
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
}

// check decides whether some node could take the pod now, and otherwise
// explains why none can, specifically: which resource is short, by how much,
// and the closest node.
func (v *view) check(logger klog.Logger, pod *v1.Pod, req *gpu.Request, sc gpu.Scoring, wl *gpu.Workload) verdict {
	cpu, mem := podRequests(pod)
	affinity := nodeaffinity.GetRequiredNodeAffinity(pod)
	var cats [numCats]int
	outcomes := map[gpu.Outcome]int{}
	// Closest candidates among the nodes that pass everything but the GPUs.
	var bestShare *nodeView
	bestShareFree, bestShareDev := int32(-1), -1
	var bestWhole *nodeView
	bestWholeFree := int32(-1)
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
		if nv.cpuFree < cpu || nv.memFree < mem || nv.podFree < 1 {
			cats[catResources]++
			continue
		}
		out, devices, milli := nv.gpu.Fit(req)
		if out == gpu.Fits {
			if c, _, ok := sc.Evaluate(nv.gpu, req, wl); ok {
				return verdict{fits: nv, choice: c}
			}
			out = gpu.TooFewFreeDevices
		}
		cats[catGPU]++
		outcomes[out]++
		switch out {
		case gpu.NoDeviceWithShare:
			for i := 0; i < int(nv.gpu.Count); i++ {
				if f := nv.gpu.Free[i]; f > bestShareFree && f < milli {
					bestShare, bestShareFree, bestShareDev = nv, f, i
				}
			}
		case gpu.TooFewFreeDevices:
			if f := nv.gpu.FullyFree(); f > bestWholeFree && devices > 0 {
				bestWhole, bestWholeFree = nv, f
			}
		}
	}

	var parts []string
	devices, milli, _ := req.PerDevice(0)
	if req.Shared() && outcomes[gpu.NoDeviceWithShare] > 0 {
		what := fmt.Sprintf("%d milli", milli)
		switch {
		case req.MemoryMiB > 0:
			what = fmt.Sprintf("%d MiB of memory", req.MemoryMiB)
		case req.ShareCount > 0 && req.Share.MemoryMiB > 0:
			what = fmt.Sprintf("%d MiB of memory and %d%% of the SMs", req.Share.MemoryMiB, req.Share.Cores)
		case req.ShareCount > 0:
			what = fmt.Sprintf("%d%% of the memory and %d%% of the SMs", req.Share.Permille/10, req.Share.Cores)
		}
		s := fmt.Sprintf("no node has a GPU with %s free", what)
		if bestShare != nil {
			s += fmt.Sprintf(" (closest: %s gpu%d, %d free)", bestShare.node.Name, bestShareDev, bestShareFree)
		}
		parts = append(parts, s)
	}
	if outcomes[gpu.TooFewFreeDevices] > 0 {
		s := fmt.Sprintf("needs %d free GPU%s on one node", devices, plural(int(devices)))
		if bestWhole != nil {
			s += fmt.Sprintf("; most free on any node: %d (%s)", bestWholeFree, bestWhole.node.Name)
		}
		parts = append(parts, s)
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
	add(cats[catResources], "not enough CPU, memory or pod slots on %d node%s")
	add(cats[catAffinity], "node selector or affinity not matched on %d node%s")
	add(cats[catTaint], "untolerated taints on %d node%s")
	add(cats[catCordoned], "cordoned: %d node%s")
	if len(v.nodes) == 0 {
		parts = append(parts, "no nodes")
	}
	return verdict{message: strings.Join(parts, "; ")}
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

// book takes the pod's share of the node in the view.
func (nv *nodeView) book(pod *v1.Pod, c gpu.Choice) {
	cpu, mem := podRequests(pod)
	nv.cpuFree -= cpu
	nv.memFree -= mem
	nv.podFree--
	st := nv.gpu.Clone()
	st.TakeChoice(c)
	nv.gpu = st
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
