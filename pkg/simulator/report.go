package simulator

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Published holds the published FGD results (fgd_expected_alloc.csv): per
// workload and policy, the per-seed curves.
type Published map[string]map[string][]Curve

// PublishedFile is the published results in the trace directory.
const PublishedFile = "fgd_expected_alloc.csv"

// PublishedPolicies maps the published policy names to short ones.
var PublishedPolicies = map[string]string{
	"01-Random": "Random", "02-DotProd": "DotProd", "03-GpuClustering": "GpuClustering",
	"04-GpuPacking": "GpuPacking", "05-BestFit": "BestFit", "06-FGD": "FGD",
}

// LoadPublished reads the published results.
func LoadPublished(path string) (Published, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	header, err := r.Read()
	if err != nil {
		return nil, err
	}
	col := map[string]int{}
	for i, h := range header {
		col[h] = i
	}
	if _, ok := col["0"]; !ok {
		return nil, fmt.Errorf("%s: no column 0", path)
	}
	out := Published{}
	for {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		w := strings.TrimPrefix(rec[col["workload"]], "openb_pod_list_")
		p := PublishedPolicies[rec[col["sc_policy"]]]
		if p == "" {
			p = rec[col["sc_policy"]]
		}
		var c Curve
		for k := 0; k < Columns; k++ {
			c[k], err = strconv.ParseFloat(rec[col[strconv.Itoa(k)]], 64)
			if err != nil {
				c[k] = math.NaN()
			}
		}
		if out[w] == nil {
			out[w] = map[string][]Curve{}
		}
		out[w][p] = append(out[w][p], c)
	}
	return out, nil
}

// At summarises a set of curves at one column.
func At(curves []Curve, k int) Stats {
	vals := make([]float64, len(curves))
	for i, c := range curves {
		vals[i] = c[k]
	}
	return MeanSD(vals)
}

// MeanCurve averages curves column by column.
func MeanCurve(curves []Curve) Curve {
	var m Curve
	for k := 0; k < Columns; k++ {
		m[k] = At(curves, k).Mean
	}
	return m
}

// Summary is one workload and policy over its seeds.
type Summary struct {
	Workload string  `json:"workload"`
	Policy   Policy  `json:"policy"`
	Seeds    int     `json:"seeds"`
	Mean100  float64 `json:"mean_100"`
	SD100    float64 `json:"sd_100"`
	Mean130  float64 `json:"mean_130"`
	SD130    float64 `json:"sd_130"`
	Failed   float64 `json:"failed_pods_mean"`
	Pods     float64 `json:"pods_mean"`
	WallSec  float64 `json:"wall_seconds_mean"`
	// The published FGD means for the same workload, and our difference.
	FGD100  float64 `json:"published_fgd_100,omitempty"`
	FGD130  float64 `json:"published_fgd_130,omitempty"`
	Diff130 float64 `json:"diff_130_vs_published_fgd,omitempty"`
}

// Summarize groups results by workload and policy.
func Summarize(results []*Result, pub Published) []Summary {
	type key struct {
		w string
		p Policy
	}
	groups := map[key][]*Result{}
	var keys []key
	for _, r := range results {
		k := key{r.Workload, r.Policy}
		if groups[k] == nil {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], r)
	}
	var out []Summary
	for _, k := range keys {
		rs := groups[k]
		var curves []Curve
		var failed, pods, wall float64
		for _, r := range rs {
			curves = append(curves, r.Curve)
			failed += float64(r.Failed)
			pods += float64(r.Pods)
			wall += r.Wall.Seconds()
		}
		n := float64(len(rs))
		s100, s130 := At(curves, 100), At(curves, 130)
		sum := Summary{Workload: k.w, Policy: k.p, Seeds: len(rs), Mean100: s100.Mean, SD100: s100.SD,
			Mean130: s130.Mean, SD130: s130.SD, Failed: failed / n, Pods: pods / n, WallSec: wall / n}
		if fgd := pub[k.w]["FGD"]; len(fgd) > 0 {
			sum.FGD100, sum.FGD130 = At(fgd, 100).Mean, At(fgd, 130).Mean
			sum.Diff130 = sum.Mean130 - sum.FGD130
		}
		out = append(out, sum)
	}
	return out
}

