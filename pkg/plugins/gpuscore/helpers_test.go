package gpuscore_test

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	fwk "k8s.io/kube-scheduler/framework"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/metrics"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/offline"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/internal/shared"
)

type ctxT = context.Context

func frameworkOptions(cluster *offline.Cluster) []frameworkruntime.Option {
	metrics.Register()
	client := fake.NewClientset()
	return []frameworkruntime.Option{
		frameworkruntime.WithSnapshotSharedLister(cluster),
		frameworkruntime.WithClientSet(client),
		frameworkruntime.WithInformerFactory(informers.NewSharedInformerFactory(client, 0)),
	}
}

func sharedTracker(h fwk.Handle) *gpu.Tracker { return shared.For(h).Tracker() }

func sharedScoring(h fwk.Handle) gpu.Scoring { return shared.For(h).Scoring() }

func sharedWorkload(h fwk.Handle) *gpu.Workload { return shared.For(h).Workload() }

func sharedStateOf(h fwk.Handle, ni fwk.NodeInfo) *gpu.NodeState { return shared.For(h).State(ni) }

func createPod(t *testing.T, client clientset.Interface, pod *v1.Pod) {
	t.Helper()
	if _, err := client.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// prebound reads back what PreBind wrote, as the informer would deliver it.
func prebound(t *testing.T, client clientset.Interface) func(*v1.Pod) *v1.Pod {
	return func(p *v1.Pod) *v1.Pod {
		got, err := client.CoreV1().Pods(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
}
