"""Smoke test of a job's Ray cluster, run by `hpcrl render --smoke` scripts in place of training.

    python3 -m hpcrl.runtime.smoke --nodes 3 --gpus-per-node 4 --cpus-per-node 4 \
        --learners "1 1 1" --engines 9 --tp 1 --placement learner-spread

Connects with the job's token (RAY_AUTH_MODE/RAY_AUTH_TOKEN_PATH, RAY_ADDRESS from the
script), checks that every node and its declared GPUs and CPUs are registered, then places
the layout as the framework would; the backend chose the `--placement` when it rendered the
script (hpcrl/planning/backends/log_facts.py SmokeFacts):

- learner-spread (open-instruct's grpo_fast.py): one placement group of one bundle {GPU: k} per
  `--learners` entry, strategy STRICT_SPREAD, so each entry lands on its own node; then one
  group of one bundle {GPU: tp} per vLLM engine, strategy PACK (vllm_utils.create_vllm_engines);
  a bundle never spans nodes, so TP stays in one node.
- node-pools (verl's resource pool, always colocated): one STRICT_PACK placement group of
  one-GPU bundles per node (`--learners` gives each node's GPUs), whose TP groups of `--tp`
  consecutive bundles then share a node.
- pack-groups (OpenRLHF's): a PACK group of one-GPU bundles for the vLLM engines, then a PACK
  group for the actor (`--colocated`: one shared PACK group for both); each node must hold a
  multiple of `--tp` engine bundles, since the framework cuts an engine's bundles from its node's list.

One task runs in each bundle and reports its node. The bundles ask a small CPU fraction so
that a small test cluster fits; `--cpu-ask` (the CPUs the framework itself would ask, worked
out by the backend) makes a note say whether the framework's own ask would fit.

With `--no-ray` (a backend that runs without Ray) it checks only that this node's job sees
the GPUs and cores it was rendered for.

Prints one line, `hpcrl-smoke: ok nodes=N gpus=G ...` (exit 0) or `hpcrl-smoke: FAIL <reason>`
(exit 1). Needs ray; imports nothing else outside the standard library.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter

BUNDLE_CPU = 0.01  # per bundle: placement is what is tested, not CPU capacity
PLACEMENTS = ("learner-spread", "node-pools", "pack-groups")


class SmokeFailure(Exception):
    """A check that failed; its message is the reason printed."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m hpcrl.runtime.smoke", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus-per-node", type=int, required=True)
    p.add_argument("--cpus-per-node", type=float, required=True)
    p.add_argument("--learners", required=True, help='learners on each learner node, e.g. "1 1 1"')
    p.add_argument("--engines", type=int, required=True)
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--framework", default="", help="The framework's name in the summary line")
    p.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default="learner-spread",
        help="How the framework places its bundles (chosen by its backend)",
    )
    p.add_argument(
        "--cpu-ask",
        nargs=4,
        metavar=("WHO", "TOTAL", "PER_NODE", "WHERE"),
        help="The CPUs the framework itself would ask: in all, on its busiest node, and that node's kind",
    )
    p.add_argument("--colocated", action="store_true", help="Training and generation share every GPU")
    p.add_argument("--address", default=None, help="Ray address (default: $RAY_ADDRESS, else auto)")
    p.add_argument("--timeout", type=float, default=120.0, help="Seconds to wait for each placement group")
    p.add_argument(
        "--service",
        nargs=3,
        action="append",
        default=[],
        metavar=("NAME", "PORT", "PATH"),
        help="A service the script started on every node: GET http://127.0.0.1:PORT/PATH must answer there",
    )
    p.add_argument(
        "--actor-env",
        action="store_true",
        help="Start an actor with this process's whole environment as its runtime_env env_vars, as "
        "a framework that passes its driver's environment does (a large one makes that start fail)",
    )
    p.add_argument(
        "--no-ray", action="store_true", help="A job without Ray: check the GPUs and cores Slurm gave this node"
    )
    p.add_argument(
        "--service-port-per-slot",
        action="store_true",
        help="Each node's service port is PORT + its slot on a shared host (HPCRL_NODE_TABLE)",
    )
    args = p.parse_args(argv)
    try:
        args.learners = [int(x) for x in args.learners.replace(",", " ").split()]
    except ValueError:
        p.error(f'--learners {args.learners!r}: expected integers, e.g. "1 1 1"')
    if not args.learners or min(args.learners) < 1:
        p.error("--learners needs at least one positive entry")
    return args


