"""The sbatch script of a run plan: pure, deterministic text from `templates/sbatch.sh.j2`.

Same plan in, byte-identical script out: no clock, no host, no environment is read. Every
value a user wrote reaches the script through a quoting filter (hpcrl/shell.py); the only
text emitted verbatim is shell the user wrote as shell (`hpcrl.env_setup`, profile `setup`).
"""

from __future__ import annotations

import json
import re
import shlex
from functools import lru_cache
from pathlib import Path

import jinja2

from hpcrl import __version__, contract
from hpcrl.errors import ConfigError
from hpcrl.memory import constants as C
from hpcrl.planning.backends import stack_expect
from hpcrl.planning.run_plan import RunPlan
from hpcrl.rendering import driver_cadence
from hpcrl.rendering.sbatch_options import check_run_name, cluster_label, exclude_nodes, run_root, sbatch_options
from hpcrl.rendering.template_cache import bytecode_cache
from hpcrl.resources import data_dir
from hpcrl.shell import comment_safe, shq, shq_path

TEMPLATE = "sbatch.sh.j2"
CONTAINER_RUNTIMES = ("apptainer", "singularity")
# Ray's socket paths must stay under 107 bytes: <temp>/session_<date>_<time>_<pid>/sockets/plasma_store
# adds up to 64 characters to Ray's temp dir; the script falls back to /tmp past this length.
RAY_TEMP_MAX = 40
# The first Ray that honours RAY_AUTH_MODE=token; older ones ignore it silently (DESIGN.md).
RAY_TOKEN_MIN = (2, 52)
# `ray start` tries per node before the job gives up (NeMo-RL's ray.sub retries the head 3 times).
RAY_START_ATTEMPTS = 3
# Nodes of one host that start Ray at once before ray.start_stagger_s applies. 1: every node after
# the head waits. With 4 (the first four at once) the local-dev 8-node bring-up failed under load
# where staggering every node had passed (benchmarks/results/bringup_nodes.jsonl).
STAGGER_FREE_SLOTS = 1


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        # Shell has `${#array[@]}`; Jinja's default comment marker `{#` would eat it.
        comment_start_string="<#",
        comment_end_string="#>",
        bytecode_cache=bytecode_cache(),
    )
    env.filters["shq"] = shq
    env.filters["shq_path"] = shq_path
    env.filters["comment"] = comment_safe
    env.filters["word_count"] = lambda text: len(shlex.split(text))  # shell words, as bash will split them
    return env


def _container(rp: RunPlan) -> list[str] | None:
    image = rp.config.hpcrl.container
    if not image:
        return None
    runtime = rp.profile.container.runtime
    if runtime not in CONTAINER_RUNTIMES:
        raise ConfigError(
            f"hpcrl.container is set but cluster {rp.profile.name}'s container runtime is {runtime!r}; "
            f"render supports {', '.join(CONTAINER_RUNTIMES)} (or start your container in hpcrl.env_setup)"
        )
    words = [runtime, "exec", *(shq(f) for f in rp.profile.container.flags)]
    for var in ("HPCRL_RUN_DIR", "HPCRL_NODE_LOCAL", "HF_HOME"):
        words += ["--bind", f'"${var}"']
    return words + [shq_path(image)]


def umask(rp: RunPlan) -> str:
    """The script's umask: the job's files are the user's alone unless the group shares runs."""
    return "027" if rp.profile.storage.share_runs_with_group else "077"


def _port_word(text: str, var: str) -> str:
    """A shell word for text in which "{port}" is the service's port variable."""
    parts = str(text).split("{port}")
    return f'"${{{var}}}"'.join(shq(part) if part else "" for part in parts) or "''"


def _services(rp: RunPlan) -> list[dict]:
    """The services the script starts on every node, as the template needs them."""
    out = []
    for s in rp.backend.services(rp.config):
        var = "HPCRL_" + re.sub(r"[^A-Za-z0-9]", "_", s.name).upper() + "_PORT"
        out.append({
            "name": s.name, "fn": re.sub(r"[^A-Za-z0-9]", "_", s.name), "var": var, "port": s.port,
            "words": " ".join(_port_word(w, var) for w in s.command), "health": s.health_path,
            "env": [(k, _port_word(v, var)) for k, v in s.env], "why": s.why,
            "timeout_s": rp.config.hpcrl.code_server_timeout_s,
        })
    return out


