#!/usr/bin/env python3
"""Paired comparison of two gpu-sim policies on the same seeds (OUT/runs/*.json):
per workload, the mean of (A - B) at AT% arrival (default 130) over the seeds
both ran, with a 95% confidence interval (Student's t), and the mean over
workloads.

usage: hack/openb-paired.py A B [OUT [AT]]    e.g. hack/openb-paired.py learned fgd-pure out/openb-pure 100

A or B may be `published`: the published FGD row of each seed
(data/openb/fgd_expected_alloc.csv, or OPENB_TRACE's), which `fgd-pure
--tie-order reference` equals at every column on all 170 runs (measured twice,
docs/benchmarks.md §4; `TestFGDPureReproducesPublished` checks one), so a grid
of one policy pairs with FGD without running fgd-pure again.
"""
import collections, csv, gzip, os, statistics, sys

from openb_runs import load_runs

# Two-sided 95% quantiles of Student's t, by degrees of freedom.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120}

a, b = sys.argv[1], sys.argv[2]
out = sys.argv[3] if len(sys.argv) > 3 else "out/openb"
at = int(sys.argv[4]) if len(sys.argv) > 4 else 130
runs = collections.defaultdict(dict)  # (workload, policy) -> seed -> value at 130
for d in load_runs(out):
    runs[(d["Workload"], d["Policy"])][d["Seed"]] = d["Curve"][at]

if "published" in (a, b):
    trace = os.environ.get("OPENB_TRACE", "data/openb")
    path = os.path.join(trace, "fgd_expected_alloc.csv")
    with (open(path) if os.path.exists(path) else gzip.open(path + ".gz", "rt")) as f:
        for r in csv.DictReader(f):
            if str(at) not in r:
                sys.exit(f"{path}: no column {at}")
            if r["sc_policy"].endswith("FGD") and float(r["tune"]) == 1.3 and r[str(at)]:
                runs[(r["workload"].removeprefix("openb_pod_list_"), "published")][int(r["seed"])] = float(r[str(at)])

print(f"| workload | seeds | {a} | {b} | {a} − {b} | 95% CI |")
print("|---|---|---|---|---|---|")
means = []
for w in sorted({w for w, _ in runs}):
    ra, rb = runs.get((w, a), {}), runs.get((w, b), {})
    seeds = sorted(set(ra) & set(rb))
    if not seeds:
        continue
    d = [ra[s] - rb[s] for s in seeds]
    m = statistics.mean(d)
    half = T95.get(len(d) - 1, 1.96) * statistics.stdev(d) / len(d) ** 0.5 if len(d) > 1 else float("nan")
    means.append(m)
    print(f"| {w} | {len(seeds)} | {statistics.mean(ra[s] for s in seeds):.2f} | {statistics.mean(rb[s] for s in seeds):.2f} | "
          f"{m:+.3f} | [{m - half:+.3f}, {m + half:+.3f}] |")
if means:
    print(f"| **mean over {len(means)}** | | | | **{statistics.mean(means):+.3f}** | |")
