package manifests

import "testing"

func TestConfigMapIsCurrent(t *testing.T) {
	if string(ConfigMap) != string(RenderConfigMap()) {
		t.Fatal("manifests/configmap.yaml is stale: run make manifests")
	}
}

func TestExamples(t *testing.T) {
	if len(Examples()) < 6 {
		t.Fatalf("examples: %d", len(Examples()))
	}
}
