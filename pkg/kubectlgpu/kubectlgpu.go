// Package kubectlgpu is `kubectl gpu`: what the GPUs of a cluster hold, which
// GPU pods wait and why, and how fragmented the idle GPU is. It reads the
// cluster with the scheduler's own accounting (pkg/gpu), so what it shows is
// what the scheduler counts: every pod on a node, whoever placed it.
package kubectlgpu

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/printers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/pager"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// Options are what every command reads.
type Options struct {
	Client kubernetes.Interface
	Out    io.Writer
	// Output is "" (a table), wide, name, json or yaml (others through
	// Printer).
	Output string
	// SchedulerName is the profile whose accounting, target workload and
	// pods are shown; "" picks the configuration's only profile, else
	// gpu-scheduler.
	SchedulerName string
	// Config is a KubeSchedulerConfiguration; nil reads the deployed one
	// (the ConfigMap kube-system/gpu-scheduler-config), else the shipped
	// one. Its profile says how nodes and requests are read (resource
	// names, labels, node agent) and what the target workload is.
	Config []byte
	// ConfigMap is where the deployed configuration is read when Config is
	// nil: "namespace/name", "" for the chart's default release
	// (kube-system/gpu-scheduler-config), whose absence means the shipped
	// configuration. One given must exist.
	ConfigMap string
	// Selector (a label selector) limits the nodes; Namespace ("" for all)
	// the pending pods shown. A workload is learned from every pod of the
	// profile, as the scheduler's is.
	Selector, Namespace string
	// Printer prints what is not a table (json, yaml, jsonpath,
	// go-template: cli-runtime's PrintFlags); nil prints by Output: ""
	// and wide are tables, name the objects a report is about, json and
	// yaml as the printers above.
	Printer printers.ResourcePrinter
	// NoHeaders leaves out the tables' headers.
	NoHeaders bool
	// Workload is the target workload of `frag`; nil learns it from the
	// GPU pods in the cluster, as the scheduler learns it from the pods it
	// sees.
	Workload *gpu.Workload
}

// cluster is the nodes and the pods on each.
type cluster struct {
	nodes  []v1.Node
	onNode map[string][]*v1.Pod
	all    []v1.Pod
	// The GPUs DRA drivers publish and the claims on them (none where
	// the cluster does not serve them, or they may not be read).
	slices []*resourceapi.ResourceSlice
	claims []*resourceapi.ResourceClaim
}

// pageSize is how many objects one list call asks for: a large cluster's
// pods are read in pages, as kubectl get reads them.
const pageSize = 500

func (o *Options) read(ctx context.Context) (*cluster, error) {
	c := &cluster{onNode: map[string][]*v1.Pod{}}
	err := o.list(ctx, "nodes", metav1.ListOptions{LabelSelector: o.Selector}, func(opts metav1.ListOptions) (runtime.Object, error) {
		return o.Client.CoreV1().Nodes().List(ctx, opts)
	}, func(obj runtime.Object) {
		c.nodes = append(c.nodes, *obj.(*v1.Node))
	})
	if err != nil {
		return nil, err
	}
	// Every pod: a node's accounting counts them all, whoever placed them.
	err = o.list(ctx, "pods", metav1.ListOptions{}, func(opts metav1.ListOptions) (runtime.Object, error) {
		return o.Client.CoreV1().Pods("").List(ctx, opts)
	}, func(obj runtime.Object) {
		c.all = append(c.all, *obj.(*v1.Pod))
	})
	if err != nil {
		return nil, err
	}
	// DRA, where served and readable: without it, nodes whose GPUs only
	// DRA publishes show none.
	_ = o.list(ctx, "resourceslices", metav1.ListOptions{}, func(opts metav1.ListOptions) (runtime.Object, error) {
		return o.Client.ResourceV1().ResourceSlices().List(ctx, opts)
	}, func(obj runtime.Object) { c.slices = append(c.slices, obj.(*resourceapi.ResourceSlice)) })
	_ = o.list(ctx, "resourceclaims", metav1.ListOptions{}, func(opts metav1.ListOptions) (runtime.Object, error) {
		return o.Client.ResourceV1().ResourceClaims("").List(ctx, opts)
	}, func(obj runtime.Object) { c.claims = append(c.claims, obj.(*resourceapi.ResourceClaim)) })
	sort.Slice(c.nodes, func(i, j int) bool { return c.nodes[i].Name < c.nodes[j].Name })
	for i := range c.all {
		p := &c.all[i]
		if p.Spec.NodeName != "" && p.Status.Phase != v1.PodSucceeded && p.Status.Phase != v1.PodFailed {
			c.onNode[p.Spec.NodeName] = append(c.onNode[p.Spec.NodeName], p)
		}
	}
	return c, nil
}