def check_layout(args: argparse.Namespace) -> None:
    """The layout itself must fit the declared cluster before Ray is asked."""
    if len(args.learners) > args.nodes:
        raise SmokeFailure(
            f"{len(args.learners)} learner entries need {len(args.learners)} nodes (STRICT_SPREAD); "
            f"the job has {args.nodes}"
        )
    if max(args.learners) > args.gpus_per_node or args.tp > args.gpus_per_node:
        raise SmokeFailure(f"a learner entry or TP exceeds {args.gpus_per_node} GPUs per node")
    if args.placement == "node-pools":
        args.colocated = True
    need = sum(args.learners) + args.engines * args.tp
    if args.colocated:
        need = max(sum(args.learners), args.engines * args.tp)
    if need > args.nodes * args.gpus_per_node:
        raise SmokeFailure(f"layout needs {need} GPUs, the job has {args.nodes * args.gpus_per_node}")


def check_nodes(ray, args: argparse.Namespace) -> list[dict]:
    alive = [n for n in ray.nodes() if n.get("Alive")]
    if len(alive) != args.nodes:
        addrs = sorted(n.get("NodeManagerAddress", "?") for n in alive)
        raise SmokeFailure(f"{len(alive)} Ray nodes alive, expected {args.nodes}: {addrs}")
    for n in alive:
        res = n.get("Resources", {})
        addr = n.get("NodeManagerAddress", "?")
        if res.get("GPU", 0) != args.gpus_per_node:
            raise SmokeFailure(f"node {addr} declares {res.get('GPU', 0):g} GPUs, expected {args.gpus_per_node}")
        if res.get("CPU", 0) != args.cpus_per_node:
            raise SmokeFailure(f"node {addr} declares {res.get('CPU', 0):g} CPUs, expected {args.cpus_per_node:g}")
    return alive


