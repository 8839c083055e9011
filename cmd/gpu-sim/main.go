// Command gpu-sim replays the openb GPU cluster trace on the real
// scheduling framework, with the production plugins and the shipped profile,
// following the published FGD method, and compares placement policies.
package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/simulator"
)

func usage() {
	fmt.Fprintf(os.Stderr, `gpu-sim replays a GPU cluster trace (openb format) on the scheduling framework,
with the same profile and plugins as gpu-scheduler, following the published FGD
method: shuffle, tune the arrivals to --tune x GPU capacity, one pod at a time,
no departures, failed pods dropped. It reports the milli-GPU allocation ratio
against the arrived GPU request, next to the published FGD results.

Usage:
  gpu-sim --trace-dir DIR --workload NAME[,NAME...] --policy P[,P...] --seeds 42-51 --tune 1.3 --out DIR [--parallel N] [--json]

Workloads: names of openb_pod_list_<name>.csv files, "grid" for the 17 of the
paper's experiment grid, or "all".

Policies:
`)
	for _, p := range simulator.Policies {
		fmt.Fprintf(os.Stderr, "  %-8s %s\n", p, simulator.PolicyHelp[p])
	}
	fmt.Fprintf(os.Stderr, "\nFlags:\n")
	flag.PrintDefaults()
}

func main() {
	defaultDir := ""
	if st, err := os.Stat(simulator.DefaultTraceDir); err == nil && st.IsDir() {
		defaultDir = simulator.DefaultTraceDir
	}
	traceDir := flag.String("trace-dir", defaultDir, "trace directory (default "+simulator.DefaultTraceDir+" when it exists)")
	workloads := flag.String("workload", "default", "workloads, comma-separated, or grid or all")
	policies := flag.String("policy", "learned,fgd,bestfit,packing,spread,vanilla", "policies, comma-separated (the ablations fgd-* are extra)")
	seeds := flag.String("seeds", "42-51", "seeds: a range A-B or a list")
	tune := flag.Float64("tune", 1.3, "arrivals are tuned to this multiple of the GPU capacity")
	out := flag.String("out", "out/openb", "output directory")
	parallel := flag.Int("parallel", 1, "experiments run at once")
	asJSON := flag.Bool("json", false, "print one JSON object per workload and policy")
	resume := flag.Bool("resume", true, "reuse results of runs already in --out/runs")
	limit := flag.Int("limit", 0, "stop each replay after so many pods (profiling)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile")
	memProfile := flag.String("memprofile", "", "write a heap profile at the end")
	zoom := flag.Int("zoom", 80, "plot arrivals from this percent (0: all)")
	tieOrder := flag.String("tie-order", simulator.TieHash, "last tie-break: hash (the shipped stable node order) or reference (the published simulator's: smallest renamed node first)")
	mode := flag.String("mode", "static", "static (the published method: arrivals only), dynamic (arrivals at creation_time, departures after the trace's run time, waiting pods in the scheduling queue), generate (write synthetic traces of --fleet, one per --workload mix ("+simulator.MixNames()+"), to --out, in openb's format), or bound (an LP upper bound on the allocation per workload and seed, beside the published FGD and the --policy runs saved in --out)")
	span := flag.Duration("arrival-span", 30*time.Minute, "dynamic: the trace's arrival times are compressed linearly into this simulated span")
	flush := flag.Duration("flush", 0, "dynamic: the queue's flush of its unschedulable pool (podMaxInUnschedulablePodsDuration, 5m in the scheduler) on the simulated clock; 0: off, so that a pod a queueing hint wrongly skips waits for ever")
	fleet := flag.String("fleet", "", "generate: the synthetic fleet ("+simulator.FleetNames()+"); --workload names the mixes (default: all), --out the directory (default out/synth/FLEET)")
	synthNodes := flag.Int("nodes", 400, "generate: nodes in the fleet")
	synthPods := flag.Int("pods", 4000, "generate: pods per workload (the replay tunes them to --tune x capacity)")
	synthSeed := flag.Int64("synth-seed", 1, "generate: the trace's seed")
	placements := flag.Bool("placements", false, "write each run's placements to --out/placements/<workload>-<policy>-seed<N>.csv (pod,node,devices,milli_per_device,cpu_milli,memory_mib,gpu_spec,arrival_index)")
	flag.Usage = usage
	klog.InitFlags(nil)
	flag.Set("v", "0")
	flag.Parse()
	var err error
	switch *mode {
	case "static":
		err = run(*traceDir, *workloads, *policies, *seeds, *tune, *out, *parallel, *asJSON, *resume, *limit, *cpuProfile, *memProfile, *zoom, *placements, *tieOrder, false)
	case "generate":
		mixes, dir := *workloads, *out
		outSet := false
		flag.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "workload":
				if mixes == "default" {
					mixes = ""
				}
			case "out":
				outSet = true
			}
		})
		if mixes == "default" {
			mixes = strings.ReplaceAll(simulator.MixNames(), ", ", ",") // every mix
		}
		if !outSet {
			dir = filepath.Join("out", "synth", *fleet)
		}
		if *fleet == "" {
			err = fmt.Errorf("--mode generate needs --fleet (%s)", simulator.FleetNames())
			break
		}
		err = generate(*fleet, mixes, *synthNodes, *synthPods, *synthSeed, dir)
	case "bound":
		err = run(*traceDir, *workloads, *policies, *seeds, *tune, *out, *parallel, *asJSON, *resume, *limit, *cpuProfile, *memProfile, *zoom, *placements, *tieOrder, true)
	case "dynamic":
		if *cpuProfile != "" {
			f, ferr := os.Create(*cpuProfile)
			if ferr != nil {
				err = ferr
				break
			}
			pprof.StartCPUProfile(f)
			defer pprof.StopCPUProfile()
		}
		err = runDynamic(*traceDir, *workloads, *policies, *seeds, *tune, *span, *flush, *out, *limit, *tieOrder)
	default:
		err = fmt.Errorf("--mode %q: want static, dynamic, generate or bound", *mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpu-sim:", err)
		os.Exit(1)
	}
}

