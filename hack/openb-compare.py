#!/usr/bin/env python3
"""Compare gpu-sim runs (OUT/runs/*.json) with the published FGD figures on
the same seeds: mean allocation at 130% arrival, per workload and policy.

usage: hack/openb-compare.py [--wide|--exact] [--policies=P,...] [OUT] [TRACE_DIR]
  --wide: one row per workload, the policies side by side (Δ to 3 decimals)
  --exact: per workload and policy, the seeds whose whole curve (columns
           0-130) equals the published FGD row of the same seed to 2
           decimals, and for the others the first column that differs
  --policies: only these policies
"""
import collections, csv, glob, gzip, json, os, statistics, sys

from openb_runs import load_runs

args = [a for a in sys.argv[1:] if not a.startswith("--")]
wide = "--wide" in sys.argv[1:]
exact = "--exact" in sys.argv[1:]
only = next((a.split("=", 1)[1].split(",") for a in sys.argv[1:] if a.startswith("--policies=")), None)
out = args[0] if len(args) > 0 else "out/openb"
trace = args[1] if len(args) > 1 else "data/openb"


def open_trace(path):
    """The file, or its gzip-compressed copy (as gpu-sim reads them)."""
    if os.path.exists(path):
        return open(path)
    return gzip.open(path + ".gz", "rt")


pub = collections.defaultdict(dict)  # workload -> seed -> value at 130
rows = collections.defaultdict(dict)  # workload -> seed -> columns 0-130
for r in csv.DictReader(open_trace(os.path.join(trace, "fgd_expected_alloc.csv"))):
    if r["sc_policy"].endswith("FGD") and r["130"]:
        w = r["workload"].removeprefix("openb_pod_list_")
        pub[w][int(r["seed"])] = float(r["130"])
        rows[w][int(r["seed"])] = [float(r[str(k)]) if r[str(k)] else float("nan") for k in range(131)]

ours = collections.defaultdict(dict)  # (workload, policy) -> seed -> (value, wall s)
curves = collections.defaultdict(dict)  # (workload, policy) -> seed -> columns
for d in load_runs(out):
    if only and d["Policy"] not in only:
        continue
    ours[(d["Workload"], d["Policy"])][d["Seed"]] = (d["Curve"][130], d["Wall"] / 1e9)
    curves[(d["Workload"], d["Policy"])][d["Seed"]] = [float("nan") if v is None else v for v in d["Curve"]]


def first_difference(mine, theirs):
    """The first column where the curves differ (or None)."""
    for k, (a, b) in enumerate(zip(mine, theirs)):
        if (a != a) != (b != b) or (a == a and abs(a - b) > 0.005):
            return k
    return None


if exact:
    print("| workload | policy | seeds equal at every column | the others: seed (first column that differs, Δ at 130) |")
    print("|---|---|---|---|")
    total = same = 0
    for (w, p), cs in sorted(curves.items()):
        equal, other = [], []
        for seed in sorted(cs):
            if seed not in rows[w]:
                continue
            k = first_difference(cs[seed], rows[w][seed])
            if k is None:
                equal.append(seed)
            else:
                other.append(f"{seed} ({k}, {cs[seed][130] - rows[w][seed][130]:+.2f})")
        total += len(equal) + len(other)
        same += len(equal)
        print(f"| {w} | {p} | {len(equal)} of {len(equal) + len(other)} | {', '.join(other)} |")
    print(f"\n{same} of {total} runs equal the published row at every column")
    sys.exit(0)


def row(w, runs):
    seeds = sorted(runs)
    mine = statistics.mean(runs[s][0] for s in seeds)
    sd = statistics.stdev(runs[s][0] for s in seeds) if len(seeds) > 1 else 0.0
    same = [pub[w][s] for s in seeds if s in pub[w]]
    ref = statistics.mean(same) if len(same) == len(seeds) else float("nan")
    return seeds, mine, sd, ref


if wide:
    policies = sorted({p for _, p in ours}, key=lambda p: (p != "fgd", p != "learned", p))
    head = "| workload | " + " | ".join(f"{p}: seeds | {p} mean (sd) | published FGD, same seeds | Δ" for p in policies) + " | published FGD, 10 seeds |"
    print(head)
    print("|---" * (1 + 4 * len(policies) + 1) + "|")
    for w in sorted({w for w, _ in ours}):
        cells = []
        for p in policies:
            if (w, p) not in ours:
                cells.append(" | | | ")
                continue
            seeds, mine, sd, ref = row(w, ours[(w, p)])
            cells.append(f"{len(seeds)} | {mine:.2f} ({sd:.2f}) | {ref:.2f} | {mine - ref:+.3f}")
        all10 = statistics.mean(pub[w].values()) if pub[w] else float("nan")
        print(f"| {w} | " + " | ".join(cells) + f" | {all10:.2f} |")
    sys.exit(0)

print("| workload | policy | seeds | ours @130 | published FGD @130, same seeds | Δ | published FGD @130, 10 seeds | mean wall s |")
print("|---|---|---|---|---|---|---|---|")
for (w, p), runs in sorted(ours.items()):
    seeds, mine, _, ref = row(w, runs)
    all10 = statistics.mean(pub[w].values()) if pub[w] else float("nan")
    wall = statistics.mean(runs[s][1] for s in seeds)
    print(f"| {w} | {p} | {len(seeds)} | {mine:.2f} | {ref:.2f} | {mine - ref:+.2f} | {all10:.2f} | {wall:.0f} |")
