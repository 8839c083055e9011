package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpu-scheduler/gpu-scheduler/manifests"
	ourconfig "github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/kubeapply"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/offline"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

const chart = "../../manifests/charts/gpu-scheduler"

func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin := filepath.Join(harness.BinDir(), "helm")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s: %v (make %s)", bin, err, bin)
	}
	cmd := exec.Command(bin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String() + errb.String(), err
	}
	return out.String(), nil
}

// The Helm chart: helm lint passes, and helm template with the default
// values and with others renders objects the kube-apiserver accepts
// (server-side dry run) and a configuration the scheduler loads. With the
// defaults it renders exactly the files in manifests/ it is made from.
func TestHelmChart(t *testing.T) {
	if out, err := helm(t, "lint", chart, "--namespace", "kube-system", "--kube-version", "1.37.2"); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
	a, err := kubeapply.New(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		set   []string
		check func(t *testing.T, objs []*unstructured.Unstructured, cfg *ourconfig.GPUScoreArgs, fit *ourconfig.GPUFitArgs)
	}{
		"defaults": {check: func(t *testing.T, objs []*unstructured.Unstructured, score *ourconfig.GPUScoreArgs, fit *ourconfig.GPUFitArgs) {
			// One source: the chart renders manifests/deployment.yaml
			// (make manifests) and the RBAC and admission policy files.
			var deploy []string
			for _, o := range objs {
				if o.GetKind() == "Deployment" {
					deploy = append(deploy, o.GetName())
				}
			}
			if len(deploy) != 1 {
				t.Fatalf("deployments %v", deploy)
			}
			if score.Policy != "Fragmentation" || !fit.HAMi.Enabled || fit.AccountingOnlySharing {
				t.Errorf("default config: policy %s, hami %v, accounting-only %v", score.Policy, fit.HAMi.Enabled, fit.AccountingOnlySharing)
			}
		}},
		"plain nodes, BestFit, three replicas, gangs, monitoring": {
			set: []string{"nodeAgent=plain", "accountingOnlySharing=true", "replicaCount=3", "pluginArgs.GPUScore.policy=BestFit",
				"pluginArgs.GPUPreemption.minCandidateNodesAbsolute=50", "pluginArgs.GPUScore.targetWorkload.halfLifePods=0",
				"pluginArgs.GPUFit.requeue.enabled=false", "schedulerName=gpu-x", "featureGates.GenericWorkload=true", "image.tag=v9.9.9",
				"monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true", "monitoring.dashboard.enabled=true",
				"monitoring.serviceMonitor.labels.release=kps", "monitoring.prometheusRule.labels.release=kps",
				"nodeSelector.node-role\\.kubernetes\\.io/control-plane=", "tolerations[0].key=node-role.kubernetes.io/control-plane",
				"tolerations[0].operator=Exists", "tolerations[0].effect=NoSchedule",
				"admissionPolicy.enabled=false"},
			check: func(t *testing.T, objs []*unstructured.Unstructured, score *ourconfig.GPUScoreArgs, fit *ourconfig.GPUFitArgs) {
				if score.Policy != "BestFit" || fit.HAMi.Enabled || !fit.AccountingOnlySharing {
					t.Errorf("config: policy %s, hami %v, accounting-only %v", score.Policy, fit.HAMi.Enabled, fit.AccountingOnlySharing)
				}
				// Zero and false values merge too (sprig's mergeOverwrite drops them).
				if score.TargetWorkload.HalfLifePods != 0 || score.TargetWorkload.CoveragePercent != 95 || fit.Requeue.Enabled {
					t.Errorf("config: halfLifePods %d (want 0), coveragePercent %d (want 95), requeue enabled %v (want false)",
						score.TargetWorkload.HalfLifePods, score.TargetWorkload.CoveragePercent, fit.Requeue.Enabled)
				}
				kinds := map[string]bool{}
				for _, o := range objs {
					kinds[o.GetKind()] = true
					if o.GetKind() == "Deployment" {
						r, _, _ := unstructured.NestedFieldNoCopy(o.Object, "spec", "replicas")
						n := fmt.Sprint(r)
						cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
						c := cs[0].(map[string]interface{})
						if n != "3" || c["image"] != "gpu-scheduler:v9.9.9" || !strings.Contains(strings.Join(toStrings(c["args"]), " "), "--feature-gates=GenericWorkload=true") {
							t.Errorf("deployment: replicas %s, image %v, args %v", n, c["image"], c["args"])
						}
						tol, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "tolerations")
						sel, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "spec", "nodeSelector")
						if _, ok := sel["node-role.kubernetes.io/control-plane"]; !ok || len(tol) != 1 {
							t.Errorf("deployment: nodeSelector %v, tolerations %v", sel, tol)
						}
					}
					if o.GetKind() == "ConfigMap" && o.GetName() == "gpu-scheduler-dashboard" {
						d, _, _ := unstructured.NestedString(o.Object, "data", "gpu-scheduler.json")
						if strings.Contains(d, `profile=\"gpu-scheduler\"`) || !strings.Contains(d, `profile=\"gpu-x\"`) {
							t.Errorf("the dashboard does not read the profile gpu-x")
						}
					}
					if o.GetAPIVersion() == "monitoring.coreos.com/v1" && o.GetLabels()["release"] != "kps" {
						t.Errorf("%s: labels %v, want release=kps", o.GetKind(), o.GetLabels())
					}
				}
				for _, k := range []string{"ServiceMonitor", "PrometheusRule", "Service"} {
					if !kinds[k] {
						t.Errorf("no %s", k)
					}
				}
				if kinds["ValidatingAdmissionPolicy"] {
					t.Errorf("admission policy rendered while disabled")
				}
			}},
	} {
		t.Run(name, func(t *testing.T) {
			args := []string{"template", "gpu-scheduler", chart, "--namespace", "kube-system", "--kube-version", "1.37.2"}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			out, err := helm(t, args...)
			if err != nil {
				t.Fatalf("helm template: %v\n%s", err, out)
			}
			objs, err := kubeapply.Decode([]byte(out))
			if err != nil {
				t.Fatal(err)
			}
			var score *ourconfig.GPUScoreArgs
			var fit *ourconfig.GPUFitArgs
			for _, o := range objs {
				if o.GetKind() == "ConfigMap" && o.GetName() == manifests.ConfigMapName {
					data, _, _ := unstructured.NestedString(o.Object, "data", "scheduler-config.yaml")
					cfg, err := offline.LoadConfig([]byte(data))
					if err != nil {
						t.Fatalf("the rendered configuration does not load: %v\n%s", err, data)
					}
					for _, pc := range cfg.Profiles[0].PluginConfig {
						switch a := pc.Args.(type) {
						case *ourconfig.GPUScoreArgs:
							score = a
						case *ourconfig.GPUFitArgs:
							fit = a
						}
					}
				}
				if o.GetAPIVersion() == "monitoring.coreos.com/v1" {
					continue // no prometheus-operator here: its CRDs are not served
				}
				if _, err := a.ApplyObject(context.Background(), o, "kube-system", true); err != nil {
					t.Errorf("server-side dry run of %s %s: %v", o.GetKind(), o.GetName(), err)
				}
			}
			if score == nil || fit == nil {
				t.Fatal("no GPUScore or GPUFit args in the rendered configuration")
			}
			// The prometheus-operator objects against their Go types,
			// strictly, and the PrometheusRule's rules as promtool reads them.
			rendered := filepath.Join(t.TempDir(), "rendered.yaml")
			if err := os.WriteFile(rendered, []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
			if res, err := exec.Command(filepath.Join(harness.BinDir(), "promrules"), "-objects", rendered).CombinedOutput(); err != nil {
				t.Errorf("promrules -objects: %v\n%s", err, res)
			}
			tc.check(t, objs, score, fit)
		})
	}
	// The files it is made from are manifests/'s, and deployment.yaml is
	// its rendering.
	out, err := helm(t, "template", "gpu-scheduler", chart, "--namespace", "kube-system", "--kube-version", "1.37.2", "--show-only", "templates/deployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, l := range strings.Split(out, "\n") {
		if l != "---" && !strings.HasPrefix(l, "# Source:") {
			kept = append(kept, l)
		}
	}
	if want := strings.TrimPrefix(string(manifests.Deployment), "# Generated from charts/gpu-scheduler (default values) by make manifests. Do not edit.\n"); strings.Join(kept, "\n") != want {
		t.Errorf("manifests/deployment.yaml is not the chart's rendering: run make manifests")
	}
	if out, err := helm(t, "template", "x", chart, "--namespace", "kube-system", "--kube-version", "1.37.2", "--set", "nodeAgent=other"); err == nil || !strings.Contains(out, "nodeAgent") || !strings.Contains(out, "'hami', 'plain'") {
		t.Errorf("an unknown nodeAgent: %v\n%s", err, out)
	}
	// values.schema.json: a misspelt plugin or value is refused, not ignored.
	for _, bad := range []string{"pluginArgs.GpuScore.policy=BestFit", "replicaCount=0", "monitoring.serviceMonitor.intervall=1m", "image.pullPolicy=Sometimes"} {
		if out, err := helm(t, "template", "x", chart, "--namespace", "kube-system", "--kube-version", "1.37.2", "--set", bad); err == nil || !strings.Contains(out, "schema") {
			t.Errorf("--set %s: %v\n%s", bad, err, out)
		}
	}
	if out, err := helm(t, "template", "x", chart, "--namespace", "kube-system", "--kube-version", "1.37.2", "--set", "leaderElection=false"); err == nil || !strings.Contains(out, "several active schedulers") {
		t.Errorf("two replicas without leader election: %v\n%s", err, out)
	}
	if out, err := helm(t, "template", "x", chart, "--namespace", "default", "--kube-version", "1.37.2"); err == nil || !strings.Contains(out, "kube-system") {
		t.Errorf("another namespace: %v\n%s", err, out)
	}
}

func toStrings(v interface{}) []string {
	var out []string
	if l, ok := v.([]interface{}); ok {
		for _, x := range l {
			if s, ok := x.(string); ok {
				out = append(out, s)
			}
		}
	}
	return out
}
