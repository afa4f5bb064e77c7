"""`hpcrl preflight`: ask one compute node, through submitit, whether a run can work there.

The probe (hpcrl/runtime/preflight_probe.py) runs on the node; this module builds what it
needs from the profile and run config, submits it, waits, and turns its report into rows of
(check, status, detail). Status is ok, warn, fail or info; only `fail` makes preflight exit 1.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from hpcrl import slurm
from hpcrl.errors import HpcrlError, SlurmError
from hpcrl.profiles import ClusterProfile, resolve_profile

MEMORY_TOLERANCE = 0.05  # NVML's total vs the profile's figure: drivers reserve a little


class Check(NamedTuple):
    check: str
    status: str
    detail: str


class Target(NamedTuple):
    """Where the probe runs and what it looks for."""

    profile: ClusterProfile
    partition: str | None
    account: str | None
    qos: str | None
    spec: dict[str, Any]
    disk_need_gib: float | None
    notes: tuple[str, ...]


def _disk_need_gib(rp: Any) -> float | None:
    """Peak checkpoint GiB of the plan (hpcrl.disk), or None where it cannot be worked out."""
    try:
        from hpcrl import disk
        from hpcrl.backends.oi_args import default

        cfg = rp.config

        def arg(name: str):
            return cfg.args[name] if name in cfg.args else default(name, cfg.hpcrl.arg_layout)

        per_step = max(1, int(arg("num_unique_prompts_rollout")) * int(arg("num_samples_per_prompt_rollout")))
        plan = disk.plan_disk(
            rp.workload.model, n_learners=rp.layout.learner_gpus, lora_rank=rp.workload.lora_rank,
            save_freq=int(arg("save_freq")), checkpoint_state_freq=int(arg("checkpoint_state_freq")),
            keep_last_n_checkpoints=int(arg("keep_last_n_checkpoints")),
            total_steps=max(1, int(arg("total_episodes")) // per_step),
        )
        return plan.peak_bytes / disk.GIB
    except (ImportError, HpcrlError, KeyError, ValueError):  # preflight still reports free space
        return None


def target(cluster: str | None = None, partition: str | None = None, config: str | None = None) -> Target:
    """Profile, partition and probe spec from --cluster/--partition and an optional run config."""
    notes: list[str] = []
    cfg = rp = None
    if config:
        from hpcrl.config import load_run_config
        from hpcrl.run_plan import make_run_plan

        try:
            rp = make_run_plan(config, cluster=cluster)
            cfg = rp.config
        except HpcrlError as exc:  # the probe is still worth running without a plan
            cfg = load_run_config(config)  # a config that is itself wrong fails here, as it should
            notes.append(f"plan not made ({exc}); disk need unknown")
    profile = rp.profile if rp else resolve_profile(cluster or (cfg.hpcrl.cluster if cfg else None))
    hp = cfg.hpcrl if cfg else None
    spec = {
        "env": dict(profile.env, HF_HOME=profile.storage.hf_home),
        "hf_home": profile.storage.hf_home,
        "node_local": profile.storage.node_local.path,
        "run_root": (hp.run_root if hp and hp.run_root else profile.storage.run_root.path),
        "model": cfg.model_name if cfg else None,
        "python": hp.python if hp else "python",
        "env_setup": list(profile.setup) + [f"module load {m} 2>/dev/null || true" for m in profile.modules]
        + (list(hp.env_setup) if hp else []),
        "workdir": hp.workdir if hp else None,
    }
    return Target(profile, partition or (hp.partition if hp else None) or profile.slurm.default_partition,
                  hp.account if hp else None, hp.qos if hp else None, spec,
                  _disk_need_gib(rp) if rp else None, tuple(notes))


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


def run_probe(t: Target, *, folder: str | None = None, wait_s: float = 900, time_min: int = 10) -> dict:
    """Submit the probe to one node with submitit and return its report."""
    try:
        import cloudpickle
        import submitit
    except ImportError as exc:
        raise HpcrlError(f"preflight needs submitit ({exc}); pip install submitit") from None
    from hpcrl.runtime import preflight_probe

    slurm._run(["sbatch", "--version"])  # the one-line "no Slurm here" error before submitit's own
    # By value, so the compute node needs only submitit, not this hpcrl.
    cloudpickle.register_pickle_by_value(preflight_probe)
    where = _folder(folder, t)
    ex = submitit.SlurmExecutor(folder=str(where), max_num_timeout=0)
    p = t.profile
    params: dict[str, Any] = {"job_name": "hpcrl-preflight", "time": time_min, "nodes": 1, "ntasks_per_node": 1}
    gpus = p.gpu.count_per_node
    if p.slurm.gpu_request == "gres":
        params["gres"] = f"gpu:{gpus}"
    elif p.slurm.gpu_request == "gpus":
        params["additional_parameters"] = {"gpus": gpus}
    else:
        params["gpus_per_node"] = gpus
    for key, value in (("partition", t.partition), ("account", t.account), ("qos", t.qos),
                       ("constraint", p.slurm.constraint)):
        if value:
            params[key] = value
    if p.slurm.exclusive:
        params["exclusive"] = True
    ex.update_parameters(**params)
    try:
        job = ex.submit(preflight_probe.probe, t.spec)
    except Exception as exc:  # submitit wraps sbatch's refusal in its own error types
        text = str(exc).strip().splitlines()
        raise SlurmError(f"sbatch refused the preflight job: {text[-1] if text else exc}") from None
    finally:
        cloudpickle.unregister_pickle_by_value(preflight_probe)
    # Our own wait: submitit's would ask sacct, which has no data when accounting is off.
    deadline, next_ask = time.monotonic() + wait_s, 0.0
    while not job.paths.result_pickle.exists():
        if time.monotonic() > deadline:
            slurm.cancel(job.job_id)
            raise HpcrlError(f"preflight job {job.job_id} gave no answer within {wait_s:.0f} s (cancelled); "
                             "the partition may be busy: try --partition or --wait")
        if time.monotonic() >= next_ask:
            st = slurm.job_states([job.job_id])[job.job_id]
            if st.terminal:
                time.sleep(2)  # the result file may land just after the job ends
                if not job.paths.result_pickle.exists():
                    raise HpcrlError(f"preflight job {job.job_id} ended {st.state} without a result; "
                                     f"see {job.paths.stderr}")
            next_ask = time.monotonic() + 5
        time.sleep(0.5)
    try:
        report = job.result()
    except Exception as exc:
        raise HpcrlError(f"the preflight probe failed on the node: {str(exc).strip().splitlines()[-1]}; "
                         f"see {job.paths.stderr}") from None
    if not folder:  # our own scratch folder: its logs matter only when something failed
        shutil.rmtree(where, ignore_errors=True)
    return report


def _major_minor(text: str) -> tuple[int, int] | None:
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def cuda_check(torch_cuda: str | None, driver_cuda: str | None) -> Check | None:
    """torch's CUDA build against the newest CUDA the node's driver runs: a newer major version
    cannot run (a cu130 wheel on a CUDA 12 driver); a newer minor version runs under CUDA's
    minor-version compatibility, except kernels compiled just in time from PTX."""
    if not torch_cuda or torch_cuda == "None" or not driver_cuda:
        return None
    built, driver = _major_minor(torch_cuda), _major_minor(driver_cuda)
    if built is None or driver is None:
        return None
    detail = f"torch built for CUDA {torch_cuda}, driver runs CUDA {driver_cuda}"
    if built[0] > driver[0]:
        return Check("cuda", "fail", f"{detail}: install a torch built for CUDA {driver[0]}.x (or older)")
    if built > driver:
        return Check("cuda", "warn", f"{detail}: runs by minor-version compatibility; kernels JIT-compiled "
                                     "from PTX (Triton, FlashInfer) may fail")
    return Check("cuda", "ok", detail)


def ray_check(version: str) -> Check:
    """Ray's version: below 2.52 it ignores RAY_AUTH_MODE=token, and the job script refuses to start it."""
    from hpcrl.render import RAY_TOKEN_MIN

    got = _major_minor(version)
    need = ".".join(map(str, RAY_TOKEN_MIN))
    if got is not None and got < RAY_TOKEN_MIN:
        return Check("import ray", "fail", f"{version}: Ray below {need} ignores token authentication (anyone on the "
                                           f"node could attach); the job script refuses it: install ray>={need}")
    return Check("import ray", "ok", f"{version} (token authentication needs >= {need})")


