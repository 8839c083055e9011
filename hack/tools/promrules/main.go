// Command promrules validates Prometheus rule files as `promtool check rules`
// does (the same code, from Prometheus' Go module), and the PromQL of a
// Grafana dashboard's targets.
//
//	promrules -rules alerts.yaml [-dashboard dashboard.json]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	rules := flag.String("rules", "", "a rule file")
	dashboard := flag.String("dashboard", "", "a Grafana dashboard (JSON)")
	flag.Parse()
	p := parser.NewParser(parser.Options{})
	bad := false
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
