package simulator

import (
	"fmt"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// Namespace of the replayed pods, as in the published converter.
const Namespace = "paib-gpu"

// NodeObject is a trace node as our API reads it: CPU, memory, whole GPUs as
// nvidia.com/gpu, the model in the GFD product label, and room for 1001 pods.
func NodeObject(n NodeRow) *v1.Node {
	res := v1.ResourceList{
		v1.ResourceCPU:    *resource.NewMilliQuantity(n.CPUMilli, resource.DecimalSI),
		v1.ResourceMemory: *resource.NewQuantity(n.MemoryMiB<<20, resource.BinarySI),
		v1.ResourcePods:   *resource.NewQuantity(1001, resource.DecimalSI),
	}
	labels := map[string]string{v1.LabelHostname: n.Name}
	if n.GPUs > 0 {
		res[gpu.ResourceNvidiaGPU] = *resource.NewQuantity(int64(n.GPUs), resource.DecimalSI)
		if n.Model != "" {
			labels[gpu.LabelGPUProduct] = n.Model
		}
	}
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: types.UID("node-" + n.Name), Labels: labels},
		Status: v1.NodeStatus{
			Capacity: res, Allocatable: res.DeepCopy(),
			Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}},
		},
	}
}

// PodObject is a trace pod as a user of gpu-scheduler writes it: whole GPUs
// as nvidia.com/gpu, a share of one GPU in gpu-scheduler.io/gpu-milli, the
// model set in gpu-scheduler.io/gpu-model.
func PodObject(p PodRow, seq int, schedulerName string) *v1.Pod {
	pod := basePod(p, seq, schedulerName)
	c := &pod.Spec.Containers[0]
	switch {
	case p.NumGPU == 0:
	case p.GPUMilli >= gpu.MilliPerGPU || p.NumGPU > 1:
		q := *resource.NewQuantity(int64(p.NumGPU), resource.DecimalSI)
		c.Resources.Requests[gpu.ResourceNvidiaGPU] = q
		c.Resources.Limits[gpu.ResourceNvidiaGPU] = q
	default:
		pod.Annotations[gpu.AnnotationMilli] = strconv.Itoa(p.GPUMilli)
	}
	if p.NumGPU > 0 && len(p.Models) > 0 {
		pod.Annotations[gpu.AnnotationModel] = strings.Join(p.Models, "|")
	}
	return pod
}

// VanillaPodObject is the pod for the default scheduler, which only knows
// whole extended resources: a share of a GPU takes a whole one, and the
// model set becomes required node affinity on the product label.
func VanillaPodObject(p PodRow, seq int) *v1.Pod {
	pod := basePod(p, seq, v1.DefaultSchedulerName)
	c := &pod.Spec.Containers[0]
	if p.NumGPU > 0 {
		q := *resource.NewQuantity(int64(p.NumGPU), resource.DecimalSI)
		c.Resources.Requests[gpu.ResourceNvidiaGPU] = q
		c.Resources.Limits[gpu.ResourceNvidiaGPU] = q
		if len(p.Models) > 0 {
			pod.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
					MatchExpressions: []v1.NodeSelectorRequirement{{Key: gpu.LabelGPUProduct, Operator: v1.NodeSelectorOpIn, Values: p.Models}},
				}}},
			}}
		}
	}
	return pod
}

func basePod(p PodRow, seq int, schedulerName string) *v1.Pod {
	res := v1.ResourceList{
		v1.ResourceCPU:    *resource.NewMilliQuantity(p.CPUMilli, resource.DecimalSI),
		v1.ResourceMemory: *resource.NewQuantity(p.MemoryMiB<<20, resource.BinarySI),
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: Namespace, UID: types.UID(fmt.Sprintf("%s-%d", p.Name, seq)),
			Annotations: map[string]string{},
		},
		Spec: v1.PodSpec{
			SchedulerName: schedulerName,
			Containers: []v1.Container{{Name: "main", Image: "pause", Resources: v1.ResourceRequirements{
				Requests: res, Limits: res.DeepCopy(),
			}}},
		},
	}
}
