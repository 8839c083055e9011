package kubectlgpu

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/resource"
	corev1defaults "k8s.io/kubernetes/pkg/apis/core/v1"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/manifests"
	ourconfig "github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/kubeapply"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/offline"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/simulator"
)

// WhatIfOptions are whatif's own.
type WhatIfOptions struct {
	// Pods are the pods to place, in order (DecodePods, PodsOf).
	Pods []*v1.Pod
	// Policy, if set, replaces GPUScore's policy.
	Policy string
}

// WhatIfReport is `kubectl gpu whatif`.
type WhatIfReport struct {
	// Configuration says which configuration the profile came from.
	Configuration string `json:"configuration"`
	// Notes say where the prediction may differ from what the scheduler
	// will do.
	Notes []string                    `json:"notes,omitempty"`
	Items []simulator.WhatIfPlacement `json:"items"`
}

// WhatIf takes the cluster as it is and places the given pods, one after the
// other (a gang's members together, all or nothing), through the scheduler's
// framework profile (the simulator's engine), without writing anything to
// the cluster.
func (o *Options) WhatIf(ctx context.Context, w WhatIfOptions) (*WhatIfReport, error) {
	pods := w.Pods
	if len(pods) == 0 {
		return nil, fmt.Errorf("no pods given")
	}
	v, err := o.view(ctx, w.Policy)
	if err != nil {
		return nil, err
	}
	defer v.Close()
	out, err := v.Place(ctx, pods, func(ns, group string) (int, bool) { return o.gangNeeds(ctx, v.cluster, ns, group) })
	if err != nil {
		return nil, err
	}
	r := &WhatIfReport{Configuration: v.from, Items: out}
	// Above 100 nodes the scheduler scores only the first feasible nodes
	// it finds, from a start that rotates with every pod it schedules:
	// what it rotated through is not known here.
	if n := v.total; v.scored < n {
		r.Notes = append(r.Notes, fmt.Sprintf("the scheduler scores only the first %d feasible nodes of %d it finds (percentageOfNodesToScore), "+
			"searching from a start that rotates with every pod it schedules; whatif scores every node, so where nodes score alike "+
			"it may name another than the scheduler will", v.scored, n))
	}
	if o.Selector != "" {
		r.Notes = append(r.Notes, "only the nodes that match -l "+o.Selector+" are considered; the scheduler considers every node")
	}
	if v.targetNote != "" {
		r.Notes = append(r.Notes, v.targetNote)
	}
	return r, nil
}

// gangNeeds is how many more members of a pod group must fit for it to
// bind: its gang policy's minCount, less the members already bound; -1
// (all those given) where the PodGroup cannot be read (the API is served
// from Kubernetes 1.37, with GenericWorkload); not a gang under the Basic
// policy.
func (o *Options) gangNeeds(ctx context.Context, c *cluster, ns, group string) (int, bool) {
	pg, err := o.Client.SchedulingV1beta1().PodGroups(ns).Get(ctx, group, metav1.GetOptions{})
	if err != nil {
		return -1, true
	}
	g := pg.Spec.SchedulingPolicy.Gang
	if g == nil {
		return 0, false
	}
	n := int(g.MinCount)
	for i := range c.all {
		p := &c.all[i]
		if p.Namespace == ns && p.Spec.NodeName != "" && p.Status.Phase != v1.PodSucceeded && p.Status.Phase != v1.PodFailed &&
			p.Spec.SchedulingGroup != nil && p.Spec.SchedulingGroup.PodGroupName != nil && *p.Spec.SchedulingGroup.PodGroupName == group {
			n--
		}
	}
	return max(n, 0), true
}

// view is the cluster as the deployed scheduler's profile counts it: its
// nodes and pods, read once, and the profile's plugins over them.
type view struct {
	*cluster
	*simulator.Deployed
	// from says which configuration the profile came from.
	from string
	// total is how many nodes the cluster has (-l aside), scored how many
	// feasible ones the deployed profile scores of them.
	total, scored int
	// published says where the learned target pinned came from ("" when
	// it is learned here); targetNote why it is not the scheduler's.
	published, targetNote string
	prof                  *config.KubeSchedulerProfile
	ropts                 gpu.RequestOptions
	// seen counts the pods of the profile that a learned workload learned.
	seen int
}

