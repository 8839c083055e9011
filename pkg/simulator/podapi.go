package simulator

import (
	"encoding/json"
	"fmt"
	"sync"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
)

// podAPI is the little of the pods API a replay needs (create, get, merge
// patch, delete), in memory. The fake clientset's own tracker does field
// management and builds a REST mapper per call, which was a third of a
// replay's time; nothing here needs watches, so informers see no pods.
type podAPI struct {
	mu   sync.Mutex
	pods map[string]*v1.Pod
}

func newClient() (*fake.Clientset, *podAPI) {
	api := &podAPI{pods: map[string]*v1.Pod{}}
	client := fake.NewSimpleClientset()
	client.PrependReactor("*", "pods", api.react)
	return client, api
}

func key(ns, name string) string { return ns + "/" + name }

func (a *podAPI) react(action clienttesting.Action) (bool, runtime.Object, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	gr := v1.Resource("pods")
	switch act := action.(type) {
	case clienttesting.CreateAction:
		if b, ok := act.GetObject().(*v1.Binding); ok {
			// The binding subresource: the node, and the Binding's annotations
			// merged into the pod's.
			p, found := a.pods[key(act.GetNamespace(), b.Name)]
			if !found {
				return true, nil, apierrors.NewNotFound(gr, b.Name)
			}
			p.Spec.NodeName = b.Target.Name
			if len(b.Annotations) > 0 && p.Annotations == nil {
				p.Annotations = map[string]string{}
			}
			for k, v := range b.Annotations {
				p.Annotations[k] = v
			}
			return true, b, nil
		}
		p := act.GetObject().(*v1.Pod).DeepCopy()
		a.pods[key(p.Namespace, p.Name)] = p
		return true, p.DeepCopy(), nil
	case clienttesting.GetAction:
		p, ok := a.pods[key(act.GetNamespace(), act.GetName())]
		if !ok {
			return true, nil, apierrors.NewNotFound(gr, act.GetName())
		}
		return true, p.DeepCopy(), nil
	case clienttesting.DeleteAction:
		delete(a.pods, key(act.GetNamespace(), act.GetName()))
		return true, nil, nil
	case clienttesting.PatchAction:
		k := key(act.GetNamespace(), act.GetName())
		p, ok := a.pods[k]
		if !ok {
			return true, nil, apierrors.NewNotFound(gr, act.GetName())
		}
		if act.GetPatchType() != types.MergePatchType {
			return true, nil, fmt.Errorf("replay pod API: unsupported patch type %s", act.GetPatchType())
		}
		orig, err := json.Marshal(p)
		if err != nil {
			return true, nil, err
		}
		patched, err := jsonpatch.MergePatch(orig, act.GetPatch())
		if err != nil {
			return true, nil, err
		}
		out := &v1.Pod{}
		if err := json.Unmarshal(patched, out); err != nil {
			return true, nil, err
		}
		a.pods[k] = out
		return true, out.DeepCopy(), nil
	case clienttesting.ListAction:
		return true, &v1.PodList{}, nil
	}
	return false, nil, nil
}
