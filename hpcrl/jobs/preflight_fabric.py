"""Preflight across nodes: the collective's bus bandwidth, the slowest node, and one verdict per node.

Pure: the probe reports of every node in, a summary out (the `--json` schema of docs/preflight.md).
Bus bandwidth follows nccl-tests (doc/PERFORMANCE.md there): algbw = bytes / time, and
busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather, where n is the number of
ranks and bytes the full buffer (all-gather: the gathered output).
"""

from __future__ import annotations

import statistics

from hpcrl.jobs.preflight_checks import Check, Target, evaluate

BUSBW_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n}
# A node whose ring receive rate is under this share of the median is named slow (warn).
SLOW_NODE_SHARE = 0.5
METHOD_NOTE = {
    "torch-nccl": "torch.distributed NCCL over every GPU",
    "torch-gloo": "torch.distributed gloo, one rank per node (CPU tensors: the host network, not NCCL)",
    "tcp-ring": "hpcrl's TCP ring over Python sockets, one rank per node (torch not importable in the job): "
    "the host network, not NCCL or the GPU fabric",
}
_RANK = {"fail": 3, "warn": 2, "ok": 1, "info": 0}


def bus_bandwidth(results: list[dict], ranks: int) -> list[dict]:
    """Each result with algbw_gbs and busbw_gbs (GB/s = 1e9 bytes/s, as nccl-tests prints)."""
    out = []
    for r in results:
        alg = r["bytes"] / r["time_s"] / 1e9 if r["time_s"] > 0 else 0.0
        out.append(dict(r, algbw_gbs=round(alg, 3), busbw_gbs=round(alg * BUSBW_FACTOR[r["op"]](ranks), 3)))
    return out


def _mib(n: int) -> str:
    # The TCP ring trims a size to a multiple of its ranks: 1048575 bytes is still "1 MiB".
    return f"{round(n / 2**20)} MiB" if n >= 2**19 else f"{round(n / 1024)} KiB"


def collective_summary(first: dict | None, nodes: list[str]) -> dict:
    """The collective part of the summary: method, bandwidths, slowest node, and its check rows."""
    if first is None:
        err = f"no collective result from the first node {nodes[0] if nodes else '?'}"
        return {
            "method": None,
            "error": err,
            "results": [],
            "p2p": [],
            "slowest_node": None,
            "missing": [],
            "rejected": [],
            "checks": [Check("collective", "fail", err)._asdict()],
        }
    method, world = first.get("method"), first.get("world") or len(first.get("nodes") or [])
    s = {
        "method": method,
        "world": world,
        "verified": first.get("verified"),
        "error": first.get("error"),
        "note": METHOD_NOTE.get(method) if method else None,
        "missing": first.get("missing", []),
        "results": [],
        "p2p": [],
        "slowest_node": None,
        "why_not_torch": first.get("why_not_torch", []),
    }
    rows: list[Check] = []
    if first.get("error"):
        rows.append(Check("collective", "fail", first["error"]))
    if method:
        s["results"] = bus_bandwidth(first.get("results", []), world)
        s["p2p"] = sorted(first.get("p2p", []), key=lambda p: p["gbs"])
        if world < 2:
            rows.append(
                Check("collective", "info", f"{method}: one rank, nothing crosses a link (use --nodes 2 or more)")
            )
        elif not first.get("error"):
            ok = first.get("verified")
            rows.append(
                Check(
                    "collective",
                    "ok" if ok else "fail",
                    f"{method} over {world} ranks on {len(first.get('nodes', []))} nodes: "
                    + ("results verified" if ok else "WRONG results (data corrupted in transit)"),
                )
            )
        for r in s["results"] if world >= 2 else []:  # one rank: bus bandwidth 0 by definition
            rows.append(
                Check(
                    f"{r['op'].replace('_', '-')} {_mib(r['bytes'])}",
                    "info",
                    f"busbw {r['busbw_gbs']:.2f} GB/s (algbw {r['algbw_gbs']:.2f} GB/s, {r['time_s'] * 1e3:.1f} ms)",
                )
            )
        if s["p2p"] and world >= 2:
            slow = s["p2p"][0]
            med = statistics.median(p["gbs"] for p in s["p2p"])
            s["slowest_node"] = slow["node"]
            lag = len(s["p2p"]) >= 3 and slow["gbs"] < SLOW_NODE_SHARE * med
            rows.append(
                Check(
                    "slowest node",
                    "warn" if lag else "ok",
                    f"{slow['node']} receives from {slow['from_node']} at {slow['gbs']:.2f} GB/s "
                    f"(median of {len(s['p2p'])} ranks {med:.2f} GB/s)",
                )
            )
    s["rejected"] = first.get("rejected", [])
    if s["rejected"]:  # someone else on the node reached the rendezvous: worth knowing on shared nodes
        rows.append(
            Check(
                "unauthenticated connections",
                "warn",
                "refused (without the job's secret): "
                + ", ".join(f"{r['connections']} at {r['node']}" for r in s["rejected"]),
            )
        )
    s["checks"] = [c._asdict() for c in rows]
    return s


