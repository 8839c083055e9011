package kubectlgpu

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
)

// The pods are read page by page (a large cluster's in one call would be
// one huge response), every page kept; a refusal says what is needed.
func TestReadPages(t *testing.T) {
	const n = 1234
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}})
	var limits []int64
	client.PrependReactor("list", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
		opts := a.(clienttesting.ListActionImpl).ListOptions
		limits = append(limits, opts.Limit)
		from := 0
		if opts.Continue != "" {
			from, _ = strconv.Atoi(opts.Continue)
		}
		to := min(from+int(opts.Limit), n)
		if opts.Limit == 0 {
			to = n
		}
		list := &v1.PodList{}
		for i := from; i < to; i++ {
			list.Items = append(list.Items, v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprint("p", i)}, Spec: v1.PodSpec{NodeName: "n"}})
		}
		if to < n {
			list.Continue = strconv.Itoa(to)
		}
		return true, list, nil
	})
	o := &Options{Client: client}
	c, err := o.read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(c.all) != n || len(c.onNode["n"]) != n || c.all[n-1].Name != fmt.Sprint("p", n-1) {
		t.Errorf("read %d pods, %d on the node; want %d", len(c.all), len(c.onNode["n"]), n)
	}
	if len(limits) != 3 || limits[0] != pageSize {
		t.Errorf("list calls with limits %v, want 3 pages of %d", limits, pageSize)
	}
	for i := range c.onNode["n"] {
		if c.onNode["n"][i] != &c.all[i] {
			t.Fatalf("onNode[%d] does not point into the pods read", i)
		}
	}

	forbidden := fake.NewClientset()
	forbidden.PrependReactor("list", "nodes", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "", fmt.Errorf("no"))
	})
	o = &Options{Client: forbidden}
	if _, err := o.read(context.Background()); err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "needs list on nodes and pods") {
		t.Errorf("a refused list: %v", err)
	}
}