// list reads every object of a resource cluster-wide, page by page. A
// refusal says what kubectl gpu needs.
func (o *Options) list(ctx context.Context, what string, opts metav1.ListOptions, fn func(metav1.ListOptions) (runtime.Object, error), each func(runtime.Object)) error {
	pg := pager.New(func(_ context.Context, opts metav1.ListOptions) (runtime.Object, error) { return fn(opts) })
	pg.PageSize = pageSize
	err := pg.EachListItem(ctx, opts, func(obj runtime.Object) error {
		each(obj)
		return nil
	})
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("listing %s in every namespace: %w; kubectl gpu counts every pod on a node, whoever placed it, "+
			"and needs list on nodes and pods cluster-wide", what, err)
	}
	if err != nil {
		return fmt.Errorf("listing %s: %w", what, err)
	}
	return nil
}

// Device is one GPU of a node.
type Device struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid,omitempty"`
	Model string `json:"model,omitempty"`
	// AllocatedMilli is what the pods on it hold, in milli-GPU.
	AllocatedMilli int32 `json:"allocatedMilli"`
	// MemoryMiB is the device's memory, where the agent reports it; the
	// agent's dimensions held (memory in MiB, cores out of 100, containers
	// sharing it out of Slots) follow.
	MemoryMiB     int64    `json:"memoryMiB,omitempty"`
	UsedMemoryMiB int64    `json:"usedMemoryMiB,omitempty"`
	UsedCores     int32    `json:"usedCores,omitempty"`
	UsedSlots     int32    `json:"usedSlots,omitempty"`
	Slots         int32    `json:"slots,omitempty"`
	Healthy       bool     `json:"healthy"`
	Pods          []string `json:"pods,omitempty"`
}

// Node is one GPU node.
type Node struct {
	Name  string `json:"name"`
	Model string `json:"model,omitempty"`
	// Agent names the node agent that delivers shares there ("" for none).
	Agent          string   `json:"agent,omitempty"`
	Unhealthy      int64    `json:"unhealthyGPUs,omitempty"`
	Overcommitted  bool     `json:"overcommitted,omitempty"`
	CapacityMilli  int64    `json:"capacityMilli"`
	AllocatedMilli int64    `json:"allocatedMilli"`
	Devices        []Device `json:"devices"`
}

// NodesReport is `kubectl gpu nodes`.
type NodesReport struct {
	Nodes          []Node `json:"nodes"`
	CapacityMilli  int64  `json:"capacityMilli"`
	AllocatedMilli int64  `json:"allocatedMilli"`
}

// Nodes reports every GPU node, device by device.
func (o *Options) Nodes(ctx context.Context) (*NodesReport, error) {
	c, err := o.view(ctx, "")
	if err != nil {
		return nil, err
	}
	defer c.Close()
	tr := c.Tracker()
	r := &NodesReport{Nodes: []Node{}}
	for i := range c.nodes {
		n := &c.nodes[i]
		hs, st := tr.Explain(n, c.onNode[n.Name])
		if st.Count == 0 {
			continue
		}
		nr := Node{Name: n.Name, Model: st.Model, Agent: st.Agent, Unhealthy: int64(st.Unhealthy), Overcommitted: st.Overcommitted}
		for d := 0; d < int(st.Count); d++ {
			dev := Device{Index: d, Model: st.Model, Healthy: true, AllocatedMilli: gpu.MilliPerGPU - st.Free[d]}
			if st.Devices != nil {
				inv := st.Devices[d]
				dev.UUID, dev.Model, dev.Healthy, dev.MemoryMiB = inv.UUID, inv.Model, inv.Healthy && !inv.Cordoned, inv.MemoryMiB
				dev.Slots = inv.Slots
			}
			if mem, cores, slots, ok := st.AgentUse(d); ok {
				dev.UsedMemoryMiB, dev.UsedCores, dev.UsedSlots = mem, cores, slots
			}
			for _, h := range hs {
				if h.Mask&(1<<uint(d)) != 0 {
					// A share on each of several devices is a share on
					// each; only whole GPUs take the device.
					per := h.Milli
					if per <= 0 || per > gpu.MilliPerGPU {
						per = gpu.MilliPerGPU
					}
					dev.Pods = append(dev.Pods, fmt.Sprintf("%s/%s:%dm", h.Namespace, h.Name, per))
				}
			}
			nr.Devices = append(nr.Devices, dev)
			if dev.Healthy {
				nr.CapacityMilli += gpu.MilliPerGPU
				nr.AllocatedMilli += int64(dev.AllocatedMilli)
			}
		}
		r.Nodes = append(r.Nodes, nr)
		r.CapacityMilli += nr.CapacityMilli
		r.AllocatedMilli += nr.AllocatedMilli
	}
	return r, nil
}