def _gpumon_args(rp: RunPlan) -> str:
    rule = rp.profile.idle_gpu_policy
    if rule is None:
        return ""
    return f" --min-mean-power-w {rule.min_mean_power_w:g} --grace-minutes {rule.grace_minutes:g}"


def _driver_lines(rp: RunPlan) -> tuple[list[str], list[tuple[str, str]], int | None]:
    """The backend's driver command, one shell-quoted line per flag or override; its environment
    (name, shell value); and the planned checkpoint interval that "$CKPT_EVERY" carries in them (None: none does)."""
    lines, in_line = driver_cadence.interval_words(rp, rp.backend.driver_command(rp))
    env, in_env = driver_cadence.env_words(rp)
    return lines, env, driver_cadence.adjustable_every(rp) if in_line or in_env else None


def _stack_expect(rp: RunPlan, smoke: bool) -> str | None:
    """The job's stack check expectation (compact JSON); None for a smoke test (its driver is hpcrl's),
    hpcrl.stack_check off, or a backend without install facts (custom scripts)."""
    if smoke or rp.config.hpcrl.stack_check == "off":
        return None
    ray_min = RAY_TOKEN_MIN if rp.backend.uses_ray else None
    expect = stack_expect.run_expectation(rp.config, rp.profile.node.arch, ray_min)
    return json.dumps(expect, sort_keys=True, separators=(",", ":")) if expect else None


def plan_summary(rp: RunPlan) -> list[str]:
    """The plan in a few comment lines: layout, per-GPU memory, step estimate."""
    lay, w, p = rp.layout, rp.workload, rp.profile
    d = lay.to_dict()
    eng = lay.memory.engine
    if lay.colocated:
        gpus = f"all {lay.learner_gpus} GPUs train and generate (colocated)"
        mem = lay.memory.colocated_summary()
    else:
        gpus = f"{lay.learner_gpus} learner GPUs, {lay.engines * lay.tp} engine GPUs, {lay.idle_gpus} idle"
        mem = (f"learner peak {d['learner_peak_gib']:.1f} GiB/GPU of {d['gpu_usable_gib']:.1f} usable; "
               f"engine {eng.weights / C.GIB:.1f} GiB weights + {d['engine_kv_cache_gib']:.1f} GiB KV cache per GPU; "
               f"host peak {d['host_peak_gib']:.0f} GiB/node")
    return [
        f"model {w.model.name}: {w.seqs} sequences of {w.seq_len} tokens per step, {rp.backend.tokens_text(rp)}",
        (f"{p.job_gpus} {p.gpu.model} ({p.gpu.memory_gib:g} GiB) of one node, not the whole node (--gpus "
         f"{p.job_gpus}): {gpus}" if p.job_gpus else f"{rp.nodes} x {p.gpu.count_per_node} {p.gpu.model} "
         f"({p.gpu.memory_gib:g} GiB): {gpus}"),
        rp.backend.summary(rp),
        mem,
        f"step {lay.step.text()} (generation {lay.step.generation_s:.0f} s, training {lay.step.training_s:.0f} s), "
        f"bottleneck {lay.bottleneck}; the checkpoint cadence and time-limit lead use the upper estimate",
        f"step basis: {lay.step.basis}",
    ] + ([rp.cadence.summary(rp.backend.checkpoint_key, rp.config.hpcrl.max_lost_minutes)] if rp.cadence else [])


def plan_json(rp: RunPlan, *, smoke: bool = False) -> str:
    """hpcrl/plan.json: what the script was rendered from (stable keys, sorted)."""
    lay = rp.layout
    data = {
        "hpcrl_version": __version__,
        "cluster": cluster_label(rp),
        "config": Path(rp.config.source).name if rp.config.source else None,
        "config_digest": rp.config.digest(),
        "run_name": rp.config.hpcrl.run_name,
        "nodes": rp.nodes,
        "gpus_per_node": rp.profile.gpu.count_per_node,
        "model": rp.workload.model.name,
        "smoke": smoke,
        "layout": lay.to_dict(),
        "memory": lay.memory.to_dict(),
        "warnings": list(rp.warnings),
    }
    if (cadence := driver_cadence.cadence_record(rp)) is not None:
        data["cadence"] = cadence
    if rp.backend.names_itself_in_plan:
        data["backend"] = rp.backend.name
        data["backend_args"] = rp.backend.layout_args(rp)
    if rp.config.hpcrl.reward_keys:  # the watchdog's reward keys: `hpcrl report` reads the metrics with them
        data["reward_keys"] = list(rp.config.hpcrl.reward_keys)
    if rp.config.hpcrl.loss_keys:
        data["loss_keys"] = list(rp.config.hpcrl.loss_keys)
    if "zero_reward_steps" in rp.config.hpcrl.model_fields_set:  # the report's "reward key never seen" window
        data["zero_reward_steps"] = rp.config.hpcrl.zero_reward_steps
    if rp.profile.job_gpus is not None:  # a job with part of a node (--gpus N)
        data["job_gpus"] = rp.profile.job_gpus
    return json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"


