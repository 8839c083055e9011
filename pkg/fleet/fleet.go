// Package fleet registers fake GPU nodes through the API: capacity and
// allocatable with GPUs, the GFD labels, and a Ready condition. Nothing runs
// on them; the fake kubelet keeps them Ready and moves their pods along.
package fleet

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/fakedra"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fakehami"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// LabelFake marks nodes the fake kubelet manages.
const LabelFake = "gpu-scheduler.io/fake-node"

// Node describes a fake node.
type Node struct {
	Name      string
	CPU       string // cores, e.g. "96"
	Memory    string // e.g. "1Ti"
	GPUs      int    // installed devices
	Unhealthy int    // of which not allocatable
	Model     string // GFD product
	MemoryMiB int    // per device
	Labels    map[string]string
	Taints    []v1.Taint
	// NotReady posts Ready=False with the not-ready taint, as a node whose
	// kubelet stopped; the fake kubelet leaves it alone.
	NotReady bool
	// HAMiSplit > 0 runs HAMi's device plugin (fakehami) on the node with
	// this split count: it registers the devices by UUID, and allocatable
	// nvidia.com/gpu counts its slots (healthy GPUs x split).
	HAMiSplit int
	// DRA, if set (fakedra.NVIDIA or fakedra.HAMi), publishes the GPUs
	// through a fake DRA driver of that style instead of a device plugin:
	// the node's allocatable has no nvidia.com/gpu. With DevicePluginToo,
	// a device plugin advertises the same GPUs as well (a misconfigured
	// node: both views of one GPU).
	DRA             string
	DevicePluginToo bool
}

// HAMiDevices are the devices the node's HAMi plugin registers (the last
// Unhealthy ones unhealthy).
func (n Node) HAMiDevices() []fakehami.Device {
	devs := fakehami.Devices(n.Name, n.GPUs, n.MemoryMiB, n.HAMiSplit, n.Model)
	for i := n.GPUs - n.Unhealthy; i < n.GPUs && i >= 0; i++ {
		devs[i].Healthy = false
	}
	return devs
}

// Object is the node as the API sees it.
func (n Node) Object() *v1.Node {
	capacity := v1.ResourceList{
		v1.ResourceCPU:    resource.MustParse(n.CPU),
		v1.ResourceMemory: resource.MustParse(n.Memory),
		v1.ResourcePods:   resource.MustParse("250"),
	}
	labels := map[string]string{LabelFake: "true"}
	// A node name may be a longer DNS name than a label value can hold;
	// kubelets then label the short host name.
	if len(validation.IsValidLabelValue(n.Name)) == 0 {
		labels[v1.LabelHostname] = n.Name
	}
	plugin := n.GPUs > 0 && (n.DRA == "" || n.DevicePluginToo)
	if plugin {
		capacity[gpu.ResourceNvidiaGPU] = *resource.NewQuantity(int64(n.GPUs), resource.DecimalSI)
		labels["nvidia.com/gpu.present"] = "true"
		labels["nvidia.com/gpu.count"] = strconv.Itoa(n.GPUs)
		if n.Model != "" {
			labels[gpu.LabelGPUProduct] = n.Model
		}
		if n.MemoryMiB > 0 {
			labels[gpu.LabelGPUMemory] = strconv.Itoa(n.MemoryMiB)
		}
	}
	for k, v := range n.Labels {
		labels[k] = v
	}
	ready := ReadyCondition()
	taints := n.Taints
	if n.NotReady {
		labels[LabelFake] = "notready"
		ready.Status, ready.Reason, ready.Message = v1.ConditionFalse, "KubeletNotReady", "container runtime is down"
		taints = append(append([]v1.Taint(nil), taints...), v1.Taint{Key: v1.TaintNodeNotReady, Effect: v1.TaintEffectNoSchedule})
	}
	allocatable := capacity.DeepCopy()
	var annotations map[string]string
	if plugin {
		allocatable[gpu.ResourceNvidiaGPU] = *resource.NewQuantity(int64(n.GPUs-n.Unhealthy), resource.DecimalSI)
		if n.HAMiSplit > 0 {
			annotations = map[string]string{"hami.io/node-nvidia-register": fakehami.Register(n.HAMiDevices())}
			capacity[gpu.ResourceNvidiaGPU] = *resource.NewQuantity(int64(n.GPUs*n.HAMiSplit), resource.DecimalSI)
			allocatable[gpu.ResourceNvidiaGPU] = *resource.NewQuantity(int64((n.GPUs-n.Unhealthy)*n.HAMiSplit), resource.DecimalSI)
		}
	}
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: labels, Annotations: annotations},
		Spec:       v1.NodeSpec{Taints: taints},
		Status: v1.NodeStatus{
			Capacity:    capacity,
			Allocatable: allocatable,
			Conditions:  []v1.NodeCondition{ready},
			Phase:       v1.NodeRunning,
		},
	}
}

