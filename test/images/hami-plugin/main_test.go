package main

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// The registration and GFD's labels are written each on their own, and
// neither write touches the node's other annotations and labels (a null
// map in a merge patch would remove them all: the first version did).
func TestKeepWritesOnlyItsKeys(t *testing.T) {
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n",
		Labels: map[string]string{"role": "gpu"}, Annotations: map[string]string{"kubeadm": "x"}}})
	for _, w := range []struct{ ann, labels map[string]string }{
		{nil, map[string]string{"nvidia.com/gpu.count": "4"}},
		{map[string]string{annotationRegister: "[]"}, nil},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		keep(ctx, client, "n", w.ann, w.labels)
		cancel()
	}
	n, err := client.CoreV1().Nodes().Get(context.Background(), "n", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Labels["role"] != "gpu" || n.Labels["nvidia.com/gpu.count"] != "4" || n.Annotations["kubeadm"] != "x" || n.Annotations[annotationRegister] != "[]" {
		t.Errorf("labels %v, annotations %v", n.Labels, n.Annotations)
	}
}