def _context(rp: RunPlan, smoke: bool) -> dict:
    hp, prof = rp.config.hpcrl, rp.profile
    lay = rp.layout
    run_name = check_run_name(hp.run_name)
    backend = rp.backend
    root = run_root(rp)
    node_local = prof.storage.node_local.path
    driver_lines, driver_env, ckpt_every = _driver_lines(rp)
    timing = backend.timing_facts
    return {
        "version": __version__,
        "cluster": cluster_label(rp),
        "config_name": Path(rp.config.source).name if rp.config.source else "-",
        "digest": rp.config.digest(),
        "summary": plan_summary(rp),
        "framework": backend.target_version(hp)[0],
        "assumptions": list(rp.assumptions),
        "warnings": list(rp.warnings),
        "user_exclude": ", ".join(rp.user_exclude),
        "user_exclude_file": rp.user_exclude_file,
        "sbatch": sbatch_options(rp),
        "smoke": smoke,
        "nodes": rp.nodes,
        "gpus": prof.gpu.count_per_node,
        # The worker step asks for the GPUs of every node but the head.
        "worker_gpu_request": contract.gpu_request_option(prof.slurm.gpu_request, prof.gpu.count_per_node,
                                                          rp.nodes - 1) if rp.nodes > 1 else "",
        "ray_cpus": prof.ray.num_cpus_per_node,
        "object_store_bytes": int(prof.ray.object_store_gib * C.GIB) if prof.ray.object_store_gib else None,
        # The last of the nodes sharing one host starts this much later: its wait is added.
        "join_timeout_s": prof.ray.join_timeout_s + prof.ray.start_stagger_s * max(0, rp.nodes - STAGGER_FREE_SLOTS),
        "ray_start_stagger_s": prof.ray.start_stagger_s,
        "stagger_free_slots": STAGGER_FREE_SLOTS,
        "ray_ports": prof.ray.ports,
        "signal_before_end_s": prof.slurm.signal_before_end_s,
        "grace_s": max(30, prof.slurm.signal_before_end_s - 120),
        "run_root": root.rstrip("/") or "/",
        "run_name": run_name,
        "node_local": node_local,
        "ray_temp_max": RAY_TEMP_MAX,
        "hf_home": prof.storage.hf_home,
        "modules": list(prof.modules),
        "profile_env": list(prof.env.items()),
        "profile_setup": list(prof.setup),
        "env_setup": list(hp.env_setup),
        "container": _container(rp),
        "workdir": hp.workdir,
        "python": hp.python,
        "entry_point": hp.entry_point,
        "entry_module": backend.runs_module(hp),
        # A framework's own entry module, else a user's module (the custom backend's `python -m`).
        "module_owner": backend.name if backend.entry_is_module else "its package",
        "launcher": "".join(shq(w) + " " for w in backend.launcher_words(rp)),
        "ray": backend.uses_ray,
        "launcher_module": "torch.distributed.run" if "torch.distributed.run" in backend.launcher_words(rp) else "",
        "loss_keys": list(hp.loss_keys),
        "job_cpus": prof.node.cpu_cores,
        "backend": backend.name,
        "driver_label": backend.label,
        "driver_env": driver_env,
        "override_style": backend.command_facts.style,
        "driver_lines": driver_lines,
        "ckpt_every": ckpt_every,
        "ckpt_var": driver_cadence.VAR,
        "checkpoint_key": backend.checkpoint_key,
        "timing_words": [shq(w) for w in timing.words()],
        "marker_after_step": timing.marker_after_step,
        "stack_expect": _stack_expect(rp, smoke),
        "max_restarts": hp.max_restarts,
        "no_resume": shq(rp.no_resume) if rp.no_resume else "",
        "zero_reward_steps": hp.zero_reward_steps,
        "hang_minutes": f"{hp.hang_minutes:g}",
        "grad_norm_steps": hp.grad_norm_steps,
        "zero_variance_steps": hp.zero_variance_steps,
        "reward_keys": list(hp.reward_keys),
        "learners": " ".join([str(lay.learners_per_node)] * lay.learner_nodes),
        "engines": lay.engines,
        "tp": lay.tp,
        "smoke_placement": backend.smoke_facts.comment,
        "smoke_extra": "".join(" " + shq(w) for w in backend.smoke_words(rp)) if backend.uses_ray else "",
        "plan_json": plan_json(rp, smoke=smoke),
        "gpumon_args": _gpumon_args(rp),
        "kill_wait_s": prof.slurm.kill_wait_s,
        "umask": umask(rp),
        "umask_text": ("readable by the user's group, writable by the user only (profile "
                       "storage.share_runs_with_group)" if prof.storage.share_runs_with_group
                       else "the user's alone (umask 077)"),
        "ray_min_minor": RAY_TOKEN_MIN[1],
        "ray_metrics": prof.ray.metrics,
        "services": _services(rp),
        "max_failure_restarts": hp.max_failure_restarts,
        "failure_backoff_s": hp.failure_backoff_s,
        "checkpoint_marker": backend.checkpoint_marker,
        "signal_lead_s": rp.cadence.lead_s if rp.cadence else prof.slurm.signal_before_end_s,
        "rendered_exclude": ",".join(exclude_nodes(rp)),
        "ray_start_attempts": RAY_START_ATTEMPTS,
        "ray_log_keep_mib": prof.ray.log_keep_mib,
        "run_root_shared": prof.storage.run_root_shared,
        **_contract_context(),
    }