func parseSeeds(s string) ([]int64, error) {
	var out []int64
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if a, b, ok := strings.Cut(part, "-"); ok {
			lo, err1 := strconv.ParseInt(a, 10, 64)
			hi, err2 := strconv.ParseInt(b, 10, 64)
			if err1 != nil || err2 != nil || hi < lo {
				return nil, fmt.Errorf("bad seed range %q", part)
			}
			for v := lo; v <= hi; v++ {
				out = append(out, v)
			}
			continue
		}
		v, err := strconv.ParseInt(part, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("bad seed %q", part)
		}
		out = append(out, v)
	}
	return out, nil
}

// parsePoliciesSeeds reads --policy and --seeds.
func parsePoliciesSeeds(policyList, seedList string) ([]simulator.Policy, []int64, error) {
	var policies []simulator.Policy
	for _, s := range strings.Split(policyList, ",") {
		p, err := simulator.ParsePolicy(strings.TrimSpace(s))
		if err != nil {
			return nil, nil, err
		}
		policies = append(policies, p)
	}
	seeds, err := parseSeeds(seedList)
	return policies, seeds, err
}

type job struct {
	workload string
	policy   simulator.Policy
	seed     int64
}

func run(traceDir, workloadList, policyList, seedList string, tune float64, out string, parallel int, asJSON, resume bool,
	limit int, cpuProfile, memProfile string, zoom int, placements bool, tieOrder string, bound bool) error {
	if tieOrder != simulator.TieHash && tieOrder != simulator.TieReference {
		return fmt.Errorf("--tie-order %q: want %s or %s", tieOrder, simulator.TieHash, simulator.TieReference)
	}
	if traceDir == "" {
		return fmt.Errorf("no trace directory: %s does not exist here; pass --trace-dir with the openb trace (openb_node_list_gpu_node.csv, openb_pod_list_*.csv)", simulator.DefaultTraceDir)
	}
	nf, err := simulator.Open(filepath.Join(traceDir, simulator.NodeFile))
	if err != nil {
		return fmt.Errorf("trace directory %s has no %s (or .gz)", traceDir, simulator.NodeFile)
	}
	nf.Close()
	workloads, err := resolveWorkloads(traceDir, workloadList)
	if err != nil {
		return err
	}
	policies, seeds, err := parsePoliciesSeeds(policyList, seedList)
	if err != nil {
		return err
	}
	if bound {
		return runBound(traceDir, workloads, policies, seeds, tune, out, parallel, tieOrder)
	}
	if parallel < 1 {
		parallel = 1
	}
	if err := os.MkdirAll(filepath.Join(out, "runs"), 0o755); err != nil {
		return err
	}
	if placements {
		if err := os.MkdirAll(filepath.Join(out, "placements"), 0o755); err != nil {
			return err
		}
	}
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return err
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	// Replays allocate steadily and hold little: trade memory for less GC.
	debug.SetGCPercent(400)

	traces := map[string]*simulator.Trace{}
	for _, w := range workloads {
		t, err := simulator.Load(traceDir, w)
		if err != nil {
			return err
		}
		traces[w] = t
	}
	pub, err := simulator.LoadPublished(filepath.Join(traceDir, simulator.PublishedFile))
	if err != nil {
		fmt.Fprintf(os.Stderr, "note: no published results to compare with (%v)\n", err)
	}

	var jobs []job
	for _, w := range workloads {
		for _, p := range policies {
			for _, s := range seeds {
				jobs = append(jobs, job{w, p, s})
			}
		}
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	inner := max(1, runtime.GOMAXPROCS(0)/parallel)
	var mu sync.Mutex
	var results []*simulator.Result
	var firstErr error
	todo := make(chan job)
	var wg sync.WaitGroup
	start := time.Now()
	done := 0
	for i := 0; i < parallel; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range todo {
				path := simulator.RunFile(out, j.workload, j.policy, j.seed, tune, tieOrder)
				plPath := filepath.Join(out, "placements", fmt.Sprintf("%s-%s-seed%d.csv", j.workload, j.policy, j.seed))
				r, err := load(path)
				cached := err == nil && resume && limit == 0
				if _, perr := os.Stat(plPath); placements && perr != nil {
					cached = false
				}
				if !cached {
					r, err = simulator.Run(ctx, simulator.Experiment{Trace: traces[j.workload], Policy: j.policy, Seed: j.seed,
						Tune: tune, Parallelism: inner, Limit: limit, KeepPlacements: placements, TieOrder: tieOrder})
					if err == nil && placements {
						err = writePlacements(plPath, r.Placements)
						r.Placements = nil
					}
					if err == nil && limit == 0 {
						err = save(path, r)
					}
				}
				mu.Lock()
				done++
				if err != nil {
					if firstErr == nil {
						firstErr = fmt.Errorf("%s/%s/seed %d: %w", j.workload, j.policy, j.seed, err)
					}
					cancel()
				} else {
					results = append(results, r)
					if !cached {
						fmt.Fprintf(os.Stderr, "[%d/%d %s] %-12s %-8s seed %d: @100 %.2f @130 %.2f, %d failed, %.1fs\n",
							done, len(jobs), time.Since(start).Round(time.Second), j.workload, j.policy, j.seed,
							r.Curve[100], r.Curve[130], r.Failed, r.Wall.Seconds())
					}
				}
				mu.Unlock()
			}
		}()
	}
	for _, j := range jobs {
		if ctx.Err() != nil {
			break
		}
		todo <- j
	}
	close(todo)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if memProfile != "" {
		f, err := os.Create(memProfile)
		if err == nil {
			pprof.WriteHeapProfile(f)
			f.Close()
		}
	}
	sort.SliceStable(results, func(i, k int) bool { return results[i].Seed < results[k].Seed })

	sums := simulator.Summarize(results, pub)
	if err := simulator.WriteCurves(filepath.Join(out, "curves.csv"), results, tune); err != nil {
		return err
	}
	if err := simulator.WriteMarkdown(filepath.Join(out, "summary.md"), sums); err != nil {
		return err
	}
	for _, w := range workloads {
		byPolicy := map[simulator.Policy][]simulator.Curve{}
		for _, r := range results {
			if r.Workload == w {
				byPolicy[r.Policy] = append(byPolicy[r.Policy], r.Curve)
			}
		}
		if err := simulator.PlotCurves(filepath.Join(out, "curves-"+w+".png"), w, byPolicy, pub[w]["FGD"], zoom); err != nil {
			return err
		}
	}
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		for _, s := range sums {
			enc.Encode(s)
		}
		simulator.WriteTable(os.Stderr, sums)
	} else {
		simulator.WriteTable(os.Stdout, sums)
	}
	fmt.Fprintf(os.Stderr, "%d runs in %s; peak RSS %d MiB; wrote %s/{curves.csv,summary.md,curves-*.png}\n",
		len(results), time.Since(start).Round(time.Second), ru.Maxrss/1024, out)
	return nil
}

