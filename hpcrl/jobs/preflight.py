"""`hpcrl preflight`: one job over N nodes, through submitit, asking whether a run can work there.

The probe (hpcrl/runtime/preflight_probe.py) runs once on every node, checks that node and
then joins the collective check (hpcrl/runtime/preflight_collective.py) with the others;
this module builds what they need from the profile and run config, submits the job, waits,
turns the reports into verdicts (hpcrl/jobs/preflight_checks.py, hpcrl/jobs/preflight_fabric.py) and,
with --write-exclude, adds the failing nodes to the cluster's exclude list (hpcrl/jobs/node_excludes.py).
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from hpcrl import contract
from hpcrl.errors import HpcrlError, SlurmError
from hpcrl.jobs import node_excludes
from hpcrl.jobs import slurm
from hpcrl.jobs.preflight_checks import Check, Target, cuda_check, evaluate, ray_check
from hpcrl.profiles import resolve_profile

# Message sizes of the collective: NCCL on GPUs as nccl-tests' mid range; the TCP ring and
# gloo run in Python on CPUs, so smaller ones keep the job short.
SIZES = {"torch-nccl": [8 << 20, 128 << 20, 1 << 30], "tcp": [1 << 20, 8 << 20, 32 << 20]}
COLLECTIVE_ARGS = {"sizes": SIZES, "iters": 5, "timeout_s": 300, "gemm_n": 8192, "gemm_iters": 20}


def _disk_need_gib(rp: Any) -> float | None:
    """The run's peak disk need in GiB, as `plan-disk --config` and the render/submit disk check count it
    (hpcrl/planning/disk_check.py: the run's own backend's budget), or None where it cannot be worked out."""
    from hpcrl.planning.disk import GIB
    from hpcrl.planning.disk_check import run_budget

    try:
        return run_budget(rp).peak_bytes / GIB
    except HpcrlError:  # preflight still reports free space
        return None


def target(cluster: str | None = None, partition: str | None = None, config: str | None = None) -> Target:
    """Profile, partition and probe spec from --cluster/--partition and an optional run config."""
    notes: list[str] = []
    cfg = rp = None
    if config:
        from hpcrl.planning.config import load_run_config
        from hpcrl.planning.run_plan import make_run_plan

        try:
            rp = make_run_plan(config, cluster=cluster)
            cfg = rp.config
        except HpcrlError as exc:  # the probe is still worth running without a plan
            cfg = load_run_config(config)  # a config that is itself wrong fails here, as it should
            notes.append(f"plan not made ({exc}); disk need unknown")
    profile = rp.profile if rp else resolve_profile(cluster or (cfg.hpcrl.cluster if cfg else None))
    hp = cfg.hpcrl if cfg else None
    spec: dict[str, Any] = {
        "env": dict(profile.env, HF_HOME=profile.storage.hf_home),
        "hf_home": profile.storage.hf_home,
        "node_local": profile.storage.node_local.path,
        "run_root": (hp.run_root if hp and hp.run_root else profile.storage.run_root.path),
        "model": cfg.model_name if cfg else None,
        "python": hp.python if hp else "python",
        "env_setup": list(profile.setup)
        + [f"module load {m} 2>/dev/null || true" for m in profile.modules]
        + (list(hp.env_setup) if hp else []),
        "workdir": hp.workdir if hp else None,
    }
    from hpcrl.planning.backends import get_backend
    from hpcrl.planning.backends.log_facts import default_backend
    from hpcrl.runtime import preflight_collective, preflight_link, preflight_probe

    # The training stack and the run's framework (the default backend's without a config).
    package = get_backend(hp.backend if hp else default_backend()).command_facts.package
    spec["modules"] = [*preflight_probe.STACK, *([package] if package else [])]

    spec["collective_files"] = {
        Path(str(m.__file__)).name: Path(str(m.__file__)).read_text() for m in (preflight_collective, preflight_link)
    }
    spec["collective_args"] = COLLECTIVE_ARGS
    if cfg:
        spec.update(stack_spec(cfg, rp, profile.node.arch, spec["run_root"]))
    # Every link of the collective proves this per-job secret (it travels in submitit's pickle,
    # which run_probe writes under umask 077).
    spec["collective_secret"] = secrets.token_hex(32)
    user = node_excludes.load(profile.name)
    exclude = tuple(dict.fromkeys([*profile.slurm.exclude_nodes, *(hp.exclude_nodes if hp else []), *user.nodes]))
    if user.nodes:
        notes.append(f"the job avoids {', '.join(user.nodes)} ({user.path}; hpcrl clusters exclude --list)")
    return Target(
        profile,
        partition or (hp.partition if hp else None) or profile.slurm.default_partition,
        hp.account if hp else None,
        hp.qos if hp else None,
        spec,
        _disk_need_gib(rp) if rp else None,
        tuple(notes),
        exclude,
    )


def stack_spec(cfg: Any, rp: Any, arch: str, run_root: str) -> dict[str, Any]:
    """What the probe needs to run the job's own stack check (hpcrl/runtime/stack.py) for the run's
    backend: the expectation, the check's source files, the driver's arguments where a plan was made
    (their run directory a stand-in: the dry parse writes nothing), and the modules to import."""
    from hpcrl.planning.backends import get_backend, stack_expect
    from hpcrl.contract import RAY_TOKEN_MIN
    from hpcrl.runtime import stack, stack_parse

    backend = get_backend(cfg.hpcrl.backend)
    expect = stack_expect.run_expectation(cfg, arch, RAY_TOKEN_MIN if backend.uses_ray else None)
    if expect is None:
        return {}
    argv = stack_expect.driver_argv(backend.driver_command(rp), f"{run_root}/preflight-run") if rp else []
    return {
        "stack_expect": expect,
        "stack_argv": argv,
        "stack_files": {Path(str(m.__file__)).name: Path(str(m.__file__)).read_text() for m in (stack, stack_parse)},
        "modules": list(dict.fromkeys(["torch", *(p["module"] for p in expect["packages"])])),
    }


def _folder(explicit: str | None, t: Target) -> Path:
    """submitit's folder: must be on a filesystem the compute node shares (run root, else home)."""
    if explicit:
        return Path(explicit).expanduser()
    raw = os.path.expandvars(os.path.expanduser(t.spec["run_root"]))
    if "$" not in raw:
        try:
            Path(raw).mkdir(parents=True, exist_ok=True)
            return Path(tempfile.mkdtemp(prefix="preflight-", dir=raw))
        except OSError:
            pass
    from platformdirs import user_cache_dir

    base = Path(user_cache_dir("hpcrl")) / "preflight"
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=base))