def _contract_context() -> dict:
    """The job contract's tables and names, as the templates read them (hpcrl/contract.py)."""
    c = contract
    return {
        "reason_case": c.reason_case(),
        "stack_mismatch": {"reason": c.STACK_MISMATCH[0], "code": c.STACK_MISMATCH[1]},
        "continue_case": c.continue_case(),
        "slurm_end_pattern": c.slurm_end_pattern(),
        "crashed": c.CRASHED,
        "run_dir_ends": {"full": c.RUN_DIR_FULL, "unwritable": c.RUN_DIR_UNWRITABLE},
        "node_local_unsafe": c.NODE_LOCAL_UNSAFE,
        "ray_died": c.RAY_DIED,
        "breaker_codes": ", ".join(str(code) for code, _ in sorted(c.BREAKERS.values())),
        "ports": {"base": c.port_base_shell(), "block": c.PORT_BLOCK, "service": c.SERVICE_PORT,
                  "service_slots": c.SERVICE_SLOTS, "node_slots": c.NODE_SLOTS, "draws": c.PORT_DRAWS,
                  "head_flags": c.HEAD_PORT_FLAGS, "node_flags": c.NODE_PORT_FLAGS, "metric_vars": c.METRIC_PORT_VARS},
        "layout": c.run_dir_layout(),
        "safety": _safety_context(),
    }


def _safety_context() -> dict:
    """Shared nodes' names and limits (hpcrl/contract.py): the job's own refusals, the watchdog's heartbeat."""
    c = contract
    return {"run_dir_unsafe": c.RUN_DIR_UNSAFE, "node_local_taken": c.NODE_LOCAL_TAKEN,
            "watchdog_hung": {"reason": c.WATCHDOG_HUNG[0], "code": c.WATCHDOG_HUNG[1]},
            "beat_s": c.WATCHDOG_BEAT_S, "quiet_s": c.WATCHDOG_QUIET_S, "mktemp": c.mktemp_suffix(),
            "fixed_code_case": c.fixed_code_case()}


def check_script(run_plan: RunPlan, *, smoke: bool = False) -> None:
    """Every check render_script makes, without the template or its cache: `hpcrl plan` refuses what render would."""
    _context(run_plan, smoke)


def render_script(run_plan: RunPlan, *, smoke: bool = False) -> str:
    """The sbatch script for run_plan; with smoke, the driver is hpcrl's Ray smoke test."""
    return _environment().get_template(TEMPLATE).render(**_context(run_plan, smoke))