// config is the scheduler configuration to read: the given one, else the
// deployed one (the ConfigMap o.ConfigMap, by default
// kube-system/gpu-scheduler-config), else, where the default is absent, the
// shipped one. A ConfigMap that cannot be read (Forbidden, say) is an
// error: a silent fallback would show another profile than the deployed.
func (o *Options) config(ctx context.Context) ([]byte, string, error) {
	if o.Config != nil {
		return o.Config, "the given configuration", nil
	}
	ns, name := "kube-system", manifests.ConfigMapName
	if o.ConfigMap != "" {
		var ok bool
		if ns, name, ok = strings.Cut(o.ConfigMap, "/"); !ok || ns == "" || name == "" {
			return nil, "", fmt.Errorf("--config-map %q: want namespace/name", o.ConfigMap)
		}
	}
	key := ns + "/" + name
	cm, err := o.Client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil && cm.Data["scheduler-config.yaml"] != "":
		return []byte(cm.Data["scheduler-config.yaml"]), "the deployed configuration (" + key + ")", nil
	case err == nil:
		return nil, "", fmt.Errorf("ConfigMap %s has no scheduler-config.yaml", key)
	case apierrors.IsNotFound(err) && o.ConfigMap == "":
		return manifests.SchedulerConfig, "the shipped configuration", nil
	case apierrors.IsForbidden(err):
		return nil, "", fmt.Errorf("reading the deployed configuration (ConfigMap %s): %w; "+
			"ask for get on it, or give the configuration with --config", key, err)
	default:
		return nil, "", fmt.Errorf("reading the deployed configuration (ConfigMap %s): %w", key, err)
	}
}

func (o *Options) view(ctx context.Context, policy string) (*view, error) {
	data, from, err := o.config(ctx)
	if err != nil {
		return nil, err
	}
	if o.SchedulerName == "" {
		// The configuration's profile when it has one, else ours.
		o.SchedulerName = gpu.SchedulerName
		if cfg, err := offline.LoadConfig(data); err == nil && len(cfg.Profiles) == 1 {
			o.SchedulerName = cfg.Profiles[0].SchedulerName
		}
	}
	// What the deployed profile scores (WhatIfProfile scores every node).
	// And where it publishes its learned target (WhatIfProfile clears it).
	var deployedPct *int32
	var globalPct int32
	var publishTo string
	if cfg, err := offline.LoadConfig(data); err == nil {
		globalPct = ptr.Deref(cfg.PercentageOfNodesToScore, 0)
		if p, err := offline.Profile(cfg, o.SchedulerName); err == nil {
			deployedPct = p.PercentageOfNodesToScore
			for _, pc := range p.PluginConfig {
				if a, ok := pc.Args.(*ourconfig.GPUScoreArgs); ok && a.TargetWorkload.Mode == ourconfig.WorkloadLearned {
					publishTo = a.TargetWorkload.PublishTo
				}
			}
		}
	}
	prof, err := simulator.WhatIfProfile(data, o.SchedulerName, policy)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", from, err)
	}
	c, err := o.read(ctx)
	if err != nil {
		return nil, err
	}
	nodes := make([]*v1.Node, len(c.nodes))
	for i := range c.nodes {
		nodes[i] = &c.nodes[i]
	}
	var bound, seen []*v1.Pod
	for _, n := range nodes {
		bound = append(bound, c.onNode[n.Name]...)
	}
	// The scheduler sees its own pods, in the order they came.
	for i := range c.all {
		if p := &c.all[i]; p.Spec.SchedulerName == o.SchedulerName {
			seen = append(seen, p)
		}
	}
	sort.SliceStable(seen, func(i, j int) bool {
		return seen[i].CreationTimestamp.Before(&seen[j].CreationTimestamp)
	})
	d, err := simulator.NewDeployed(ctx, prof, nodes, bound, seen)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", from, err)
	}
	d.AddDRA(c.slices, c.claims)
	// The scheduler counts every node, not only those -l selects: how
	// many there are (the share it scores), and their GPUs per model
	// (what GPUScore's model-scarcity term weighs).
	total := len(nodes)
	if o.Selector != "" {
		var fb gpu.FleetBuilder
		all := 0
		t := d.Tracker()
		err := o.list(ctx, "nodes", metav1.ListOptions{}, func(opts metav1.ListOptions) (runtime.Object, error) {
			return o.Client.CoreV1().Nodes().List(ctx, opts)
		}, func(obj runtime.Object) {
			all++
			fb.Add(t.Compute(obj.(*v1.Node), nil, 0, 0, "", false))
		})
		if err != nil {
			d.Close()
			return nil, err
		}
		total = all
		d.PinFleet(fb.Fleet(nil))
	}
	v := &view{cluster: c, Deployed: d, from: from, prof: prof, ropts: d.Tracker().RequestOptions(),
		total: total, scored: simulator.NodesScored(deployedPct, globalPct, total)}
	if publishTo != "" {
		// The target as the scheduler holds it, which remembers deleted
		// pods; without it, what its profile learns from the pods here.
		e, by, err := o.published(ctx, publishTo)
		var resumed bool
		var why string
		if err == nil && e != nil {
			// The scheduler's pods after the export are learned again.
			if resumed, why, err = d.ResumeWorkload(ctx, *e, seen); err != nil {
				err = fmt.Errorf("lease %s, profile %s: %w", publishTo, o.SchedulerName, err)
			}
		}
		switch {
		case err != nil:
			v.targetNote = fmt.Sprintf("the scheduler's learned target could not be read (%v): approximated from the pods that exist now", err)
		case e == nil:
			v.targetNote = "the scheduler has not published its learned target on lease " + publishTo + " yet: approximated from the pods that exist now"
		default:
			v.published = "the scheduler's own, published on lease " + publishTo + " " + by
			switch {
			case !resumed:
				v.targetNote = "the scheduler's published target: " + why + ": whatif keeps it as published, " +
					"where the scheduler goes on learning from each pod"
			case e.Trimmed:
				v.targetNote = "the scheduler's published target was trimmed to fit its lease (the lightest kinds of pod it learned, " +
					"or the pods it observed last): whatif learns on from it, and may differ from the scheduler"
			}
		}
	}
	for _, pc := range prof.PluginConfig {
		if a, ok := pc.Args.(*ourconfig.GPUFitArgs); ok {
			// As GPUFit reads requests: shares only where delivered.
			v.ropts.NeedsDelivery = !a.AccountingOnlySharing
		}
	}
	for _, p := range seen {
		if gpu.UsesGPU(p, v.ropts) {
			v.seen++
		}
	}
	return v, nil
}

