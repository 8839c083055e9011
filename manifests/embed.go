// Package manifests embeds the shipped scheduler configuration, the deploy
// manifests and the example pods, so that make run, the tests and gpu-sim use
// exactly the files that are deployed.
package manifests

import (
	"embed"
	"encoding/json"
	"io/fs"
	"regexp"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// SchedulerConfig is config/scheduler-config.yaml.
//
//go:embed config/scheduler-config.yaml
var SchedulerConfig []byte

//go:embed rbac.yaml
var RBAC []byte

// AdmissionPolicy keeps gpu-scheduler.io/assignment gpu-scheduler's to
// write, and gpu-scheduler to status and its annotation.
//
//go:embed admission-policy.yaml
var AdmissionPolicy []byte

//go:embed configmap.yaml
var ConfigMap []byte

//go:embed deployment.yaml
var Deployment []byte

// Alerts are monitoring/alerts.yaml, Prometheus alert rules.
//
//go:embed monitoring/alerts.yaml
var Alerts []byte

// Dashboard is monitoring/dashboard.json, a Grafana dashboard.
//
//go:embed monitoring/dashboard.json
var Dashboard []byte

//go:embed examples/*.yaml
var examples embed.FS

// Example is one example pod manifest.
type Example struct {
	Name string
	YAML []byte
}

// Examples returns the example pods, by file name.
func Examples() []Example {
	var out []Example
	entries, _ := fs.ReadDir(examples, "examples")
	for _, e := range entries {
		b, _ := examples.ReadFile("examples/" + e.Name())
		out = append(out, Example{Name: strings.TrimSuffix(e.Name(), ".yaml"), YAML: b})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ConfigMapName holds the scheduler configuration in kube-system.
const ConfigMapName = "gpu-scheduler-config"

// RenderConfigMap is configmap.yaml as generated from the configuration
// (make manifests writes it; a test checks it is current).
func RenderConfigMap() []byte {
	var b strings.Builder
	b.WriteString("# Generated from config/scheduler-config.yaml by `make manifests`. Do not edit.\n")
	b.WriteString("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + ConfigMapName + "\n  namespace: kube-system\ndata:\n  scheduler-config.yaml: |\n")
	for _, line := range strings.Split(strings.TrimRight(string(SchedulerConfig), "\n"), "\n") {
		if line == "" {
			b.WriteString("\n")
			continue
		}
		b.WriteString("    " + line + "\n")
	}
	return []byte(b.String())
}

// ChartFiles are the files the Helm chart's templates read
// (charts/gpu-scheduler/files), by name: copies of the canonical ones.
func ChartFiles() map[string][]byte {
	return map[string][]byte{
		"scheduler-config.yaml": SchedulerConfig,
		"rbac.yaml":             RBAC,
		"admission-policy.yaml": AdmissionPolicy,
		"alerts.yaml":           Alerts,
		"dashboard.json":        Dashboard,
	}
}

//go:embed charts/gpu-scheduler/files
var chartFiles embed.FS

// ChartFile is a file of the chart's files/ as committed.
func ChartFile(name string) ([]byte, error) {
	return chartFiles.ReadFile("charts/gpu-scheduler/files/" + name)
}

// metricName matches the metrics our monitoring reads: ours, the
// scheduler's own, and leader election's.
var metricName = regexp.MustCompile(`\b(gpu_scheduler_[a-z_]+|scheduler_[a-z_]+|leader_election_[a-z_]+)\b`)

// MonitoringExprs returns every PromQL expression of the dashboard and the
// alert rules, by where it is.
func MonitoringExprs() (map[string]string, error) {
	out := map[string]string{}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(Dashboard, &d); err != nil {
		return nil, err
	}
	for _, p := range d.Panels {
		for _, t := range p.Targets {
			out["dashboard: "+p.Title+" "+t.RefID] = t.Expr
		}
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(Alerts, &rules); err != nil {
		return nil, err
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			out["alert: "+r.Alert] = r.Expr
		}
	}
	return out, nil
}

// MonitoringMetrics returns the metric names the dashboard and the alert
// rules use (histogram series named by their base name), each with a place
// that uses it.
func MonitoringMetrics() (map[string]string, error) {
	exprs, err := MonitoringExprs()
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for where, e := range exprs {
		for _, m := range metricName.FindAllString(e, -1) {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				m = strings.TrimSuffix(m, suffix)
			}
			out[m] = where
		}
	}
	return out, nil
}
