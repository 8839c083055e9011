package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

const queueLabel = "kueue.x-k8s.io/queue-name"

// Kueue admits Jobs against a ClusterQueue's GPU quota, and gpu-scheduler
// places the pods of the Jobs it admits: a Job over quota waits suspended
// (no pod exists) until quota frees, a Job under quota binds.
func TestKueueAdmitsGPUJobs(t *testing.T) {
	kq := startKueue(t)
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "n", CPU: "64", Memory: "256Gi", GPUs: 6, Model: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920})
	queue(t, s, kq, 4)
	sched := gpu.SchedulerName

	// a: 2 pods x 2 GPUs, the whole quota: admitted, bound.
	job(t, s, sched, "a", 2, 2, "")
	waitJobBound(t, s, "a", 2)
	// b: 1 GPU more than the quota has left: suspended, no pod.
	job(t, s, sched, "b", 1, 1, "")
	time.Sleep(5 * time.Second)
	if j := getJob(t, s, "b"); !ptr.Deref(j.Spec.Suspend, false) {
		t.Fatal("b was admitted over the quota")
	}
	if n := len(jobPods(t, s, "b")); n != 0 {
		t.Fatalf("b has %d pods while suspended", n)
	}
	t.Logf("b waits: %s", workloadReason(t, s, kq, "b"))
	// a done (deleted): b is admitted and binds.
	if err := cluster.Client.BatchV1().Jobs(s.NS).Delete(s.Ctx, "a", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	waitJobBound(t, s, "b", 1)
	checkDevices(t)
}

// A gang that Kueue admits (its quota covers the whole Job) binds all or
// nothing where the node, not the quota, is short: a pod outside the queue
// takes 3 of the node's 5 GPUs, the gang g (3 pods x 1 GPU, minCount 3)
// binds no pod; once the node has room, all three.
func TestKueueAdmitsGangs(t *testing.T) {
	_, sched := gangScheduler(t)
	kq := startKueue(t)
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "n", CPU: "64", Memory: "256Gi", GPUs: 5, Model: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920})
	queue(t, s, kq, 4)
	s.Create(s.Pod(harness.PodSpec{Name: "blocker", GPUs: 3, Scheduler: sched}))
	s.WaitBound(bindTimeout, "blocker")
	gang(t, s, "g", 3)
	job(t, s, sched, "g", 3, 1, "g")
	if err := waitFor(s, time.Minute, func() bool {
		j := getJob(t, s, "g")
		return !ptr.Deref(j.Spec.Suspend, true) && len(jobPods(t, s, "g")) == 3
	}); err != nil {
		t.Fatalf("g not admitted: %v (%s)", err, workloadReason(t, s, kq, "g"))
	}
	pods := jobPods(t, s, "g")
	msg := s.WaitUnschedulable(time.Minute, pods[0].Name)
	t.Logf("g pending: %s", msg)
	time.Sleep(3 * time.Second)
	if n := boundOf(jobPods(t, s, "g")); n != 0 {
		t.Fatalf("%d of the gang's 3 pods bound with room for 2", n)
	}
	s.Delete("blocker")
	waitJobBound(t, s, "g", 3)
	checkDevices(t)
}

// startKueue runs Kueue's controller and the Job controller for the test.
func startKueue(t *testing.T) *harness.Kueue {
	t.Helper()
	if !cluster.Local() {
		t.Skip("Kueue runs against the local control plane only")
	}
	if os.Geteuid() != 0 {
		t.Skip("Kueue v0.17 reads its metrics certificate from a fixed path under /etc: needs root")
	}
	kq, err := harness.StartKueue(context.Background(), cluster)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(kq.Tail(40))
		}
		kq.Stop()
	})
	return kq
}

