package manifests

import (
	"os"
	"strings"
	"testing"
)

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

// The Deployment runs the image of this version, never a moving tag.
func TestImageTagIsVersion(t *testing.T) {
	v, err := os.ReadFile("../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	want := "image: gpu-scheduler:" + strings.TrimSpace(string(v)) + "\n"
	if !strings.Contains(string(Deployment), want) {
		t.Errorf("deployment.yaml does not run %q", strings.TrimSpace(want))
	}
}
