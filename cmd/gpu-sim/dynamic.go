package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/simulator"
)

// runDynamic replays each workload with departures (simulator.RunDynamic),
// one run at a time (each uses every core for its filters), and prints per
// workload and policy the means over the seeds.
func runDynamic(traceDir, workloadList, policyList, seedList string, tune float64, span, flush time.Duration, out string, limit int, tieOrder string) error {
	if traceDir == "" {
		return fmt.Errorf("no trace directory: %s does not exist here; pass --trace-dir", simulator.DefaultTraceDir)
	}
	workloads := strings.Split(workloadList, ",")
	if workloadList == "grid" {
		workloads = simulator.PaperGrid
	}
	policies, seeds, err := parsePoliciesSeeds(policyList, seedList)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	jf, err := os.Create(filepath.Join(out, "dynamic.json"))
	if err != nil {
		return err
	}
	defer jf.Close()
	enc := json.NewEncoder(jf)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "workload\tpolicy\tseeds\talloc (time avg)\tpeak\twait p50\tp95\tp99\tmean\twaited\tfrag-waited\tnever placed\tattempts\twall/run\n")
	start := time.Now()
	for _, w := range workloads {
		t, err := simulator.Load(traceDir, w)
		if err != nil {
			return err
		}
		first := map[simulator.Policy]*simulator.DynamicResult{}
		for _, p := range policies {
			var rs []*simulator.DynamicResult
			for _, seed := range seeds {
				r, err := simulator.RunDynamic(ctx, simulator.DynamicExperiment{Trace: t, Policy: p, Seed: seed, Tune: tune,
					ArrivalSpan: span, Flush: flush, Limit: limit, TieOrder: tieOrder})
				if err != nil {
					return fmt.Errorf("%s/%s/seed %d: %w", w, p, seed, err)
				}
				flushed := ""
				if flush > 0 {
					flushed = fmt.Sprintf(", %d placed by the flush", r.FlushPlaced)
				}
				fmt.Fprintf(os.Stderr, "[%s] %-10s %-8s seed %d: alloc %.3f, wait p99 %.1fs, %d waited (%d fragmented), %d attempts%s, %.0fs\n",
					time.Since(start).Round(time.Second), w, p, seed, r.TimeAvgAlloc, r.WaitP99, r.Waited, r.FragWaited, r.Attempts, flushed, r.Wall.Seconds())
				if err := enc.Encode(r); err != nil {
					return err
				}
				if first[p] == nil {
					first[p] = r
				} else {
					r.Samples = nil
				}
				rs = append(rs, r)
			}
			mean := func(f func(*simulator.DynamicResult) float64) float64 {
				var s float64
				for _, r := range rs {
					s += f(r)
				}
				return s / float64(len(rs))
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.2f%%\t%.2f%%\t%.1fs\t%.1fs\t%.1fs\t%.2fs\t%.1f\t%.2f%%\t%.1f\t%.0f\t%.0fs\n", w, p, len(rs),
				100*mean(func(r *simulator.DynamicResult) float64 { return r.TimeAvgAlloc }),
				100*mean(func(r *simulator.DynamicResult) float64 { return r.PeakAlloc }),
				mean(func(r *simulator.DynamicResult) float64 { return r.WaitP50 }),
				mean(func(r *simulator.DynamicResult) float64 { return r.WaitP95 }),
				mean(func(r *simulator.DynamicResult) float64 { return r.WaitP99 }),
				mean(func(r *simulator.DynamicResult) float64 { return r.WaitMean }),
				mean(func(r *simulator.DynamicResult) float64 { return float64(r.Waited) }),
				100*mean(func(r *simulator.DynamicResult) float64 { return r.FragWaitedFraction() }),
				mean(func(r *simulator.DynamicResult) float64 { return float64(r.NeverPlaced) }),
				mean(func(r *simulator.DynamicResult) float64 { return float64(r.Attempts) }),
				mean(func(r *simulator.DynamicResult) float64 { return r.Wall.Seconds() }))
		}
		if err := simulator.PlotDynamic(filepath.Join(out, "dynamic-"+w+".png"), w, first, 1.5*span.Seconds()); err != nil {
			return err
		}
	}
	tw.Flush()
	fmt.Fprintf(os.Stderr, "wrote %s/{dynamic.json,dynamic-*.png} in %s\n", out, time.Since(start).Round(time.Second))
	return nil
}