// queue makes a ResourceFlavor, a ClusterQueue for the scope's namespace
// with gpus of nvidia.com/gpu (and room in CPU and memory), and a
// LocalQueue "lq" on it.
func queue(t *testing.T, s *harness.Scope, kq *harness.Kueue, gpus int) {
	t.Helper()
	rf, cq := s.ID+"-flavor", s.ID+"-cq"
	objs := []struct {
		res schema.GroupVersionResource
		ns  string
		obj map[string]any
	}{
		{harness.ResourceFlavors, "", map[string]any{"metadata": map[string]any{"name": rf}}},
		{harness.ClusterQueues, "", map[string]any{
			"metadata": map[string]any{"name": cq},
			"spec": map[string]any{
				"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": s.NS}},
				"resourceGroups": []any{map[string]any{
					"coveredResources": []any{"cpu", "memory", "nvidia.com/gpu"},
					"flavors": []any{map[string]any{"name": rf, "resources": []any{
						map[string]any{"name": "cpu", "nominalQuota": "64"},
						map[string]any{"name": "memory", "nominalQuota": "256Gi"},
						map[string]any{"name": "nvidia.com/gpu", "nominalQuota": fmt.Sprint(gpus)},
					}}},
				}},
			}}},
		{harness.LocalQueues, s.NS, map[string]any{
			"metadata": map[string]any{"name": "lq", "namespace": s.NS},
			"spec":     map[string]any{"clusterQueue": cq}}},
	}
	for _, o := range objs {
		u := &unstructured.Unstructured{Object: o.obj}
		u.SetAPIVersion(o.res.Group + "/" + o.res.Version)
		u.SetKind(map[string]string{"resourceflavors": "ResourceFlavor", "clusterqueues": "ClusterQueue", "localqueues": "LocalQueue"}[o.res.Resource])
		var err error
		if o.ns == "" {
			_, err = kq.Dynamic.Resource(o.res).Create(s.Ctx, u, metav1.CreateOptions{})
			name := u.GetName()
			res := o.res
			t.Cleanup(func() { _ = kq.Dynamic.Resource(res).Delete(context.Background(), name, metav1.DeleteOptions{}) })
		} else {
			_, err = kq.Dynamic.Resource(o.res).Namespace(o.ns).Create(s.Ctx, u, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatalf("creating %s %s: %v", o.res.Resource, u.GetName(), err)
		}
	}
}

// job creates a suspended Job in the LocalQueue "lq": n pods of gpus GPUs
// each, in the pod group group if one is given.
func job(t *testing.T, s *harness.Scope, sched, name string, n int32, gpus int, group string) {
	t.Helper()
	spec := s.Pod(harness.PodSpec{Name: name, GPUs: gpus, Scheduler: sched, PodGroup: group}).Spec
	spec.RestartPolicy = v1.RestartPolicyNever
	j := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.NS, Labels: map[string]string{queueLabel: "lq"}},
		Spec: batchv1.JobSpec{
			Parallelism: ptr.To(n), Completions: ptr.To(n), Suspend: ptr.To(true),
			Template: v1.PodTemplateSpec{Spec: spec},
		},
	}
	if _, err := cluster.Client.BatchV1().Jobs(s.NS).Create(s.Ctx, j, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating job %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.BatchV1().Jobs(s.NS).Delete(context.Background(), name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	})
}

func getJob(t *testing.T, s *harness.Scope, name string) *batchv1.Job {
	t.Helper()
	j, err := cluster.Client.BatchV1().Jobs(s.NS).Get(s.Ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func jobPods(t *testing.T, s *harness.Scope, name string) []v1.Pod {
	t.Helper()
	l, err := cluster.Client.CoreV1().Pods(s.NS).List(s.Ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + name})
	if err != nil {
		t.Fatal(err)
	}
	var out []v1.Pod
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

func boundOf(pods []v1.Pod) int {
	n := 0
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			n++
		}
	}
	return n
}

// waitJobBound waits until the Job is admitted and n of its pods are bound.
func waitJobBound(t *testing.T, s *harness.Scope, name string, n int) {
	t.Helper()
	if err := waitFor(s, 2*time.Minute, func() bool { return boundOf(jobPods(t, s, name)) == n }); err != nil {
		t.Fatalf("job %s: %d of %d pods bound: %v", name, boundOf(jobPods(t, s, name)), n, err)
	}
}

// workloadReason is what Kueue says of the Job's Workload.
func workloadReason(t *testing.T, s *harness.Scope, kq *harness.Kueue, job string) string {
	t.Helper()
	l, err := kq.Dynamic.Resource(harness.Workloads).Namespace(s.NS).List(s.Ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	for _, w := range l.Items {
		for _, o := range w.GetOwnerReferences() {
			if o.Kind == "Job" && o.Name == job {
				conds, _, _ := unstructured.NestedSlice(w.Object, "status", "conditions")
				return fmt.Sprint(conds)
			}
		}
	}
	return "no workload"
}
