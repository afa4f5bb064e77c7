"""The preflight probe: runs on every node of the job (through submitit) and reports what it finds.

Standard library only at import time (it, preflight_gpu and hpcrl.contract are pickled by value,
so the node needs no hpcrl); nvidia-ml-py is imported inside, and the training stack is imported in the
training environment's own Python, in a subprocess, so a broken torch cannot take the probe
down. The collective check (preflight_collective.py and preflight_link.py, their sources sent
in the spec) runs there too, once per node, after this node's own checks.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile

from hpcrl.contract import COLLECTIVE_PORT, port_base
from hpcrl.runtime.preflight_gpu import gpus, node_name

GIB = 1024**3
STACK = ("torch", "vllm", "deepspeed", "ray")  # and the framework's package, which the spec names

# Printed as JSON by the training Python: {module: [version or None, error or None]}.
_IMPORT_CHECK = r"""
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        mod = importlib.import_module(name)
        ver = getattr(mod, "__version__", None)
        if ver is None:
            try:
                from importlib.metadata import version
                ver = version(name.replace("_", "-"))
            except Exception:
                ver = "?"
        out[name] = [str(ver), None]
        if name == "torch":  # the CUDA version this torch was built for, checked against the driver
            out["torch.cuda"] = [str(getattr(getattr(mod, "version", None), "cuda", None)), None]
    except BaseException as exc:
        out[name] = [None, (type(exc).__name__ + ": " + str(exc)).splitlines()[0][:200]]
