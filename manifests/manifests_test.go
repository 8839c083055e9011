package manifests

import (
	"os"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
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

// The Deployment runs the image of this version, never a moving tag, and
// the chart's appVersion is this version.
func TestImageTagIsVersion(t *testing.T) {
	v, err := os.ReadFile("../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	chart, err := os.ReadFile("charts/gpu-scheduler/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(chart), "\nappVersion: "+strings.TrimSpace(string(v))+"\n") {
		t.Errorf("Chart.yaml's appVersion is not %s", strings.TrimSpace(string(v)))
	}
	want := "image: \"gpu-scheduler:" + strings.TrimSpace(string(v)) + "\"\n"
	if !strings.Contains(string(Deployment), want) {
		t.Errorf("deployment.yaml does not run %q", strings.TrimSpace(want))
	}
}

// The admission policy freezes exactly the annotations a request is read
// from.
func TestAdmissionPolicyRequestKeys(t *testing.T) {
	policy := string(AdmissionPolicy)
	start := strings.Index(policy, "- name: requestKeys")
	end := strings.Index(policy[start:], "- name: has")
	if start < 0 || end < 0 {
		t.Fatal("no requestKeys in admission-policy.yaml")
	}
	listed := policy[start : start+end]
	for _, k := range gpu.RequestAnnotations {
		if !strings.Contains(listed, "'"+k+"'") {
			t.Errorf("admission-policy.yaml does not freeze %s", k)
		}
	}
	if n := strings.Count(listed, "'"); n != 2*len(gpu.RequestAnnotations) {
		t.Errorf("admission-policy.yaml lists %d keys, the code reads %d", n/2, len(gpu.RequestAnnotations))
	}
	// The binding policy keeps them off bindings too.
	for _, k := range gpu.RequestAnnotations {
		if n := strings.Count(policy, "'"+k+"'"); n != 2 {
			t.Errorf("%s is named %d times in admission-policy.yaml, want 2 (requests and bindings)", k, n)
		}
	}
}

// The dashboard and the rules read, and name no metric twice under two
// spellings.
func TestMonitoringParses(t *testing.T) {
	ms, err := MonitoringMetrics()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"gpu_scheduler_cluster_fragmentation_ratio", "gpu_scheduler_pending_gpu_pods",
		"gpu_scheduler_overcommitted_nodes", "gpu_scheduler_leader", "gpu_scheduler_pending_gpu_pod_max_age_seconds", "gpu_scheduler_hami_handshake_failures_total",
		"scheduler_scheduling_attempt_duration_seconds", "scheduler_schedule_attempts_total"} {
		if _, ok := ms[want]; !ok {
			t.Errorf("monitoring does not use %s", want)
		}
	}
}

// Every alert links its section of docs/runbook.md.
func TestAlertsHaveRunbooks(t *testing.T) {
	runbook, err := os.ReadFile("../docs/runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(Alerts, &rules); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			anchor := "#" + strings.ToLower(r.Alert)
			if u := r.Annotations["runbook_url"]; !strings.HasSuffix(u, "/docs/runbook.md"+anchor) {
				t.Errorf("%s: runbook_url %q, want docs/runbook.md%s", r.Alert, u, anchor)
			}
			if !strings.Contains(string(runbook), "\n## "+r.Alert+"\n") {
				t.Errorf("%s: no section in docs/runbook.md", r.Alert)
			}
			if !strings.Contains(r.Expr, "by (cluster, job") {
				t.Errorf("%s: not aggregated by cluster and job: %s", r.Alert, r.Expr)
			}
		}
	}
	if n == 0 {
		t.Fatal("no alert rules read")
	}
}

// The chart reads copies of the canonical files: make manifests refreshes
// them.
func TestChartFilesAreCurrent(t *testing.T) {
	for name, want := range ChartFiles() {
		got, err := ChartFile(name)
		if err != nil || string(got) != string(want) {
			t.Errorf("charts/gpu-scheduler/files/%s is stale: run make manifests", name)
		}
	}
}