// bar draws milli-GPU out of 1000 in ten cells.
func bar(milli int32) string {
	n := int((milli + 50) / 100)
	n = min(max(n, 0), 10)
	if milli > 0 && n == 0 {
		n = 1
	}
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", 10-n) + "]"
}

// PrintNodes writes the report. Wide adds each device's memory and the
// node agent that delivers its shares.
func (o *Options) PrintNodes(r *NodesReport) error {
	if !o.table() {
		names := make([]string, len(r.Nodes))
		for i := range r.Nodes {
			names[i] = "node/" + r.Nodes[i].Name
		}
		return o.print("NodeReport", r, names)
	}
	wide := o.Output == "wide"
	w := tabwriter.NewWriter(o.Out, 0, 0, 2, ' ', 0)
	if wide {
		o.header(w, "NODE\tGPU\tMODEL\tUUID\tUSED\t\tPODS\tMEMORY\tAGENT")
	} else {
		o.header(w, "NODE\tGPU\tMODEL\tUUID\tUSED\t\tPODS")
	}
	for _, n := range r.Nodes {
		for _, d := range n.Devices {
			uuid := d.UUID
			if uuid == "" {
				uuid = "-"
			}
			state := fmt.Sprintf("%4dm", d.AllocatedMilli)
			if d.Slots > 0 {
				// What the agent enforces: memory, cores, containers.
				state += fmt.Sprintf(" (%d/%dMi, %d%% cores, %d/%d)", d.UsedMemoryMiB, d.MemoryMiB, d.UsedCores, d.UsedSlots, d.Slots)
			}
			if !d.Healthy {
				state += " unhealthy"
			}
			pods := strings.Join(d.Pods, ",")
			if pods == "" {
				pods = "-"
			}
			fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%s", n.Name, d.Index, d.Model, uuid, bar(d.AllocatedMilli), state, pods)
			if wide {
				mem, agent := "-", n.Agent
				if d.MemoryMiB > 0 {
					mem = fmt.Sprintf("%dMi", d.MemoryMiB)
				}
				if agent == "" {
					agent = "-"
				}
				fmt.Fprintf(w, "\t%s\t%s", mem, agent)
			}
			fmt.Fprintln(w)
		}
		note := ""
		if n.Unhealthy > 0 {
			note += fmt.Sprintf(", %d GPU(s) not allocatable", n.Unhealthy)
		}
		if n.Overcommitted {
			note += ", OVERCOMMITTED: the pods bound there hold more than its GPUs have"
		}
		if n.Agent != "" {
			note += ", shares delivered by " + n.Agent
		}
		fmt.Fprintf(w, "%s\ttotal\t\t\t\t%dm\t%d of %dm (%s)%s\n", n.Name, n.AllocatedMilli, n.AllocatedMilli, n.CapacityMilli,
			percent(n.AllocatedMilli, n.CapacityMilli), note)
	}
	fmt.Fprintf(w, "CLUSTER\t\t\t\t\t%dm\t%d of %dm (%s)\n", r.AllocatedMilli, r.AllocatedMilli, r.CapacityMilli, percent(r.AllocatedMilli, r.CapacityMilli))
	return w.Flush()
}

