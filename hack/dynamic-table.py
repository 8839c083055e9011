#!/usr/bin/env python3
"""The replay with departures (gpu-sim --mode dynamic) over many seeds: per
workload and policy, the means over the seeds of the p99 wait, the mean wait,
the GPU pods that waited and the fragmentation-induced waits; then, paired by
seed, policy A − each other policy with a 95% confidence interval (Student's t),
and on how many seeds A had the lowest p99 and the fewest fragmentation-induced
waits of the policies run on that seed (its own ablations, named A-…, left out).

usage: hack/dynamic-table.py DIR|FILE.jsonl [...] [--a learned] [--save FILE.jsonl]
Every dynamic.json under the directories is read (one JSON object per run), and
every .jsonl file given. --save merges the runs read into FILE.jsonl (one line
per workload, policy, --flush and seed; a run read later replaces one read earlier) and
prints nothing else: docs/data/dynamic-runs.jsonl keeps every run the docs cite,
since out/ does not outlive a machine and the replay is deterministic, so runs
made in different sessions pool.
"""
import collections, json, os, statistics, sys

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
args = sys.argv[1:]
a = "learned"
if "--a" in args:
    i = args.index("--a"); a = args[i + 1]; del args[i:i + 2]
save = None
if "--save" in args:
    i = args.index("--save"); save = args[i + 1]; del args[i:i + 2]

def files(top):
    if os.path.isfile(top):
        yield top
        return
    if not os.path.isdir(top):
        sys.exit(f"{top}: no such file or directory")
    for root, _, names in os.walk(top):
        if "dynamic.json" in names:
            yield os.path.join(root, "dynamic.json")

def key(r):
    return (r["workload"], r["policy"], r.get("flushSeconds", 0), r["seed"])

read = {}
for top in args:
    for path in files(top):
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    read[key(r)] = r

if save:
    merged = {}
    if os.path.exists(save):
        with open(save) as f:
            merged = {key(r): r for r in map(json.loads, filter(str.strip, f))}
    merged.update(read)
    with open(save, "w") as f:
        for k in sorted(merged):
            f.write(json.dumps(merged[k], sort_keys=True) + "\n")
    print(f"{save}: {len(merged)} runs ({len(read)} read)", file=sys.stderr)
    sys.exit(0)

runs = collections.defaultdict(dict)  # (workload, policy) -> seed -> run
for r in read.values():
    p = r["policy"]
    if r.get("flushSeconds"):  # --flush runs apart from the others
        p += f" --flush {r['flushSeconds']:g}s"
    runs[(r["workload"], p)][r["seed"]] = r

def ci(d):
    m = statistics.mean(d)
    if len(d) < 2:
        return m, float("nan")
    return m, T95.get(len(d) - 1, 1.96) * statistics.stdev(d) / len(d) ** 0.5

def fmt_ci(d, f="{:+.1f}"):
    m, h = ci(d)
    if h != h:
        return f.format(m) + " (1 seed)"
    return f"{f.format(m)} [{f.format(m - h)}, {f.format(m + h)}]"

def pct(r):
    return 100 * r["fragWaited"] / r["gpuPods"]

print("| workload | policy | seeds | GPU alloc, mean (peak) | wait p99 | mean wait | GPU pods that waited | fragmentation-induced (% of GPU pods) | never placed | attempts | wall per run |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
workloads = sorted({w for w, _ in runs})
for w in workloads:
    pols = sorted((p for ww, p in runs if ww == w), key=lambda p: (p != a, p))
    for p in pols:
        rs = list(runs[(w, p)].values())
        m = lambda k: statistics.mean(r[k] for r in rs)
        print(f"| {w} | {p} | {len(rs)} | {100*m('timeAvgAlloc'):.2f}% ({100*m('peakAlloc'):.1f}%) | {m('waitP99'):.1f} s | {m('waitMean'):.2f} s | "
              f"{m('waited'):.1f} | {m('fragWaited'):.1f} ({statistics.mean(pct(r) for r in rs):.2f}%) | {m('neverPlaced'):.1f} | {m('attempts'):.0f} | {m('wallNanos')/1e9:.0f} s |")

print()
print(f"| workload | {a} − policy | paired seeds | p99 wait, s (95% CI) | GPU pods that waited (95% CI) | fragmentation-induced waits (95% CI) | seeds where {a}'s p99 is lowest / its fragmentation-induced waits fewest, of all policies run |")
print("|---|---|---|---|---|---|---|")
for w in workloads:
    ra = runs.get((w, a), {})
    others = sorted(p for ww, p in runs if ww == w and p != a)
    for p in others:
        rb = runs[(w, p)]
        seeds = sorted(set(ra) & set(rb))
        if not seeds:
            continue
        best = []
        for s in seeds:
            # Ablations of A (A-…) are not rivals.
            on = {q: runs[(w, q)][s] for ww, q in runs if ww == w and s in runs[(w, q)] and not q.startswith(a + "-")}
            if len(on) < 2:
                continue
            best.append((all(ra[s]["waitP99"] <= r["waitP99"] for r in on.values()),
                         all(ra[s]["fragWaited"] <= r["fragWaited"] for r in on.values())))
        print(f"| {w} | {a} − {p} | {len(seeds)} | {fmt_ci([ra[s]['waitP99'] - rb[s]['waitP99'] for s in seeds])} | "
              f"{fmt_ci([ra[s]['waited'] - rb[s]['waited'] for s in seeds])} | {fmt_ci([ra[s]['fragWaited'] - rb[s]['fragWaited'] for s in seeds])} | " +
              (f"{sum(b[0] for b in best)} / {sum(b[1] for b in best)} of {len(best)} |" if best else "no rival run |"))