// scoreArgs are the profile's GPUScore args, nil without GPUScore.
func (v *view) scoreArgs() *ourconfig.GPUScoreArgs {
	for _, pc := range v.prof.PluginConfig {
		if a, ok := pc.Args.(*ourconfig.GPUScoreArgs); ok {
			return a
		}
	}
	return nil
}

// DecodePods reads pods from YAML or JSON (several documents).
func DecodePods(data []byte) ([]*v1.Pod, error) {
	objs, err := kubeapply.Decode(data)
	if err != nil {
		return nil, err
	}
	return podsOf(objs)
}

// PodsOf are the pods cli-runtime's resource builder read (-f: files,
// directories, stdin), with the namespaces it gave them.
func PodsOf(infos []*resource.Info) ([]*v1.Pod, error) {
	objs := make([]*unstructured.Unstructured, 0, len(infos))
	for _, info := range infos {
		u, ok := info.Object.(*unstructured.Unstructured)
		if !ok {
			return nil, fmt.Errorf("%s: not read as an unstructured object (%T)", info.Source, info.Object)
		}
		objs = append(objs, u)
	}
	return podsOf(objs)
}

func podsOf(objs []*unstructured.Unstructured) ([]*v1.Pod, error) {
	var pods []*v1.Pod
	for _, o := range objs {
		if o.GetKind() != "Pod" {
			return nil, fmt.Errorf("%q (kind %q): only objects of kind Pod can be placed", o.GetName(), o.GetKind())
		}
		p := &v1.Pod{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, p); err != nil {
			return nil, fmt.Errorf("pod %s: %w", o.GetName(), err)
		}
		// What the API server's defaulting would make of it: above all,
		// requests from limits (GPUs are usually written as limits only).
		corev1defaults.SetObjectDefaults_Pod(p)
		pods = append(pods, p)
	}
	if len(pods) == 0 {
		return nil, fmt.Errorf("no pods given")
	}
	return pods, nil
}

// PrintWhatIf writes the placements.
func (o *Options) PrintWhatIf(r *WhatIfReport) error {
	ps := r.Items
	if !o.table() {
		names := make([]string, len(ps))
		for i := range ps {
			names[i] = "pod/" + ps[i].Name
		}
		return o.print("WhatIfList", r, names)
	}
	if !o.NoHeaders {
		fmt.Fprintf(o.Out, "Placed with %s, on the cluster as it is now; nothing was written.\n", r.Configuration)
		for _, n := range r.Notes {
			fmt.Fprintf(o.Out, "Note: %s.\n", n)
		}
	}
	w := tabwriter.NewWriter(o.Out, 0, 0, 2, ' ', 0)
	o.header(w, "NAMESPACE\tPOD\tNODE\tDEVICES\tPENDING")
	for _, p := range ps {
		node, devices, why := p.Node, p.Devices, p.Reason
		if node == "" {
			node = "-"
		}
		if devices == "" {
			devices = "-"
		}
		if why == "" {
			why = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", p.Namespace, p.Name, node, devices, why)
	}
	return w.Flush()
}

// published reads the learned target the scheduler's leader publishes on
// its lease (GPUScore's targetWorkload.publishTo) for this profile: nil if
// it has not yet. by says when, and by whom: a former leader's (its
// successor has not learned a pod since it took over) is still the best
// guess, and said to be one.
func (o *Options) published(ctx context.Context, lease string) (*gpu.ExportedWorkload, string, error) {
	ns, name, _ := strings.Cut(lease, "/")
	l, err := o.Client.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("lease %s: %w", lease, err)
	}
	all, err := gpu.ExportedWorkloads(l.Annotations[gpu.AnnotationTargetWorkload])
	if err != nil {
		return nil, "", fmt.Errorf("lease %s: %w", lease, err)
	}
	e, ok := all[o.SchedulerName]
	if !ok {
		return nil, "", nil
	}
	by := "at " + e.At.Format(time.RFC3339)
	if holder := ptr.Deref(l.Spec.HolderIdentity, ""); e.Holder != "" && e.Holder != holder {
		by += " by a former leader (" + e.Holder + "; the current one has not published yet)"
	}
	return &e, by, nil
}
