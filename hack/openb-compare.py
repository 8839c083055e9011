#!/usr/bin/env python3
"""Compare gpu-sim runs (OUT/runs/*.json) with the published FGD figures on
the same seeds: mean allocation at 130% arrival, per workload and policy.

usage: hack/openb-compare.py [--wide] [--policies=P,...] [OUT] [TRACE_DIR]
  --wide: one row per workload, the policies side by side (Δ to 3 decimals)
  --policies: only these policies
"""
import collections, csv, glob, gzip, json, os, statistics, sys

args = [a for a in sys.argv[1:] if not a.startswith("--")]
wide = "--wide" in sys.argv[1:]
only = next((a.split("=", 1)[1].split(",") for a in sys.argv[1:] if a.startswith("--policies=")), None)
out = args[0] if len(args) > 0 else "out/openb"
trace = args[1] if len(args) > 1 else "data/openb"


def open_trace(path):
    """The file, or its gzip-compressed copy (as gpu-sim reads them)."""
    if os.path.exists(path):
        return open(path)
    return gzip.open(path + ".gz", "rt")


pub = collections.defaultdict(dict)  # workload -> seed -> value at 130
for r in csv.DictReader(open_trace(os.path.join(trace, "fgd_expected_alloc.csv"))):
    if r["sc_policy"].endswith("FGD") and r["130"]:
        pub[r["workload"].removeprefix("openb_pod_list_")][int(r["seed"])] = float(r["130"])

ours = collections.defaultdict(dict)  # (workload, policy) -> seed -> (value, wall s)
for f in glob.glob(os.path.join(out, "runs", "*.json")):
    d = json.load(open(f))
    if only and d["Policy"] not in only:
        continue
    ours[(d["Workload"], d["Policy"])][d["Seed"]] = (d["Curve"][130], d["Wall"] / 1e9)


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
