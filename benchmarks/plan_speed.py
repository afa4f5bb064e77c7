"""How long `hpcrl plan` takes for every shipped config on every shipped cluster, up to its node limit.

Each (config, cluster, nodes) is planned in this process as `hpcrl plan` plans it
(hpcrl.jobs.run_script.plan), after one warm-up plan, so the figures are the planner's and not the
interpreter's start-up (benchmarks/cli_startup.py measures that). The table gives the CPU seconds
of the best of --repeat runs and their ratio to the 16-node plan of the same config on the same
cluster (issue 27: "plan below 1 s ... 72B on one node as quick as a 16-node plan"). CPU time, not
wall time: the machine is shared, and a single-threaded plan's wall time with the CPU to itself is
its CPU time. A refused plan (no layout fits, a script check) is timed too: the refusal, with its
suggested fixes, is what the user waits for.

Node counts: 1, 2, 4, ... up to the cluster's node limit, and the limit itself. The limit is the
machine's size (slurm.system_nodes) where the profile gives one, else the default partition's
max_nodes; a QOS cap only warns (it is raised for large projects), so Isambard-AI goes to 1,362.
A profile with neither (berzelius-hopper: nothing documented) goes to NO_LIMIT_NODES. The 16-node
reference of local-dev (4 nodes) is planned with --allow-over-limit; so is every count, which
changes no layout (the limit check runs before the planner).

--large times searches past every shipped limit (berzelius-hopper has none documented; berzelius with
--allow-over-limit) beside their candidate layouts (planning/layout.py search_size): the figures behind
the progress line's threshold (planning/layout_advice.py SLOW_SEARCH).

    python benchmarks/plan_speed.py [--repeat N] [--config NAME] [--cluster NAME] [--extra] [--large] [--json]
    python benchmarks/plan_speed.py --compare results/plan_speed_before.txt results/plan_speed_after.txt
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcrl.errors import HpcrlError  # noqa: E402
from hpcrl.jobs.run_script import plan  # noqa: E402
from hpcrl.planning.request import RunRequest  # noqa: E402
from hpcrl.profiles import load_profile  # noqa: E402

NO_LIMIT_NODES = 64  # the planner's own search limit for more nodes (layout_advice.suggest: max(2n, 64))
REFERENCE_NODES = 16


def clusters() -> list[str]:
    """Every shipped profile and each of its variants, as --cluster names them."""
    names = []
    for path in sorted((ROOT / "clusters").glob("*.yaml")):
        prof = load_profile(path.stem)
        names.append(path.stem)
        names += [f"{path.stem}:{v}" for v in (prof.variants or {}) if v != prof.variant]
    return names


def node_limit(cluster: str) -> int:
    from hpcrl.profiles import resolve_profile

    prof = resolve_profile(cluster)
    part = prof.default_partition
    return prof.slurm.system_nodes or (part and part.max_nodes) or NO_LIMIT_NODES


def counts(limit: int) -> list[int]:
    out, n = [], 1
    while n < limit:
        out.append(n)
        n *= 2
    return sorted({*out, limit, REFERENCE_NODES})


def time_one(req: RunRequest, repeat: int) -> tuple[float, str]:
    """The best CPU seconds of `repeat` plans, and the outcome (ok, or the refusal's first words)."""
    best, outcome = float("inf"), "ok"
    for _ in range(repeat):
        t0 = time.process_time()
        try:
            plan(req)
            outcome = "ok"
        except HpcrlError as e:
            outcome = "refused: " + str(e)[:60]
        best = min(best, time.process_time() - t0)
    return best, outcome


LARGE = [("grpo-olmo3-7b", "berzelius-hopper", n, None) for n in (250, 500, 1000, 2000)] + [
    (None, "berzelius", n, "72b") for n in (250, 500, 1000)
]


def large(repeat: int) -> None:
    """CPU seconds against candidate layouts, for searches larger than any shipped limit allows."""
    from hpcrl.planning.config import load_run_config
    from hpcrl.planning.layout import search_size
    from hpcrl.planning.run_plan import workload_from_config
    from hpcrl.profiles import resolve_profile

    for config, cluster, n, model in LARGE:
        size = search_size(resolve_profile(cluster), n, workload_from_config(load_run_config(config, []), model))
        s, outcome = time_one(
            RunRequest(config=config, cluster=cluster, nodes=n, model=model, allow_over_limit=True), repeat
        )
        print(
            f"{config or '--model ' + model:34} {cluster:18} {n:5d} {size:7,d} candidates {s:7.3f} s "
            f"{1e6 * s / size:5.0f} us/candidate  {outcome[:40]}",
            flush=True,
        )


def read_table(path: str) -> dict[tuple[str, str, int], tuple[float, float]]:
    """(config, cluster, nodes) -> (CPU s, ratio to 16 nodes) from this script's printed table."""
    rows = {}
    for line in Path(path).read_text().splitlines():
        if line.startswith("slowest") or " s  x" not in line:
            continue
        head, rest = line.split(" s  x", 1)
        words = head.split()
        config, cluster, nodes, secs = " ".join(words[:-3]), words[-3], int(words[-2]), float(words[-1])
        rows[(config, cluster, nodes)] = (secs, float(rest.split()[0]))
    return rows


def compare(before: str, after: str) -> None:
    """A markdown table of the slowest plan of each (config, cluster) before and after, and of every
    plan the issue names (72B on Berzelius), with their ratios to the 16-node plan."""
    b, a = read_table(before), read_table(after)
    print("| config | cluster | nodes | before s | before x16 | after s | after x16 |\n|---|---|---|---|---|---|---|")
    pairs = sorted({(c, cl) for c, cl, _ in b})
    for c, cl in pairs:
        n = max((k for k in b if k[:2] == (c, cl)), key=lambda k: b[k][0])[2]
        shown = {n} | ({1, 16, max(k[2] for k in b if k[:2] == (c, cl))} if "72b" in c else set())
        for m in sorted(shown):
            (bs, bx), (as_, ax) = b[(c, cl, m)], a[(c, cl, m)]
            print(f"| {c} | {cl} | {m} | {bs:.3f} | {bx:.2f} | {as_:.3f} | {ax:.2f} |")
    print(f"\nslowest before: {max(v[0] for v in b.values()):.3f} s; after: {max(v[0] for v in a.values()):.3f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--config", action="append", help="only these configs (default: configs/*.yaml)")
    ap.add_argument("--cluster", action="append", help="only these clusters (default: clusters/*.yaml and variants)")
    ap.add_argument("--extra", action="store_true", help="add `plan --model 72b --cluster berzelius --nodes 1/16`")
    ap.add_argument("--large", action="store_true", help="only the searches past the shipped limits (--large's table)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="tabulate two saved outputs of this script")
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.large:
        time_one(RunRequest(config="grpo-olmo3-7b", nodes=2, allow_over_limit=True), 1)
        return large(args.repeat)
    configs = args.config or [p.stem for p in sorted((ROOT / "configs").glob("*.yaml"))]
    rows = []
    time_one(RunRequest(config=configs[0], nodes=2, allow_over_limit=True), 1)  # warm-up: imports, profile cache
    cases = [(c, cl, None) for c in configs for cl in (args.cluster or clusters())]
    if args.extra:
        cases.append((None, "berzelius", "72b"))
    for config, cluster, model in cases:
        times = {}
        for n in counts(node_limit(cluster)):
            req = RunRequest(config=config, cluster=cluster, nodes=n, model=model, allow_over_limit=True)
            times[n] = time_one(req, args.repeat)
        ref = times[REFERENCE_NODES][0]
        for n, (s, outcome) in times.items():
            rows.append(
                {
                    "config": config or f"default --model {model}",
                    "cluster": cluster,
                    "nodes": n,
                    "cpu_s": round(s, 3),
                    "ratio_to_16": round(s / ref, 2) if ref else None,
                    "outcome": outcome,
                }
            )
            if not args.json:
                print(f"{rows[-1]['config']:34} {cluster:18} {n:5d} {s:7.3f} s  x{s / ref:6.2f}  {outcome}", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        worst = max(rows, key=lambda r: r["cpu_s"])
        print(f"slowest: {worst['config']} on {worst['cluster']} at {worst['nodes']} nodes: {worst['cpu_s']} s")


if __name__ == "__main__":
    main()