def run_probe(
    t: Target, *, nodes: int = 1, folder: str | None = None, wait_s: float = 900, time_min: int = 15
) -> tuple[list[dict], list[dict], str]:
    """Submit the probe to `nodes` nodes (one task each) with submitit; returns the reports,
    the tasks that gave none ({"task", "node" (None when Slurm no longer says), "why"}), and the
    job id."""
    try:
        import cloudpickle
        import submitit
    except ImportError as exc:
        raise HpcrlError(f"preflight needs submitit ({exc}); pip install submitit") from None
    from hpcrl.runtime import preflight_gpu, preflight_probe

    if nodes < 1:
        raise HpcrlError(f"--nodes {nodes}: give 1 or more")
    if t.profile.max_nodes and nodes > t.profile.max_nodes:
        raise HpcrlError(f"--nodes {nodes}: {t.profile.name} allows at most {t.profile.max_nodes} nodes per job")
    slurm._run(["sbatch", "--version"])  # the one-line "no Slurm here" error before submitit's own
    where = _folder(folder, t)
    ex = submitit.SlurmExecutor(folder=str(where), max_num_timeout=0)
    p = t.profile
    params: dict[str, Any] = {"job_name": "hpcrl-preflight", "time": time_min, "nodes": nodes, "ntasks_per_node": 1}
    # The GPUs in the site's style, as the rendered script asks (hpcrl/contract.py); submitit has no --gpus.
    name, value = contract.gpu_request(p.slurm.gpu_request, p.gpu.count_per_node, nodes)
    number = int(value) if value.isdigit() else value
    if name == "gpus":
        params["additional_parameters"] = {"gpus": number}
    else:
        params[name.replace("-", "_")] = number
    for key, given in (
        ("partition", t.partition),
        ("account", t.account),
        ("qos", t.qos),
        ("constraint", p.slurm.constraint),
        ("exclude", ",".join(t.exclude)),
    ):
        if given:
            params[key] = given
    if p.slurm.exclusive:
        params["exclusive"] = True
    ex.update_parameters(**params)
    # By value, so the compute node needs only submitit, not this hpcrl.
    for mod in (preflight_gpu, preflight_probe, contract):
        cloudpickle.register_pickle_by_value(mod)
    old_umask = os.umask(0o077)  # the pickle holds the collective's secret: this user's eyes only
    try:
        job = ex.submit(preflight_probe.probe, t.spec)
    except Exception as exc:  # submitit wraps sbatch's refusal in its own error types
        text = str(exc).strip().splitlines()
        raise SlurmError(f"sbatch refused the preflight job: {text[-1] if text else exc}") from None
    finally:
        os.umask(old_umask)
        for mod in (preflight_gpu, preflight_probe, contract):
            cloudpickle.unregister_pickle_by_value(mod)
    tasks = [job.task(i) for i in range(nodes)] if nodes > 1 else [job]
    _wait(job.job_id, [tk.paths.result_pickle for tk in tasks], wait_s, job.paths.stderr)
    reports: list[dict] = []
    lost: list[dict[str, Any]] = []
    for i, tk in enumerate(tasks):
        try:
            reports.append(tk.result())
        except Exception as exc:
            lost.append(
                {"task": i, "node": None, "why": f"{str(exc).strip().splitlines()[-1][:200]} (see {tk.paths.stderr})"}
            )
    if lost:  # one task per node: task i ran on the job's i-th node
        names = slurm.job_nodes(job.job_id)
        for entry in lost:
            if len(names) == nodes:
                entry["node"] = names[entry["task"]]
    if not folder and not lost:  # our own scratch folder: its logs matter only when something failed
        shutil.rmtree(where, ignore_errors=True)
    return reports, lost, job.job_id


