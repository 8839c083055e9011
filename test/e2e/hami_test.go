package e2e

import (
	"context"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/hami"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fakehami"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

// A fleet of nodes running HAMi's device plugin and plain nodes, a burst of
// shares (ours and HAMi's dialect) and whole GPUs, and the leader killed
// in the middle. Every share lands on a HAMi node; every container gets
// the devices and limits recorded for it; no device ends up with more
// memory, cores or containers than it registered, across the restart (the
// new leader rebuilds from the pods' annotations); and the binary, as its
// ServiceAccount under the admission policy, may write all of it.
func TestHAMiNodes(t *testing.T) {
	s := cluster.NewScope(t)
	s.AddNodes(
		fleet.Node{Name: "hami-0", CPU: "96", Memory: "512Gi", GPUs: 8, Model: "NVIDIA-L4", MemoryMiB: 23034, HAMiSplit: 4},
		fleet.Node{Name: "hami-1", CPU: "96", Memory: "512Gi", GPUs: 8, Model: "NVIDIA-L4", MemoryMiB: 23034, HAMiSplit: 4},
		fleet.Node{Name: "plain", CPU: "96", Memory: "512Gi", GPUs: 8, Model: "NVIDIA-L4", MemoryMiB: 23034},
	)
	hamiNodes := map[string]bool{s.Node("hami-0"): true, s.Node("hami-1"): true}
	rng := rand.New(rand.NewSource(7))
	var names []string
	var pods []*v1.Pod
	for i := 0; i < 60; i++ {
		name := fmt.Sprintf("p%02d", i)
		var p *v1.Pod
		switch i % 4 {
		case 0: // ours, delivered through one slot
			p = s.Pod(harness.PodSpec{Name: name, Milli: 200 + 100*rng.Intn(5)})
			harness.WithLimits(p, map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1"})
		case 1: // HAMi's dialect
			p = s.Pod(harness.PodSpec{Name: name})
			harness.WithLimits(p, map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1", hami.ResourceMemory: strconv.Itoa(2000 + 1000*rng.Intn(8)), hami.ResourceCores: strconv.Itoa(10 * rng.Intn(4))})
		case 2: // by memory
			p = s.Pod(harness.PodSpec{Name: name, Annotations: map[string]string{gpu.AnnotationMemory: strconv.Itoa(3000 + 1000*rng.Intn(5))}})
			harness.WithLimits(p, map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1"})
		default:
			p = s.Pod(harness.PodSpec{Name: name, GPUs: 1})
		}
		names = append(names, name)
		pods = append(pods, p)
	}
	burstAndKill(t, s, pods, names, 20*time.Millisecond, 15)
	// A bind the dead leader left half done holds its node's lock until
	// its successor judges it abandoned (a Binding it sent could land for
	// a minute); the pods waiting for that node bind then.
	err := wait.PollUntilContextTimeout(s.Ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		for n := range hamiNodes {
			node, err := cluster.Client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			if _, held := node.Annotations[hami.AnnotationNodeLock]; held {
				return false, nil
			}
		}
		return countBound(ctx, s) >= 40, nil
	})
	if err != nil {
		t.Logf("after the restart: %d bound, locks still held: %v", countBound(s.Ctx, s), err)
	}

	type use struct {
		mem, cores int
		pods       []string
	}
	used := map[string]*use{}
	bound := 0
	// Each bound pod that asked the device plugin must be admitted.
	err = wait.PollUntilContextTimeout(s.Ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cluster.Client.CoreV1().Pods(s.NS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		used, bound = map[string]*use{}, 0
		for i := range list.Items {
			p := &list.Items[i]
			if p.Spec.NodeName == "" {
				continue
			}
			bound++
			if p.Status.Phase == v1.PodFailed {
				return false, fmt.Errorf("%s failed admission: %s", p.Name, p.Status.Message)
			}
			if !hamiNodes[p.Spec.NodeName] {
				if _, shared := p.Annotations[gpu.AnnotationMilli]; shared || p.Annotations[gpu.AnnotationMemory] != "" {
					return false, fmt.Errorf("%s: a share on %s, which does not deliver shares", p.Name, p.Spec.NodeName)
				}
				if _, ok := p.Spec.Containers[0].Resources.Limits[hami.ResourceMemory]; ok {
					return false, fmt.Errorf("%s: HAMi's dialect on %s", p.Name, p.Spec.NodeName)
				}
				continue
			}
			v, ok := p.Annotations[fakehami.EnvPrefix+"main"]
			if !ok {
				return false, nil // not admitted yet
			}
			env := fakehami.Env(v)
			rec, err := hami.DecodePodDevices(p.Annotations[hami.AnnotationAllocated])
			if err != nil || len(rec) == 0 || len(rec[0]) != 1 || rec[0][0].UUID != env["NVIDIA_VISIBLE_DEVICES"] ||
				env["CUDA_DEVICE_MEMORY_LIMIT_0"] != fmt.Sprintf("%dm", rec[0][0].Usedmem) || env["CUDA_DEVICE_SM_LIMIT"] != strconv.Itoa(int(rec[0][0].Usedcores)) {
				return false, fmt.Errorf("%s: the container got %v, its record is %q", p.Name, env, p.Annotations[hami.AnnotationAllocated])
			}
			if rec[0][0].Usedmem <= 0 {
				return false, fmt.Errorf("%s: no memory limit (0 is unlimited): %v", p.Name, env)
			}
			u := used[env["NVIDIA_VISIBLE_DEVICES"]]
			if u == nil {
				u = &use{}
				used[env["NVIDIA_VISIBLE_DEVICES"]] = u
			}
			u.mem += int(rec[0][0].Usedmem)
			u.cores += int(rec[0][0].Usedcores)
			u.pods = append(u.pods, p.Name)
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for id, u := range used {
		if u.mem > 23034 || u.cores > 100 || len(u.pods) > 4 {
			t.Errorf("device %s holds %d MiB, %d%% of the SMs, %d containers: %s", id, u.mem, u.cores, len(u.pods), strings.Join(u.pods, ","))
		}
	}
	for n := range hamiNodes {
		node, err := cluster.Client.CoreV1().Nodes().Get(s.Ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if v, held := node.Annotations[hami.AnnotationNodeLock]; held {
			t.Errorf("%s: lock still held after every bind: %s", n, v)
		}
	}
	t.Logf("%d of %d pods bound, on %d HAMi devices", bound, len(names), len(used))
	if bound < 40 {
		t.Errorf("only %d pods bound", bound)
	}
}