def _probe():
    import ray

    ctx = ray.get_runtime_context()
    return {"node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(), "gpus": len(ray.get_gpu_ids())}


def run_in_bundles(ray, pg, gpus_per_bundle: list[float], timeout: float) -> list[dict]:
    """One task in each bundle of pg, asking that bundle's GPUs; their reports, in bundle order."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    probe = ray.remote(_probe)
    refs = [
        probe.options(
            num_cpus=BUNDLE_CPU,
            num_gpus=g,
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i),
        ).remote()
        for i, g in enumerate(gpus_per_bundle)
    ]
    return ray.get(refs, timeout=timeout)


def place(ray, name: str, bundles: list[dict], strategy: str, timeout: float):
    from ray.util.placement_group import placement_group

    pg = placement_group(bundles, strategy=strategy, name=name)
    if not pg.wait(timeout):
        raise SmokeFailure(
            f"{name} placement group ({len(bundles)} bundles {bundles[0]}, {strategy}) not placed within {timeout:g} s; "
            f"available: {ray.available_resources()}"
        )
    return pg


def _head(args: argparse.Namespace) -> str:
    return (
        f"hpcrl-smoke: ok nodes={args.nodes} gpus={args.nodes * args.gpus_per_node} "
        f"cpus={args.nodes * args.cpus_per_node:g} framework={args.framework}"
    )


def _tp_groups_on_nodes(reports: list[dict], tp: int, what: str) -> int:
    """Bundles per node must split into whole TP groups; the number of nodes used."""
    per_node = Counter(r["node_id"] for r in reports)
    split = {n: c for n, c in per_node.items() if c % tp}
    if split:
        raise SmokeFailure(
            f"{what}: a node holds a number of bundles that is not a multiple of tp={tp}, "
            f"so an engine's TP group would span nodes: {sorted(split.values())}"
        )
    return len(per_node)


def place_node_pools(ray, args: argparse.Namespace) -> str:
    """A resource pool (verl's): one STRICT_PACK group of one-GPU bundles per node."""
    if args.gpus_per_node % args.tp:
        raise SmokeFailure(f"tp={args.tp} does not divide the {args.gpus_per_node} GPUs of a node")
    pools = []
    for i, k in enumerate(args.learners):
        pg = place(ray, f"hpcrl-smoke-pool-{i}", [{"GPU": 1, "CPU": BUNDLE_CPU}] * k, "STRICT_PACK", args.timeout)
        pools.append(run_in_bundles(ray, pg, [1] * k, args.timeout))
    homes = [{r["node_id"] for r in reports} for reports in pools]
    if any(len(h) != 1 for h in homes):
        raise SmokeFailure("a STRICT_PACK pool spans nodes")
    if len(set().union(*homes)) != len(pools):
        raise SmokeFailure(f"{len(pools)} pools share nodes: {[sorted(r['ip'] for r in rep)[0] for rep in pools]}")
    return (
        f"{_head(args)} colocated=true workers={sum(args.learners)} pools={len(pools)} "
        f"engines={args.engines} tp={args.tp}"
    )


def place_pack_groups(ray, args: argparse.Namespace) -> str:
    """PACK groups (OpenRLHF's): vLLM first, then the actor (or one shared group, colocated)."""
    actor = sum(args.learners)
    bundle = {"GPU": 1, "CPU": BUNDLE_CPU}
    if args.colocated:
        pg = place(ray, "hpcrl-smoke-shared", [bundle] * actor, "PACK", args.timeout)
        reports = run_in_bundles(ray, pg, [0.2] * actor, args.timeout)  # the framework's fractional share
        used = _tp_groups_on_nodes(reports, args.tp, "shared group")
        return f"{_head(args)} colocated=true actor_gpus={actor} engines={args.engines} tp={args.tp} nodes_used={used}"
    vllm_pg = place(ray, "hpcrl-smoke-vllm", [bundle] * (args.engines * args.tp), "PACK", args.timeout)
    engine_nodes = _tp_groups_on_nodes(
        run_in_bundles(ray, vllm_pg, [1] * (args.engines * args.tp), args.timeout), args.tp, "vLLM group"
    )
    actor_pg = place(ray, "hpcrl-smoke-actor", [bundle] * actor, "PACK", args.timeout)
    actor_nodes = len({r["node_id"] for r in run_in_bundles(ray, actor_pg, [1] * actor, args.timeout)})
    return (
        f"{_head(args)} actor_gpus={actor} actor_nodes={actor_nodes} engines={args.engines} tp={args.tp} "
        f"engine_nodes={engine_nodes}"
    )


def _ask_service(port: int, path: str, per_slot: bool) -> dict:
    """On one node: GET the service on this node's 127.0.0.1 (the slot from the job's node table)."""
    import os
    import urllib.request

    import ray

    node = os.environ.get("SLURMD_NODENAME", "")
    slot = 0
    for entry in os.environ.get("HPCRL_NODE_TABLE", "").split(";"):
        fields = entry.split()
        if len(fields) == 3 and fields[0] == node:
            slot = int(fields[2])
    url = f"http://127.0.0.1:{port + (slot if per_slot else 0)}{path}"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - the job's own local service
            status = resp.status
    except Exception as exc:  # an answer is all that matters here
        status = f"{type(exc).__name__}: {exc}"
    return {"node": node, "ip": ray.util.get_node_ip_address(), "url": url, "status": status}


def check_services(ray, args: argparse.Namespace) -> str:
    """Each service answers on every node (a task pinned to each node asks its own 127.0.0.1)."""
    if not args.service:
        return ""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ask = ray.remote(_ask_service)
    done = []
    for name, port, path in args.service:
        refs = [
            ask.options(
                num_cpus=BUNDLE_CPU, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False)
            ).remote(int(port), path, args.service_port_per_slot)
            for n in ray.nodes()
            if n.get("Alive")
        ]
        answers = ray.get(refs, timeout=args.timeout)
        bad = [a for a in answers if a["status"] != 200]
        if bad:
            where = ", ".join(f"{a['node'] or a['ip']} ({a['url']}: {a['status']})" for a in bad)
            raise SmokeFailure(f"{name} does not answer on {where}")
        done.append(f"{name}={len(answers)}/{len(answers)}")
    return " services=" + ",".join(done)


class _EnvProbe:
    def size(self) -> int:
        return sum(len(k) + len(v) + 2 for k, v in os.environ.items())


def check_actor_env(ray, args: argparse.Namespace) -> str:
    """An actor gets the driver's environment in its runtime_env, as open-instruct's grpo_fast.py passes
    it (every variable but CUDA_VISIBLE_DEVICES and ROCR_VISIBLE_DEVICES, e6c3044a grpo_fast.py:2214-2219)."""
    if not args.actor_env:
        return ""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")}
    size = sum(len(k) + len(v) + 2 for k in env for v in [env[k]])
    probe = ray.remote(_EnvProbe).options(num_cpus=BUNDLE_CPU, runtime_env={"env_vars": env}).remote()
    try:
        ray.get(probe.size.remote(), timeout=args.timeout)
    except Exception as exc:
        # Ray's GetTimeoutError is a TimeoutError (ray/exceptions.py); anything else is the actor's own
        # failure (its runtime env, its process), reported as soon as Ray knows it, with Ray's words.
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        what = f"did not start within {args.timeout:g} s" if isinstance(exc, TimeoutError) else "failed to start"
        cause = next((ln for ln in reversed(lines) if "Error" in ln and ln != lines[0]), "")
        raise SmokeFailure(
            f"an actor with the driver's environment ({size // 1024} KiB) {what}: "
            f"{type(exc).__name__} {lines[0][:200] if lines else ''}" + (f" ({cause[:200]})" if cause else "")
        ) from None
    ray.kill(probe)
    return f" actor_env={size // 1024}KiB"


def smoke(ray, args: argparse.Namespace) -> str:
    """All checks; the summary line on success."""
    check_layout(args)
    check_nodes(ray, args)
    return _placement(ray, args) + check_services(ray, args) + check_actor_env(ray, args)


def _placement(ray, args: argparse.Namespace) -> str:
    if args.placement == "node-pools":
        return place_node_pools(ray, args)
    if args.placement == "pack-groups":
        return place_pack_groups(ray, args)
    return place_learner_spread(ray, args)


def place_learner_spread(ray, args: argparse.Namespace) -> str:
    """Learners STRICT_SPREAD, one bundle per node, and engines PACK (open-instruct's)."""
    learner_pg = place(
        ray,
        "hpcrl-smoke-learners",
        [{"GPU": k, "CPU": BUNDLE_CPU} for k in args.learners],
        "STRICT_SPREAD",
        args.timeout,
    )
    learners = run_in_bundles(ray, learner_pg, args.learners, args.timeout)
    learner_nodes = [r["node_id"] for r in learners]
    if len(set(learner_nodes)) != len(learner_nodes):
        raise SmokeFailure(f"learner bundles share nodes: {[r['ip'] for r in learners]}")
    for k, r in zip(args.learners, learners):
        if r["gpus"] != k:
            raise SmokeFailure(f"a learner task on {r['ip']} got {r['gpus']} GPUs, expected {k}")
    engine_nodes: Counter = Counter()
    if args.engines:
        engine_pg = place(
            ray,
            "hpcrl-smoke-engines",
            [{"GPU": args.tp, "CPU": BUNDLE_CPU} for _ in range(args.engines)],
            "PACK",
            args.timeout,
        )
        engines = run_in_bundles(ray, engine_pg, [args.tp] * args.engines, args.timeout)
        for r in engines:
            if r["gpus"] != args.tp:
                raise SmokeFailure(f"an engine task on {r['ip']} got {r['gpus']} GPUs, expected tp={args.tp}")
        engine_nodes = Counter(r["node_id"] for r in engines)
    gpus = args.nodes * args.gpus_per_node
    return (
        f"hpcrl-smoke: ok nodes={args.nodes} gpus={gpus} cpus={args.nodes * args.cpus_per_node:g} "
        f"learners={args.learners} learner_nodes={len(set(learner_nodes))} "
        f"engines={args.engines} tp={args.tp} engine_nodes={len(engine_nodes)}"
    )


def cpu_note(args: argparse.Namespace) -> str | None:
    """Whether the framework's own CPU requests (--cpu-ask) would fit the declared CPUs."""
    if not args.cpu_ask:
        return None
    who, total, per_node, where = args.cpu_ask
    have = args.nodes * args.cpus_per_node
    if float(per_node) > args.cpus_per_node or float(total) > have:
        return (
            f"hpcrl-smoke: note: {who} would ask {total} CPUs ({per_node} on a {where}), "
            f"the cluster declares {have:g} ({args.cpus_per_node:g} per node): raise ray.num_cpus_per_node"
        )
    return None


def smoke_alone(args: argparse.Namespace) -> str:
    """No Ray: the GPUs this process sees (Slurm's CUDA_VISIBLE_DEVICES) and the cores Slurm gave
    the node must be what the script was rendered for (--gpus N asks for part of a node)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        raise SmokeFailure("CUDA_VISIBLE_DEVICES is not set: Slurm gave this job no GPUs")
    gpus = [g for g in visible.split(",") if g.strip()]
    if len(gpus) != args.gpus_per_node:
        raise SmokeFailure(
            f"the job sees {len(gpus)} GPUs (CUDA_VISIBLE_DEVICES={visible}), expected {args.gpus_per_node}"
        )
    cpus = int(os.environ.get("SLURM_CPUS_ON_NODE") or 0)
    if cpus < args.cpus_per_node:
        raise SmokeFailure(
            f"Slurm gave the job {cpus} cores on this node (SLURM_CPUS_ON_NODE), expected at least "
            f"{args.cpus_per_node:g}"
        )
    return (
        f"hpcrl-smoke: ok nodes=1 gpus={len(gpus)} cpus={cpus} framework={args.framework} ray=none "
        f"visible_gpus={visible}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.no_ray:
        try:
            print(smoke_alone(args), flush=True)
        except SmokeFailure as exc:
            print(f"hpcrl-smoke: FAIL {exc}", flush=True)
            return 1
        return 0
    try:
        import ray
    except ImportError:
        print("hpcrl-smoke: FAIL ray is not importable by this python (pip install 'ray[default]')", flush=True)
        return 1
    address = args.address or os.environ.get("RAY_ADDRESS") or "auto"
    start = time.monotonic()
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        line = smoke(ray, args)
    except SmokeFailure as exc:
        print(f"hpcrl-smoke: FAIL {exc}", flush=True)
        return 1
    except Exception as exc:  # connection, auth, timeouts: one line, not a traceback
        print(f"hpcrl-smoke: FAIL {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", flush=True)
        return 1
    finally:
        if ray.is_initialized():
            ray.shutdown()
    note = cpu_note(args)
    if note:
        print(note, file=sys.stderr, flush=True)
    print(f"{line} seconds={time.monotonic() - start:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
