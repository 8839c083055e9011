"""The saved runs of gpu-sim (OUT/runs/*.json), shared by the openb scripts."""
import glob, json, os, sys

# simulator.ResultFormat: runs of another format are refused, not mixed.
FORMAT = 5


def load_runs(out):
    """Every run in OUT, once each: a run of another format, or the same
    workload, policy and seed twice (another tie order or tune), is an error."""
    seen = {}  # (workload, policy, seed) -> file
    runs = []
    for f in sorted(glob.glob(os.path.join(out, "runs", "*.json"))):
        d = json.load(open(f))
        if d.get("Format") != FORMAT:
            sys.exit(f"{f}: made by another version of gpu-sim (format {d.get('Format')}, want {FORMAT}): run it again")
        key = (d["Workload"], d["Policy"], d["Seed"])
        if key in seen:
            sys.exit(f"{f} and {seen[key]}: the same run twice (another tie order or tune?): keep one per directory")
        seen[key] = f
        runs.append(d)
    return runs