// ReadyCondition is a fresh Ready=True condition.
func ReadyCondition() v1.NodeCondition {
	now := metav1.Now()
	return v1.NodeCondition{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady",
		Message: "fake kubelet is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now}
}

// Create registers nodes and posts their status (create alone may not keep
// it), replacing nodes of the same name.
func Create(ctx context.Context, client kubernetes.Interface, nodes ...Node) error {
	for _, n := range nodes {
		obj := n.Object()
		created, err := client.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			if err := client.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{}); err != nil {
				return err
			}
			created, err = client.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
		}
		if err != nil {
			return fmt.Errorf("creating node %s: %w", n.Name, err)
		}
		// On a real cluster, controllers write a new node at once (its
		// pod CIDR, the not-ready taint): post on their latest version.
		var posted *v1.Node
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			created.Status = obj.Status
			var err error
			posted, err = client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
			if apierrors.IsConflict(err) {
				if cur, gerr := client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{}); gerr == nil {
					created = cur
				}
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("posting status of node %s: %w", n.Name, err)
		}
		if !n.NotReady {
			if err := untaintReady(ctx, client, posted); err != nil {
				return fmt.Errorf("lifting the not-ready taint of node %s: %w", n.Name, err)
			}
		}
		if n.DRA != "" && n.GPUs > 0 {
			if err := fakedra.Publish(ctx, client, posted, fakedra.Slice(n.Name, n.DRA, n.GPUs, n.Unhealthy, n.Model, n.MemoryMiB)); err != nil {
				return err
			}
		}
	}
	return nil
}

// untaintReady drops the not-ready taint that a real API server's
// TaintNodesByCondition admission adds to every new node. The node
// lifecycle controller would drop it once it saw the node Ready, a moment
// later: until then the scheduler sees some nodes tainted and others not,
// and a pod placed in that moment goes to whichever lost it first.
func untaintReady(ctx context.Context, client kubernetes.Interface, cur *v1.Node) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		taints := slices.DeleteFunc(slices.Clone(cur.Spec.Taints), func(t v1.Taint) bool {
			return t.Key == v1.TaintNodeNotReady && t.Effect == v1.TaintEffectNoSchedule
		})
		if len(taints) == len(cur.Spec.Taints) {
			return nil
		}
		cur.Spec.Taints = taints
		_, err := client.CoreV1().Nodes().Update(ctx, cur, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			if latest, gerr := client.CoreV1().Nodes().Get(ctx, cur.Name, metav1.GetOptions{}); gerr == nil {
				cur = latest
			}
		}
		return err
	})
}

// Demo is a small, realistic fleet: CPU-only nodes and 1-, 2-, 4- and 8-GPU
// nodes of several models, one with an unhealthy device; l4-0 and a100-0 run
// HAMi's device plugin (split 10), so that shares have somewhere to go;
// b200-dra-0 and t4-dra-0 publish their GPUs through DRA.
func Demo() []Node {
	return []Node{
		{Name: "cpu-0", CPU: "32", Memory: "128Gi"},
		{Name: "cpu-1", CPU: "32", Memory: "128Gi"},
		{Name: "t4-0", CPU: "16", Memory: "64Gi", GPUs: 1, Model: "Tesla-T4", MemoryMiB: 15360},
		{Name: "t4-1", CPU: "32", Memory: "128Gi", GPUs: 2, Model: "Tesla-T4", MemoryMiB: 15360},
		{Name: "l4-0", CPU: "48", Memory: "192Gi", GPUs: 4, Model: "NVIDIA-L4", MemoryMiB: 23034, HAMiSplit: 10},
		{Name: "a100-0", CPU: "96", Memory: "1Ti", GPUs: 8, Model: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920, HAMiSplit: 10},
		{Name: "a100-1", CPU: "96", Memory: "1Ti", GPUs: 8, Unhealthy: 1, Model: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920},
		{Name: "h100-0", CPU: "112", Memory: "2Ti", GPUs: 8, Model: "NVIDIA-H100-80GB-HBM3", MemoryMiB: 81559},
		// GPUs published through DRA (fake drivers): NVIDIA's, whole GPUs;
		// HAMi's, shared by capacity.
		{Name: "b200-dra-0", CPU: "112", Memory: "2Ti", GPUs: 8, Model: "NVIDIA-B200", MemoryMiB: 183359, DRA: fakedra.NVIDIA},
		{Name: "t4-dra-0", CPU: "32", Memory: "128Gi", GPUs: 2, Model: "Tesla-T4", MemoryMiB: 15360, DRA: fakedra.HAMi},
	}
}
