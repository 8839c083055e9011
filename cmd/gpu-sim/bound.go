package main

import (
	"encoding/csv"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/simulator"
)

// runBound computes the LP upper bound of every workload and seed
// (simulator.Bound) and prints it beside the published FGD and the policies
// whose runs are in out/runs (with this tune and tie order): the ceiling of
// the allocation at the end of the arrival, and the share of the gap between
// the published FGD and the bound that each policy closes.
func runBound(traceDir string, workloads []string, policies []simulator.Policy, seeds []int64, tune float64, out string, parallel int, tieOrder string) error {
	pub, err := simulator.LoadPublished(filepath.Join(traceDir, simulator.PublishedFile))
	if err != nil {
		fmt.Fprintf(os.Stderr, "note: no published results to compare with (%v)\n", err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	type job struct {
		w    string
		seed int64
	}
	traces := map[string]*simulator.Trace{}
	var jobs []job
	for _, w := range workloads {
		t, err := simulator.Load(traceDir, w)
		if err != nil {
			return err
		}
		traces[w] = t
		for _, s := range seeds {
			jobs = append(jobs, job{w, s})
		}
	}
	start := time.Now()
	results := make([]*simulator.BoundResult, len(jobs))
	errs := make([]error, len(jobs))
	next := make(chan int)
	var wg sync.WaitGroup
	for i := 0; i < max(1, parallel); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				j := jobs[i]
				a, err := simulator.NewArrival(traces[j.w], j.seed, tune)
				if err == nil {
					results[i], err = simulator.Bound(a, j.w, j.seed, tune)
				}
				errs[i] = err
				if err == nil {
					r := results[i]
					fmt.Fprintf(os.Stderr, "%-12s seed %d: bound %.2f%% (%d classes × %d node types, %d rows, relaxed %g), %.1fs\n",
						j.w, j.seed, r.Percent(), r.Classes, r.NodeTypes, r.Rows, r.Relaxed, r.Wall.Seconds())
				}
			}
		}()
	}
	for i := range jobs {
		next <- i
	}
	close(next)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}

	f, err := os.Create(filepath.Join(out, "bound.csv"))
	if err != nil {
		return err
	}
	cw := csv.NewWriter(f)
	cw.Write([]string{"workload", "seed", "tune", "bound_pct", "bound_milli", "capacity_milli", "requested_milli", "classes", "node_types", "vars", "rows", "relaxed", "simplex_milli", "seconds"})
	for _, r := range results {
		cw.Write([]string{r.Workload, fmt.Sprint(r.Seed), fmt.Sprint(r.Tune), fmt.Sprintf("%.4f", r.Percent()), fmt.Sprintf("%.1f", r.Milli),
			fmt.Sprint(r.Capacity), fmt.Sprint(r.Requested), fmt.Sprint(r.Classes), fmt.Sprint(r.NodeTypes), fmt.Sprint(r.Vars), fmt.Sprint(r.Rows),
			fmt.Sprint(r.Relaxed), fmt.Sprintf("%.1f", r.Primal), fmt.Sprintf("%.2f", r.Wall.Seconds())})
	}
	cw.Flush()
	if err := f.Close(); err != nil {
		return err
	}

	// The table: per workload, the bound's mean over the seeds, the
	// published FGD's, and each policy's from its saved runs, at the
	// arrival's last column (the tune). The means are over each one's own
	// seeds: pass the seeds the runs have.
	col := int(math.Round(100 * tune))
	if col >= simulator.Columns {
		col = simulator.Columns - 1
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| workload | seeds | bound @%d (min–max) | published FGD @%d |", col, col)
	for _, p := range policies {
		fmt.Fprintf(&b, " %s | gap closed |", p)
	}
	b.WriteString("\n|---|---|---|---|")
	for range policies {
		b.WriteString("---|---|")
	}
	b.WriteString("\n")
	for _, w := range workloads {
		var vals []float64
		for _, r := range results {
			if r.Workload == w {
				vals = append(vals, r.Percent())
			}
		}
		st := simulator.MeanSD(vals)
		lo, hi := vals[0], vals[0]
		for _, v := range vals {
			lo, hi = min(lo, v), max(hi, v)
		}
		fgd := -1.0
		if c := publishedSeeds(pub, w, seeds); len(c) > 0 && tune == 1.3 {
			fgd = simulator.At(c, col).Mean
		}
		fmt.Fprintf(&b, "| %s | %d | %.2f (%.2f–%.2f) | %s |", w, len(vals), st.Mean, lo, hi, pct(fgd))
		for _, p := range policies {
			var curves []simulator.Curve
			for _, s := range seeds {
				if r, err := load(simulator.RunFile(out, w, p, s, tune, tieOrder)); err == nil {
					curves = append(curves, r.Curve)
				}
			}
			if len(curves) == 0 {
				b.WriteString(" – | – |")
				continue
			}
			m := simulator.At(curves, col).Mean
			closed := "–"
			if fgd >= 0 && st.Mean > fgd && !math.IsNaN(m) {
				closed = fmt.Sprintf("%+.1f%%", 100*(m-fgd)/(st.Mean-fgd))
			}
			fmt.Fprintf(&b, " %.2f (%d seeds) | %s |", m, len(curves), closed)
		}
		b.WriteString("\n")
	}
	fmt.Print(b.String())
	if err := os.WriteFile(filepath.Join(out, "bound.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	fmt.Fprintf(os.Stderr, "%d bounds in %s; peak RSS %d MiB; wrote %s/{bound.csv,bound.md}\n",
		len(results), time.Since(start).Round(time.Second), ru.Maxrss/1024, out)
	return nil
}

// publishedSeeds is the published FGD curves of the given seeds: the file
// lists seeds 42–51 in order, at tune 1.3 only (other tunes have none).
func publishedSeeds(pub simulator.Published, w string, seeds []int64) []simulator.Curve {
	all := pub[w]["FGD"]
	var out []simulator.Curve
	for _, s := range seeds {
		if i := int(s - 42); i >= 0 && i < len(all) {
			out = append(out, all[i])
		}
	}
	return out
}

func pct(v float64) string {
	if v < 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", v)
}