// generate writes synthetic traces: the fleet's node file and one pod file
// per mix, in out, for --trace-dir.
func generate(fleet, mixes string, nodes, pods int, seed int64, out string) error {
	for _, m := range strings.Split(mixes, ",") {
		t, err := simulator.Synthesize(fleet, m, nodes, pods, seed)
		if err != nil {
			return err
		}
		if err := simulator.WriteTrace(out, t); err != nil {
			return err
		}
		var gpus int
		for _, n := range t.Nodes {
			gpus += n.GPUs
		}
		fmt.Fprintf(os.Stderr, "%s/%s: %d nodes, %d GPUs, %d pods → %s\n", fleet, m, len(t.Nodes), gpus, len(t.Pods), out)
	}
	return nil
}

// resolveWorkloads reads --workload: names, grid or all.
func resolveWorkloads(traceDir, list string) ([]string, error) {
	switch list {
	case "grid":
		return simulator.PaperGrid, nil
	case "all":
		return simulator.Workloads(traceDir)
	}
	return strings.Split(list, ","), nil
}

func load(path string) (*simulator.Result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r simulator.Result
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	if r.Format != simulator.ResultFormat {
		return nil, fmt.Errorf("%s: made by another version of the replay (format %d, now %d)", path, r.Format, simulator.ResultFormat)
	}
	return &r, nil
}

func save(path string, r *simulator.Result) error {
	// The events are kept so that a curve can be computed again, by
	// anyone, from the run itself.
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// writePlacements writes a run's placement log.
func writePlacements(path string, ps []simulator.Placement) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	w.Write(simulator.PlacementHeader)
	for i := range ps {
		w.Write(ps[i].Record())
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