def evaluate(report: dict, t: Target) -> list[Check]:
    """The probe's report against the profile and plan."""
    p, rows = t.profile, []
    node = report.get("node", "?")
    rows.append(Check("node", "info", f"{node} (job {report.get('job_id')}, Python {report.get('python')})"))
    g = report["gpus"]
    want = f"{p.gpu.count_per_node} x {p.gpu.model} {p.gpu.memory_gib:.0f} GiB"
    if g["count"] == 0:
        why = f" ({g['error']})" if g.get("error") else ""
        rows.append(Check("gpus", "warn", f"no GPU on {node}{why}; profile {p.name} expects {want}"))
    else:
        devs = g["devices"]
        names = sorted({d["name"] for d in devs})
        mem = min(d["memory_gib"] for d in devs)
        problems = []
        if g["count"] < p.gpu.count_per_node:
            problems.append(f"{g['count']} GPUs, profile expects {p.gpu.count_per_node}")
        if mem < p.gpu.memory_gib * (1 - MEMORY_TOLERANCE):
            problems.append(f"{mem:.1f} GiB per GPU, profile assumes {p.gpu.memory_gib:.1f}")
        model_ok = any(p.gpu.model.lower().replace("-", " ") in n.lower().replace("-", " ") for n in names)
        detail = f"{g['count']} x {', '.join(names)} {mem:.1f} GiB; profile {want}"
        status = "fail" if problems else ("ok" if model_ok else "warn")
        rows.append(Check("gpus", status, "; ".join(problems) + f" ({detail})" if problems else detail))
    nl = report["node_local"]
    if nl.get("error"):
        rows.append(Check("node-local tmp", "fail", f"{nl.get('path')}: {nl['error']}"))
    else:
        ok = nl.get("writable")
        where = "" if nl.get("exists") else f" (not there yet; the job creates it in {nl['checked']})"
        rows.append(Check("node-local tmp", "ok" if ok else "fail", f"{nl['path']}: {nl['free_gib']:.1f} GiB free"
                          + where + ("" if ok else ", not writable")))
    rr = report["run_root"]
    if rr.get("error"):
        rows.append(Check("run root", "fail", f"{rr.get('path')}: {rr['error']}"))
    else:
        need = t.disk_need_gib
        status = "ok" if rr.get("writable") else "fail"
        detail = f"{rr['path']}: {rr['free_gib']:.1f} GiB free of {rr['total_gib']:.1f}"
        if not rr.get("exists"):
            detail += f" (not created yet; checked {rr['checked']})"
        if need is not None:
            detail += f"; plan needs {need:.1f} GiB"
            if rr["free_gib"] < need:
                status = "fail"
        else:
            detail += "; plan's disk need not known"
        rows.append(Check("run root", status, detail + ("" if rr.get("writable") else ", not writable")))
    m = report["model"]
    if not m.get("model"):
        rows.append(Check("model", "info", "not checked (pass --config RUN.yaml)"))
    else:
        rows.append(Check("model", "ok" if m["found"] else ("fail" if m.get("kind") == "path" else "warn"),
                          f"{m['model']}: {m['detail']}"))
    st = report["stack"]
    if st.get("error"):
        rows.append(Check("imports", "fail", st["error"]))
    modules = dict(st.get("modules", {}))
    torch_cuda = (modules.pop("torch.cuda", None) or [None])[0]
    for name, (version, err) in modules.items():
        rows.append(ray_check(version) if name == "ray" and version else
                    Check(f"import {name}", "ok" if version else "warn", version or err))
    cuda = cuda_check(torch_cuda, g.get("driver_cuda"))
    if cuda:
        rows.append(cuda)
    rows += [Check("note", "info", n) for n in t.notes]
    return rows


__all__ = ["Check", "Target", "cuda_check", "evaluate", "ray_check", "run_probe", "target"]