print("HPCRL-IMPORTS " + json.dumps(out))
"""


def _expand(raw: str | None) -> str | None:
    return os.path.expandvars(os.path.expanduser(raw)) if raw else None


def space(raw: str | None) -> dict:
    """Existence, writability and free GiB of a path (of its nearest existing parent if absent)."""
    path = _expand(raw)
    if not path:
        return {"path": raw, "exists": False, "error": "not set"}
    probe = path
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe.rstrip("/"))
        if parent == probe:
            break
        probe = parent
    if not os.path.exists(probe or "/"):
        return {"path": path, "exists": False, "error": "no such path"}
    usage = shutil.disk_usage(probe)
    return {
        "path": path,
        "exists": os.path.exists(path),
        "checked": probe,
        "writable": os.access(probe, os.W_OK),
        "free_gib": round(usage.free / GIB, 1),
        "total_gib": round(usage.total / GIB, 1),
        "error": None,
    }


def model_entry(model: str | None, hf_home: str | None) -> dict:
    """Whether the model is a readable local path or an entry in the HF cache."""
    if not model:
        return {"model": None, "found": False, "detail": "no model given"}
    local = _expand(model)
    if local and (local.startswith(("/", ".", "~")) or os.path.exists(local)):
        ok = os.path.isdir(local) and os.access(local, os.R_OK | os.X_OK)
        cfg = os.path.join(local, "config.json")
        return {
            "model": model,
            "kind": "path",
            "found": ok and os.access(cfg, os.R_OK),
            "detail": local if ok else f"{local}: not a readable directory",
        }
    home = _expand(hf_home) or os.path.expanduser("~/.cache/huggingface")
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(home, "hub")
    entry = os.path.join(hub, "models--" + model.replace("/", "--"))
    snaps = os.path.join(entry, "snapshots")
    readable = os.path.isdir(snaps) and os.access(snaps, os.R_OK | os.X_OK)
    found = readable and any(os.path.exists(os.path.join(snaps, s, "config.json")) for s in os.listdir(snaps))
    detail = entry if found else f"not in the HF cache ({entry}); the job would download it"
    return {"model": model, "kind": "hf", "found": found, "detail": detail}


def stack(python: str, env_setup: list[str], workdir: str | None, modules: tuple[str, ...], timeout: float) -> dict:
    """Which of the training stack imports in the training environment, with versions."""
    lines = list(env_setup)
    if workdir:
        lines.append(f"cd {workdir} 2>/dev/null || true")  # a framework may import from its checkout
    lines.append(f"{python} -c {shlex.quote(_IMPORT_CHECK)} {' '.join(modules)}")
    try:
        proc = subprocess.run(["bash", "-c", "\n".join(lines)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"imports did not finish within {timeout:.0f} s", "modules": {}}
    for line in proc.stdout.splitlines():
        if line.startswith("HPCRL-IMPORTS "):
            return {"error": None, "modules": json.loads(line.split(" ", 1)[1])}
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
    return {"error": f"{python} did not run (exit {proc.returncode}): {tail}", "modules": {}}


def stack_check(spec: dict, timeout: float) -> dict | None:
    """The job's own stack check (stack.py, its source sent in the spec) run by the training Python:
    its exit code and its `stack:` lines; None when the spec has none (no run config)."""
    files = spec.get("stack_files")
    if not files:
        return None
    with tempfile.TemporaryDirectory(prefix="hpcrl-stack-") as tmp:
        for name, src in files.items():
            with open(os.path.join(tmp, name), "w") as fh:
                fh.write(src)
        lines = list(spec.get("env_setup") or [])
        if spec.get("workdir"):
            lines.append(f"cd {spec['workdir']} 2>/dev/null || true")
        words = [
            os.path.join(tmp, "stack.py"),
            "--expect",
            json.dumps(spec["stack_expect"]),
            "--",
            *spec.get("stack_argv", []),
        ]
        python = spec.get("python") or "python"
        # One word, spaces and quotes kept; a path naming $VAR or ~ is left for the shell to expand.
        python = python if ("$" in python or python.startswith("~")) else shlex.quote(python)
        lines.append(f"exec {python} {' '.join(map(shlex.quote, words))}")
        try:
            proc = subprocess.run(["bash", "-c", "\n".join(lines)], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"rc": None, "lines": [f"stack: the check did not finish within {timeout:.0f} s"]}
    found = [line for line in proc.stdout.splitlines() if line.startswith("stack:")]
    return {
        "rc": proc.returncode,
        "lines": found
        or [f"stack: no answer (exit {proc.returncode}): " + (proc.stderr.strip().splitlines() or [""])[-1][:200]],
    }


def _job_nodes() -> list[str]:
    """The job's nodes in Slurm's order (submitit expands SLURM_JOB_NODELIST)."""
    try:
        import submitit

        return list(submitit.JobEnvironment().hostnames)
    except Exception:
        return [node_name()]


def node_addrs(nodes: list[str]) -> dict[str, str]:
    """Node -> IPv4 from Slurm's NodeAddr (as ray.sh.j2 does: the hostname may name another
    network, or one host for every node on a test cluster); the resolver where Slurm says nothing."""
    addrs: dict[str, str] = {}
    try:
        out = subprocess.run(
            ["scontrol", "show", "node", "-o", ",".join(nodes)], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    for line in out.splitlines():
        f = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if f.get("NodeName") in nodes and f.get("NodeAddr"):
            addrs[f["NodeName"]] = f["NodeAddr"]
    for n in nodes:
        try:
            addrs[n] = str(socket.getaddrinfo(addrs.get(n, n), None, socket.AF_INET)[0][4][0])
        except OSError:
            addrs.setdefault(n, n)
    return addrs


def collective(spec: dict, timeout: float) -> dict:
    """Run the collective script in the training environment, one process for this node."""
    files = spec.get("collective_files")
    if not files:
        return {"error": "not run"}
    nodes = _job_nodes()
    me = node_name()
    rank = int(os.environ.get("SLURM_NODEID", nodes.index(me) if me in nodes else 0))
    addrs = node_addrs(nodes)
    job = int(os.environ.get("SLURM_JOB_ID", "0") or 0)
    args = {
        "node": me,
        "node_rank": rank,
        "nnodes": len(nodes),
        "nodes": nodes,
        "master_addr": addrs[nodes[0]],
        "my_addr": addrs.get(me, "127.0.0.1"),
        # In the job's block of ports (hpcrl/contract.py), where Ray would not listen.
        "port": port_base(job) + COLLECTIVE_PORT,
        **spec.get("collective_args", {}),
    }
    with tempfile.TemporaryDirectory(prefix="hpcrl-preflight-") as tmp:
        for name, src in files.items():  # the script and its link module, side by side
            with open(os.path.join(tmp, name), "w") as fh:
                fh.write(src)
        path = os.path.join(tmp, "preflight_collective.py")
        lines = list(spec.get("env_setup") or [])
        if spec.get("workdir"):
            lines.append(f"cd {spec['workdir']} 2>/dev/null || true")
        lines.append(f"exec {spec.get('python') or 'python'} {shlex.quote(path)} {shlex.quote(json.dumps(args))}")
        try:
            # The job's secret goes in the environment, which only this user can read (/proc/PID/environ
            # is 0400), not on the command line, which every user of the node can.
            env = dict(os.environ, HPCRL_COLLECTIVE_SECRET=str(spec.get("collective_secret") or ""))
            proc = subprocess.run(
                ["bash", "-c", "\n".join(lines)], capture_output=True, text=True, timeout=timeout, env=env
            )
        except subprocess.TimeoutExpired:
            return {"error": f"the collective did not finish within {timeout:.0f} s", "node": me}
    for line in proc.stdout.splitlines():
        if line.startswith("HPCRL-COLLECTIVE "):
            return json.loads(line.split(" ", 1)[1])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
    return {"error": f"the collective script did not report (exit {proc.returncode}): {tail}", "node": me}


def probe(spec: dict) -> dict:
    """Everything preflight checks on this node; `spec` says where to look (see hpcrl.jobs.preflight)."""
    for key, value in (spec.get("env") or {}).items():
        os.environ.setdefault(key, os.path.expandvars(str(value)))
    report = {
        "node": node_name(),
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "python": sys.version.split()[0],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpus": gpus(),
        "node_local": space(spec.get("node_local")),
        "run_root": space(spec.get("run_root")),
        "model": model_entry(spec.get("model"), spec.get("hf_home")),
        "stack": stack(
            spec.get("python") or "python",
            spec.get("env_setup") or [],
            spec.get("workdir"),
            tuple(spec.get("modules") or STACK),
            float(spec.get("import_timeout_s", 300)),
        ),
    }
    report["stack_check"] = stack_check(spec, float(spec.get("stack_timeout_s", 600)))
    report["collective"] = collective(spec, float(spec.get("collective_timeout_s", 900)))
    return report


def main(argv: list[str] | None = None) -> int:
    """By hand on a node: print what the probe finds, as JSON (`hpcrl preflight` submits it instead)."""
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m hpcrl.runtime.preflight_probe",
        description="The preflight probe: GPUs, node-local and run-root space, the model, "
        "the training stack's imports on this node. `hpcrl preflight` submits it through "
        "submitit; run by hand on a node, it prints the same report as JSON.",
    )
    p.add_argument(
        "--spec",
        default="{}",
        help="JSON object of where to look: node_local, run_root, model, hf_home, "
        "python, env_setup, workdir, modules, env (see hpcrl/jobs/preflight.py); default {}",
    )
    a = p.parse_args(argv)
    try:
        spec = json.loads(a.spec)
    except ValueError as exc:
        p.error(f"--spec: not JSON ({exc})")
    if not isinstance(spec, dict):
        p.error("--spec: give a JSON object")
    print(json.dumps(probe(spec), indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