def node_verdict(rows: list[Check]) -> tuple[str, str]:
    """A node's status (its worst row) and why (its failing, else warning, rows)."""
    worst = max((r.status for r in rows), key=_RANK.__getitem__, default="ok")
    worst = "ok" if worst == "info" else worst
    why = [f"{r.check}: {r.detail}" for r in rows if r.status == worst and worst != "ok"]
    return worst, "; ".join(why)


def summarize(reports: list[dict], t: Target, lost: list[dict], job_id: str | None = None) -> dict:
    """Every node's rows and verdict, the collective, and the nodes that failed (the --json object)."""
    firsts = [r["collective"] for r in reports if (r.get("collective") or {}).get("role") == "first"]
    node_names = [r.get("node", "?") for r in reports]
    coll = collective_summary(firsts[0] if firsts else None, sorted(node_names))
    nodes, checks = [], []
    for rep in reports:
        rows = evaluate(rep, t)
        name = rep.get("node", "?")
        own = rep.get("collective") or {}
        if name in coll.get("missing", []):
            rows.append(Check("collective", "fail", f"did not join the collective's rendezvous ({coll['error']})"))
        elif own.get("error") and own.get("role") != "first":
            rows.append(Check("collective", "warn", own["error"]))
        status, why = node_verdict(rows)
        nodes.append({"node": name, "status": status, "why": why})
        checks += [dict(c._asdict(), node=name) for c in rows]
    failing = [n["node"] for n in nodes if n["status"] == "fail"]
    # A task that gave no report: its node fails, and counts as a failing node (exclude list) when
    # Slurm named it and another node did report (when none did, the job, not a node, failed).
    for entry in lost:
        name = entry["node"] or f"task {entry['task']}"
        nodes.append({"node": name, "status": "fail", "why": f"the probe did not report: {entry['why']}"})
        checks.append(dict(Check("probe", "fail", f"no report: {entry['why']}")._asdict(), node=name))
        if entry["node"] and reports:
            failing.append(name)
    coll_fail = any(c["status"] == "fail" for c in coll["checks"])
    return {
        "cluster": t.profile.name,
        "partition": t.partition,
        "job_id": job_id,
        "nodes_requested": len(reports) + len(lost),
        "ok": not failing and not lost and not coll_fail,
        "nodes": nodes,
        "collective": coll,
        "failing_nodes": failing,
        "excluded_from_job": list(t.exclude),
        "checks": checks + [dict(c, node="*") for c in coll["checks"]],
        "report": reports[0] if reports else None,
        "reports": reports,
        "exclude": None,
    }


__all__ = ["BUSBW_FACTOR", "bus_bandwidth", "collective_summary", "node_verdict", "summarize"]
