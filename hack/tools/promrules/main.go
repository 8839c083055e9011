// Command promrules validates Prometheus rule files as `promtool check rules`
// does (the same code, from Prometheus' Go module), and the PromQL of a
// Grafana dashboard's targets, and prometheus-operator objects (a
// ServiceMonitor, a PrometheusRule) against their Go types, strictly, where
// their CRDs are not served to dry-run them.
//
//	promrules -rules alerts.yaml [-dashboard dashboard.json] [-objects rendered.yaml]
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"regexp"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"sigs.k8s.io/yaml"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	rules := flag.String("rules", "", "a rule file")
	dashboard := flag.String("dashboard", "", "a Grafana dashboard (JSON)")
	objects := flag.String("objects", "", "YAML documents (helm template's output): its monitoring.coreos.com/v1 objects are checked")
	flag.Parse()
	p := parser.NewParser(parser.Options{})
	bad := false
	if *objects != "" {
		n, err := checkObjects(*objects, p)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("%s: %d prometheus-operator objects: SUCCESS\n", *objects, n)
	}
	if *rules != "" {
		groups, errs := rulefmt.ParseFile(*rules, false, model.UTF8Validation, p, slog.New(slog.DiscardHandler))
		for _, err := range errs {
			fmt.Fprintln(os.Stderr, err)
			bad = true
		}
		if groups != nil && len(errs) == 0 {
			n := 0
			for _, g := range groups.Groups {
				n += len(g.Rules)
			}
			fmt.Printf("%s: %d rules in %d groups: SUCCESS\n", *rules, n, len(groups.Groups))
		}
	}
	if *dashboard != "" {
		b, err := os.ReadFile(*dashboard)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		var d struct {
			Panels []struct {
				Title   string `json:"title"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
		}
		if err := json.Unmarshal(b, &d); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", *dashboard, err)
			os.Exit(1)
		}
		n := 0
		for _, panel := range d.Panels {
			for _, t := range panel.Targets {
				n++
				if _, err := p.ParseExpr(t.Expr); err != nil {
					fmt.Fprintf(os.Stderr, "%s: panel %q: %v\n", *dashboard, panel.Title, err)
					bad = true
				}
			}
		}
		fmt.Printf("%s: %d expressions in %d panels parsed\n", *dashboard, n, len(d.Panels))
	}
	if bad {
		os.Exit(1)
	}
}

// checkObjects decodes every monitoring.coreos.com/v1 object of a YAML
// stream into its Go type, refusing unknown fields, and parses the rules of
// a PrometheusRule as promtool does.
func checkObjects(path string, p parser.Parser) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			return n, fmt.Errorf("%s: %w", path, err)
		}
		if head.APIVersion != monitoringv1.SchemeGroupVersion.String() {
			continue
		}
		where := fmt.Sprintf("%s: %s %s", path, head.Kind, head.Metadata.Name)
		switch head.Kind {
		case monitoringv1.ServiceMonitorsKind:
			var sm monitoringv1.ServiceMonitor
			if err := yaml.UnmarshalStrict([]byte(doc), &sm); err != nil {
				return n, fmt.Errorf("%s: %w", where, err)
			}
			if len(sm.Spec.Endpoints) == 0 {
				return n, fmt.Errorf("%s: no endpoints", where)
			}
			for _, e := range sm.Spec.Endpoints {
				//nolint:staticcheck // what is checked is that it is not used
				if e.BearerTokenFile != "" {
					return n, fmt.Errorf("%s: bearerTokenFile is deprecated by prometheus-operator (use authorization)", where)
				}
				if e.Authorization == nil {
					return n, fmt.Errorf("%s: no authorization (the secure port refuses anonymous scrapes)", where)
				}
			}
		case monitoringv1.PodMonitorsKind:
			var pm monitoringv1.PodMonitor
			if err := yaml.UnmarshalStrict([]byte(doc), &pm); err != nil {
				return n, fmt.Errorf("%s: %w", where, err)
			}
			if len(pm.Spec.PodMetricsEndpoints) == 0 {
				return n, fmt.Errorf("%s: no endpoints", where)
			}
			for _, e := range pm.Spec.PodMetricsEndpoints {
				if e.Authorization == nil {
					return n, fmt.Errorf("%s: no authorization (the secure port refuses anonymous scrapes)", where)
				}
			}
		case monitoringv1.PrometheusRuleKind:
			var pr monitoringv1.PrometheusRule
			if err := yaml.UnmarshalStrict([]byte(doc), &pr); err != nil {
				return n, fmt.Errorf("%s: %w", where, err)
			}
			spec, err := yaml.Marshal(pr.Spec)
			if err != nil {
				return n, err
			}
			if _, errs := rulefmt.Parse(bytes.TrimSpace(spec), false, model.UTF8Validation, p, slog.New(slog.DiscardHandler)); len(errs) > 0 {
				return n, fmt.Errorf("%s: %v", where, errs)
			}
		default:
			return n, fmt.Errorf("%s: a kind this check does not know", where)
		}
		n++
	}
	return n, nil
}