// WriteTable prints the summary next to the published FGD figures.
func WriteTable(w io.Writer, sums []Summary) {
	fmt.Fprintf(w, "%-12s %-8s %5s  %14s  %14s  %8s %8s  %7s %7s %9s %7s\n",
		"workload", "policy", "seeds", "@100 mean(sd)", "@130 mean(sd)", "FGD@100", "FGD@130", "Δ@130", "failed", "pods", "wall-s")
	for _, s := range sums {
		fmt.Fprintf(w, "%-12s %-8s %5d  %7.2f (%4.2f)  %7.2f (%4.2f)  %8s %8s  %7s %7.0f %9.0f %7.1f\n",
			s.Workload, s.Policy, s.Seeds, s.Mean100, s.SD100, s.Mean130, s.SD130,
			opt(s.FGD100), opt(s.FGD130), signed(s.Diff130, s.FGD130), s.Failed, s.Pods, s.WallSec)
	}
}

func opt(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

func signed(d, ref float64) string {
	if ref == 0 {
		return "-"
	}
	return fmt.Sprintf("%+.2f", d)
}

// WriteCurves writes the per-run curves in the published layout.
func WriteCurves(path string, results []*Result, tune float64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w := csv.NewWriter(f)
	header := []string{"workload", "sc_policy", "tune", "seed", "total_gpus"}
	for k := 0; k < Columns; k++ {
		header = append(header, strconv.Itoa(k))
	}
	w.Write(header)
	sorted := append([]*Result(nil), results...)
	sort.SliceStable(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if a.Workload != b.Workload {
			return a.Workload < b.Workload
		}
		if a.Policy != b.Policy {
			return policyIndex(a.Policy) < policyIndex(b.Policy)
		}
		return a.Seed < b.Seed
	})
	for _, r := range sorted {
		rec := []string{"openb_pod_list_" + r.Workload, string(r.Policy), strconv.FormatFloat(tune, 'f', -1, 64),
			strconv.FormatInt(r.Seed, 10), strconv.FormatInt(r.Capacity/1000, 10)}
		for _, v := range r.Curve {
			if math.IsNaN(v) {
				rec = append(rec, "")
			} else {
				rec = append(rec, strconv.FormatFloat(v, 'f', -1, 64))
			}
		}
		w.Write(rec)
	}
	w.Flush()
	return w.Error()
}

func policyIndex(p Policy) int {
	for i, q := range Policies {
		if q == p {
			return i
		}
	}
	return len(Policies)
}

// WriteMarkdown writes the summary as a Markdown table.
func WriteMarkdown(path string, sums []Summary) error {
	var b strings.Builder
	b.WriteString("| workload | policy | seeds | @100 mean (sd) | @130 mean (sd) | published FGD @100 | published FGD @130 | Δ @130 | failed pods | wall s |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range sums {
		fmt.Fprintf(&b, "| %s | %s | %d | %.2f (%.2f) | %.2f (%.2f) | %s | %s | %s | %.0f | %.1f |\n",
			s.Workload, s.Policy, s.Seeds, s.Mean100, s.SD100, s.Mean130, s.SD130,
			opt(s.FGD100), opt(s.FGD130), signed(s.Diff130, s.FGD130), s.Failed, s.WallSec)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// RunFile is where one run's result is kept, so that a grid can resume.
func RunFile(out, workload string, p Policy, seed int64, tune float64, tieOrder string) string {
	suffix := ""
	if tieOrder != "" && tieOrder != TieHash {
		suffix = "_" + tieOrder
	}
	return filepath.Join(out, "runs", fmt.Sprintf("%s_%s_%d_%s%s.json", workload, p, seed, strconv.FormatFloat(tune, 'f', -1, 64), suffix))
}
