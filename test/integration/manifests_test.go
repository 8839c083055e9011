package integration

import (
	"context"
	"testing"

	"github.com/gpu-scheduler/gpu-scheduler/manifests"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/kubeapply"
)

// Every manifest passes a server-side dry run against kube-apiserver
// v1.37.2: schema, defaulting and admission, without persisting anything.
func TestManifestsDryRun(t *testing.T) {
	a, err := kubeapply.New(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	docs := map[string][]byte{"rbac.yaml": manifests.RBAC, "configmap.yaml": manifests.ConfigMap, "deployment.yaml": manifests.Deployment,
		"admission-policy.yaml": manifests.AdmissionPolicy}
	for _, ex := range manifests.Examples() {
		docs["examples/"+ex.Name+".yaml"] = ex.YAML
	}
	for name, data := range docs {
		objs, err := a.Apply(ctx, data, "default", true)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if len(objs) == 0 {
			t.Errorf("%s: no objects", name)
		}
	}
}