def _wait(job_id: str, results: list[Path], wait_s: float, stderr: Path) -> None:
    """Our own wait: submitit's would ask sacct, which has no data when accounting is off."""
    deadline, next_ask = time.monotonic() + wait_s, 0.0
    while not all(r.exists() for r in results):
        if time.monotonic() > deadline:
            slurm.cancel(job_id)
            raise HpcrlError(
                f"preflight job {job_id} gave no answer within {wait_s:.0f} s (cancelled); "
                "the partition may be busy: try --partition or --wait"
            )
        if time.monotonic() >= next_ask:
            st = slurm.job_states([job_id])[job_id]
            if st.terminal:
                time.sleep(2)  # the result files may land just after the job ends
                if not any(r.exists() for r in results):
                    raise HpcrlError(f"preflight job {job_id} ended {st.state} without a result; see {stderr}")
                return
            next_ask = time.monotonic() + 5
        time.sleep(0.5)


def preflight(
    cluster: str | None = None,
    partition: str | None = None,
    config: str | None = None,
    *,
    nodes: int = 1,
    folder: str | None = None,
    wait_s: float = 900,
    write_exclude: bool = False,
) -> dict:
    """`hpcrl preflight`: run the job, judge every node and the collective, and with write_exclude
    add the failing nodes to the cluster's exclude list. Returns the --json object."""
    from hpcrl.jobs.preflight_fabric import summarize

    t = target(cluster, partition, config)
    reports, lost, job_id = run_probe(t, nodes=nodes, folder=folder, wait_s=wait_s)
    out = summarize(reports, t, lost, job_id)
    if write_exclude and out["failing_nodes"]:
        why = {
            n["node"]: f"preflight job {job_id}: {n['why']}"[:300]
            for n in out["nodes"]
            if n["node"] in out["failing_nodes"]
        }
        ex, added = node_excludes.add(t.profile.name, why)
        out["exclude"] = {"file": str(ex.path), "added": added, "nodes": list(ex.nodes)}
    elif write_exclude:
        ex = node_excludes.load(t.profile.name)
        out["exclude"] = {"file": str(ex.path), "added": [], "nodes": list(ex.nodes)}
    return out


__all__ = ["Check", "Target", "cuda_check", "evaluate", "preflight", "ray_check", "run_probe", "target"]
