#!/usr/bin/env python3
"""Learned against the oracle target on synthetic traces (gpu-sim --mode generate):
per fleet directory and workload, policy A − B (default learned − fgd) paired by
seed at 100% and 130% arrival with a 95% confidence interval (Student's t), and
the warm-up curve: the mean difference at 10, 25, 50 and 75% arrival.

usage: hack/synth-table.py OUT/FLEET [OUT/FLEET...] [--a learned] [--b fgd]
"""
import collections, statistics, sys, os

from openb_runs import load_runs

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
args = sys.argv[1:]
a, b = "learned", "fgd"
if "--a" in args:
    i = args.index("--a"); a = args[i + 1]; del args[i:i + 2]
if "--b" in args:
    i = args.index("--b"); b = args[i + 1]; del args[i:i + 2]

def ci(d):
    m = statistics.mean(d)
    if len(d) < 2:
        return m, float("nan")
    return m, T95.get(len(d) - 1, 1.96) * statistics.stdev(d) / len(d) ** 0.5

print(f"| fleet | workload | seeds | {b} @100 | {a} − {b} @100 (95% CI) | {b} @130 | {a} − {b} @130 (95% CI) | warm-up: {a} − {b} @10 / 25 / 50 / 75 |")
print("|---|---|---|---|---|---|---|---|")
for out in args:
    fleet = os.path.basename(out.rstrip("/"))
    runs = collections.defaultdict(dict)
    for d in load_runs(out):
        runs[(d["Workload"], d["Policy"])][d["Seed"]] = d["Curve"]
    for w in sorted({w for w, _ in runs}):
        ra, rb = runs.get((w, a), {}), runs.get((w, b), {})
        seeds = sorted(s for s in set(ra) & set(rb)
                       if all(c[k] is not None for c in (ra[s], rb[s]) for k in (10, 25, 50, 75, 100, 130)))
        if not seeds:
            continue
        cells = []
        for k in (100, 130):
            m, h = ci([ra[s][k] - rb[s][k] for s in seeds])
            cells.append(f"{statistics.mean(rb[s][k] for s in seeds):.2f} | {m:+.3f} [{m - h:+.3f}, {m + h:+.3f}]")
        warm = " / ".join(f"{statistics.mean(ra[s][k] - rb[s][k] for s in seeds):+.2f}" for k in (10, 25, 50, 75))
        print(f"| {fleet} | {w} | {len(seeds)} | {cells[0]} | {cells[1]} | {warm} |")
