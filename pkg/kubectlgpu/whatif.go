package kubectlgpu

import (
	"context"
	"fmt"
	"text/tabwriter"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpu-scheduler/gpu-scheduler/manifests"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/kubeapply"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/simulator"
)

// WhatIfOptions are whatif's own.
type WhatIfOptions struct {
	// Pods is the YAML of the pods to place, in order.
	Pods []byte
	// Config is a KubeSchedulerConfiguration; nil reads the deployed one
	// (the ConfigMap kube-system/gpu-scheduler-config), else the shipped one.
	Config []byte
	// Policy, if set, replaces GPUScore's policy.
	Policy string
}

// WhatIf takes the cluster as it is and places the given pods, one after the
// other, through the scheduler's framework profile (the simulator's engine),
// without writing anything to the cluster.
func (o *Options) WhatIf(ctx context.Context, w WhatIfOptions) ([]simulator.WhatIfPlacement, string, error) {
	pods, err := decodePods(w.Pods)
	if err != nil {
		return nil, "", err
	}
	data, from := w.Config, "the given configuration"
	if data == nil {
		data, from = manifests.SchedulerConfig, "the shipped configuration"
		cm, err := o.Client.CoreV1().ConfigMaps("kube-system").Get(ctx, manifests.ConfigMapName, metav1.GetOptions{})
		switch {
		case err == nil && cm.Data["scheduler-config.yaml"] != "":
			data, from = []byte(cm.Data["scheduler-config.yaml"]), "the deployed configuration (kube-system/"+manifests.ConfigMapName+")"
		case err != nil && !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err):
			return nil, "", err
		}
	}
	prof, err := simulator.WhatIfProfile(data, o.SchedulerName, w.Policy)
	if err != nil {
		return nil, "", err
	}
	c, err := o.read(ctx)
	if err != nil {
		return nil, "", err
	}
	nodes := make([]*v1.Node, len(c.nodes))
	for i := range c.nodes {
		nodes[i] = &c.nodes[i]
	}
	var bound, seen []*v1.Pod
	for _, n := range nodes {
		bound = append(bound, c.onNode[n.Name]...)
	}
	ropts := gpu.RequestOptions{ResourceNames: o.nodeOptions().ResourceNames, Agent: o.nodeOptions().Agent}
	for i := range c.all {
		if p := &c.all[i]; p.Spec.SchedulerName == o.SchedulerName && gpu.UsesGPU(p, ropts) {
			seen = append(seen, p)
		}
	}
	out, err := simulator.WhatIf(ctx, prof, nodes, bound, seen, pods)
	return out, from, err
}

func decodePods(data []byte) ([]*v1.Pod, error) {
	objs, err := kubeapply.Decode(data)
	if err != nil {
		return nil, err
	}
	var pods []*v1.Pod
	for _, o := range objs {
		if o.GetKind() != "Pod" {
			return nil, fmt.Errorf("%q (kind %q): only objects of kind Pod can be placed", o.GetName(), o.GetKind())
		}
		p := &v1.Pod{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, p); err != nil {
			return nil, fmt.Errorf("pod %s: %w", o.GetName(), err)
		}
		pods = append(pods, p)
	}
	if len(pods) == 0 {
		return nil, fmt.Errorf("no pods given")
	}
	return pods, nil
}

// PrintWhatIf writes the placements.
func (o *Options) PrintWhatIf(ps []simulator.WhatIfPlacement, from string) error {
	if o.Output != "" {
		return o.encode(ps)
	}
	fmt.Fprintf(o.Out, "Placed with %s, on the cluster as it is now; nothing was written.\n", from)
	w := tabwriter.NewWriter(o.Out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "NAMESPACE\tPOD\tNODE\tDEVICES\tPENDING")
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