func percent(a, b int64) string {
	if b == 0 {
		return "0%"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(a)/float64(b))
}

// PendingPod is a GPU pod that waits.
type PendingPod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Request   string `json:"request"`
	// Reason is the scheduler's explanation: its pending-reason condition,
	// else the PodScheduled message.
	Reason string `json:"reason"`
	// NominatedNode is where a preemption made room for it.
	NominatedNode string      `json:"nominatedNode,omitempty"`
	Created       metav1.Time `json:"created"`
}

// Pending lists the scheduler's GPU pods that are not bound.
func (o *Options) Pending(ctx context.Context) ([]PendingPod, error) {
	c, err := o.view(ctx, "")
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ropts := c.ropts
	out := []PendingPod{}
	for i := range c.all {
		p := &c.all[i]
		if o.Namespace != "" && p.Namespace != o.Namespace {
			continue
		}
		if p.Spec.NodeName != "" || p.Spec.SchedulerName != o.SchedulerName || p.DeletionTimestamp != nil ||
			p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed || !gpu.UsesGPU(p, ropts) {
			continue
		}
		pp := PendingPod{Namespace: p.Namespace, Name: p.Name, Request: Describe(p, ropts),
			NominatedNode: p.Status.NominatedNodeName, Created: p.CreationTimestamp}
		for _, cond := range p.Status.Conditions {
			if cond.Type == gpu.ConditionPending && cond.Status == v1.ConditionTrue {
				pp.Reason = cond.Message
			}
		}
		if pp.Reason == "" {
			for _, cond := range p.Status.Conditions {
				if cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse {
					pp.Reason = cond.Message
				}
			}
		}
		if pp.Reason == "" {
			pp.Reason = "not tried yet"
		}
		out = append(out, pp)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// PrintPending writes the pending pods. Wide adds the node a preemption
// nominated and the pod's age.
func (o *Options) PrintPending(ps []PendingPod) error {
	if !o.table() {
		names := make([]string, len(ps))
		for i := range ps {
			names[i] = "pod/" + ps[i].Name
		}
		return o.print("PendingList", ps, names)
	}
	wide := o.Output == "wide"
	w := tabwriter.NewWriter(o.Out, 0, 0, 2, ' ', 0)
	if wide {
		o.header(w, "NAMESPACE\tPOD\tREQUEST\tWHY\tNOMINATED NODE\tAGE")
	} else {
		o.header(w, "NAMESPACE\tPOD\tREQUEST\tWHY")
	}
	for _, p := range ps {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s", p.Namespace, p.Name, p.Request, p.Reason)
		if wide {
			nominated := p.NominatedNode
			if nominated == "" {
				nominated = "<none>"
			}
			fmt.Fprintf(w, "\t%s\t%s", nominated, duration.HumanDuration(time.Since(p.Created.Time)))
		}
		fmt.Fprintln(w)
	}
	return w.Flush()
}

// Describe is a pod's GPU request in words.
func Describe(p *v1.Pod, opts gpu.RequestOptions) string {
	r, err := gpu.ParseRequest(p, opts)
	if err != nil {
		return "invalid"
	}
	var s string
	switch {
	case r.Count > 0:
		s = fmt.Sprintf("%d GPU", r.Count)
	case r.Milli > 0:
		s = fmt.Sprintf("%dm GPU", r.Milli)
	case r.MemoryMiB > 0:
		s = fmt.Sprintf("%dMiB GPU", r.MemoryMiB)
	case r.ShareCount > 0:
		s = fmt.Sprintf("%d x (%dMiB, %d%% SM) GPU", r.ShareCount, r.Share.MemoryMiB, r.Share.Cores)
		if r.Share.MemoryMiB == 0 {
			s = fmt.Sprintf("%d x (%d%%, %d%% SM) GPU", r.ShareCount, r.Share.Permille/10, r.Share.Cores)
		}
	default:
		s = "CPU only"
	}
	if r.Slot {
		s += " (1 slot)"
	}
	if !r.Models.Empty() {
		s += " " + r.Models.String()
	}
	if g := p.Spec.SchedulingGroup; g != nil && g.PodGroupName != nil {
		s += " [gang " + *g.PodGroupName + "]"
	}
	return s
}
