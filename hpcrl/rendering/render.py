"""The sbatch script of a job description: pure, deterministic text from `templates/sbatch.sh.j2`.

The renderer formats hpcrl/planning/job_spec.py's JobSpec and asks nothing else: every question to
the framework backend and every check of a value was answered when the description was built
(hpcrl/planning/describe.py). Same description in, byte-identical script out: no clock, no host, no
environment is read. Every value a user wrote reaches the script through a quoting filter
(hpcrl/shell.py); the only text emitted verbatim is shell the user wrote as shell (`hpcrl.env_setup`,
profile `setup`).
"""

from __future__ import annotations

import json
import re
import shlex
from functools import lru_cache

import jinja2

from hpcrl import contract
from hpcrl.planning.job_spec import Container, JobSpec, Service, ShellWord, Step
from hpcrl.rendering.template_cache import bytecode_cache
from hpcrl.resources import data_dir
from hpcrl.shell import comment_safe, shq, shq_path

TEMPLATE = "sbatch.sh.j2"


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


def word(w: ShellWord) -> str:
    """A command word as the script writes it: quoted, or double-quoted where the shell expands it. A word with a
    comma is quoted too (CUDA_VISIBLE_DEVICES=0,1 in an array reads to a reader, and shellcheck, as a slip)."""
    if w.expand:
        return f'"{w.text}"'
    return shq(w.text) if "," not in w.text else "'" + w.text.replace("'", "'\"'\"'") + "'"


def _container(c: Container | None) -> list[str] | None:
    if c is None:
        return None
    words = [c.runtime, "exec", *(shq(f) for f in c.flags)]
    for var in c.binds:
        words += ["--bind", f'"${var}"']
    return words + [shq_path(c.image)]


def _port_word(text: str, var: str) -> str:
    """A shell word for text in which "{port}" is the service's port variable."""
    parts = str(text).split("{port}")
    return f'"${{{var}}}"'.join(shq(part) if part else "" for part in parts) or "''"


def _services(services: tuple[Service, ...]) -> list[dict]:
    """The services the script starts on every node, as the template needs them."""
    out = []
    for s in services:
        fn = re.sub(r"[^A-Za-z0-9]", "_", s.name)
        var = "HPCRL_" + fn.upper() + "_PORT"
        out.append(
            {
                "name": s.name,
                "fn": fn,
                "var": var,
                "port": s.port,
                "words": " ".join(_port_word(w, var) for w in s.command),
                "health": s.health_path,
                "env": [(k, _port_word(v, var)) for k, v in s.env],
                "why": s.why,
                "timeout_s": s.timeout_s,
            }
        )
    return out


def _variable(kind: str, name: str) -> str:
    """The shell variable of a step's host or port (the job description's `$HPCRL_<NAME>_<KIND>` words)."""
    return f"HPCRL_{re.sub(r'[^A-Za-z0-9]', '_', name).upper()}_{kind.upper()}"


def _step_lines(words: tuple[ShellWord, ...]) -> list[str]:
    """A step's command as the script writes it: a line per flag and its values."""
    lines: list[list[str]] = []
    for w in words:
        if not lines or w.text.startswith("--"):
            lines.append([])
        lines[-1].append(word(w))
    return [" ".join(line) for line in lines]


def _steps(steps: tuple[Step, ...]) -> list[dict]:
    """The job's steps as the template needs them."""
    out = []
    for st in steps:
        fn = re.sub(r"[^A-Za-z0-9]", "_", st.role)
        out.append(
            {
                "role": st.role,
                "fn": fn,
                "nodes": list(st.nodes),
                "driver": st.driver,
                "health": st.health,
                "gpus_per_node": st.gpus_per_node,
                "node_names": "node" + ("s " if len(st.nodes) > 1 else " ") + ", ".join(map(str, st.nodes)),
                "node_list": ",".join(f"$(job_node {i})" for i in st.nodes),
                "host_var": _variable("host", st.role),
                "ports": [{"name": p, "var": _variable("port", p)} for p in st.ports],
                "health_var": _variable("port", st.health.port) if st.health else "",
                "lines": _step_lines(st.command),
                "resume": st.resume,
            }
        )
    return out


def _gpumon_args(job: JobSpec) -> str:
    rule = job.gpu_monitor
    if rule.min_mean_power_w is None:
        return ""
    return f" --min-mean-power-w {rule.min_mean_power_w:g} --grace-minutes {rule.grace_minutes:g}"


def plan_json(job: JobSpec) -> str:
    """hpcrl/plan.json as the script writes it (stable keys, sorted)."""
    return json.dumps(job.plan, indent=2, sort_keys=True) + "\n"


def _context(job: JobSpec) -> dict:
    """The template's names for the description's values."""
    h, env, ray, drv, smoke = job.header, job.environment, job.ray, job.driver, job.smoke
    ckpt, wd = job.checkpoints, job.watchdog
    launcher = drv.launcher if drv else ()
    steps = _steps(job.steps)
    return {
        "version": h.hpcrl_version,
        "cluster": h.cluster,
        "config_name": h.config_name,
        "digest": h.config_digest,
        "summary": list(h.summary),
        "framework": h.framework,
        "assumptions": list(h.assumptions),
        "warnings": list(h.warnings),
        "user_exclude": ", ".join(h.user_exclude),
        "user_exclude_file": h.user_exclude_file,
        "sbatch": job.slurm.options(),
        "smoke": smoke is not None,
        "phases": job.phases,
        "nodes": job.nodes,
        "gpus": job.gpus_per_node,
        "worker_gpu_request": ray.worker_gpu_request if ray else "",
        "ray_cpus": ray.cpus_per_node if ray else None,
        "object_store_bytes": ray.object_store_bytes if ray else None,
        "join_timeout_s": ray.join_timeout_s if ray else 0,
        "ray_start_stagger_s": ray.start_stagger_s if ray else 0,
        "stagger_free_slots": ray.stagger_free_slots if ray else 1,
        "ray_ports": list(job.port_range),
        "port_range": list(job.port_range),
        "signal_before_end_s": job.signal_before_end_s,
        "grace_s": job.grace_s,
        "run_root": job.run_dir.root,
        "run_name": job.run_dir.name,
        "node_local": job.run_dir.node_local,
        "ray_temp_max": ray.temp_max if ray else 0,
        "hf_home": env.hf_home,
        "modules": list(env.modules),
        "profile_env": list(env.profile_env),
        "profile_setup": list(env.profile_setup),
        "env_setup": list(env.env_setup),
        "container": _container(env.container),
        "workdir": drv.workdir if drv else "",
        "python": drv.python if drv else "",
        "entry_point": drv.entry_point if drv else "",
        "entry_module": drv.entry_module if drv else False,
        "module_owner": drv.module_owner if drv else "",
        "launcher": "".join(shq(w) + " " for w in launcher),
        "ray": ray is not None,
        "launcher_module": drv.launcher_module if drv else "",
        "loss_keys": list(wd.loss_keys),
        "job_cpus": job.cpus_per_node,
        "backend": smoke.backend if smoke else drv.backend if drv else "",
        "driver_label": drv.label if drv else "",
        "driver_env": [(k, word(v)) for k, v in drv.env] if drv else [],
        "override_style": drv.override_style if drv else "flags",
        "driver_lines": [" ".join(word(w) for w in line) for line in drv.args] if drv else [],
        "ckpt_every": ckpt.every,
        "ckpt_var": ckpt.variable,
        "checkpoint_key": ckpt.key,
        "timing_words": [shq(w) for w in wd.timing_words],
        "marker_after_step": wd.marker_after_step,
        "stack_expect": json.dumps(job.stack, sort_keys=True, separators=(",", ":")) if job.stack else None,
        "max_restarts": job.chain.max_restarts,
        "no_resume": shq(job.chain.no_resume) if job.chain.no_resume else "",
        "zero_reward_steps": wd.zero_reward_steps,
        "hang_minutes": f"{wd.hang_minutes:g}",
        "grad_norm_steps": wd.grad_norm_steps,
        "zero_variance_steps": wd.zero_variance_steps,
        "reward_keys": list(wd.reward_keys),
        "learners": smoke.learners if smoke else "",
        "engines": smoke.engines if smoke else 0,
        "tp": smoke.tp if smoke else 1,
        "smoke_placement": smoke.placement if smoke else "",
        "smoke_extra": "".join(" " + shq(w) for w in smoke.words) if smoke else "",
        "plan_json": plan_json(job),
        "gpumon_args": _gpumon_args(job),
        "kill_wait_s": job.kill_wait_s,
        "umask": env.umask,
        "umask_text": (
            "readable by the user's group, writable by the user only (profile storage.share_runs_with_group)"
            if env.shared_with_group
            else "the user's alone (umask 077)"
        ),
        "ray_min_minor": ray.min_version[1] if ray else contract.RAY_TOKEN_MIN[1],
        "ray_metrics": ray.metrics if ray else False,
        "services": _services(job.services),
        "steps": steps,
        "driver_step": next((st for st in steps if st["driver"]), None),
        "step_background": next((st["role"] for st in steps if not st["driver"]), ""),
        "files": list(job.files),
        "step_nodes": sorted({i for st in job.steps for i in st.nodes}),
        "step_node_list": ",".join(f"$(job_node {i})" for i in sorted({i for st in job.steps for i in st.nodes})),
        "max_failure_restarts": job.chain.max_failure_restarts,
        "failure_backoff_s": job.chain.failure_backoff_s,
        "checkpoint_marker": ckpt.marker,
        "signal_lead_s": ckpt.signal_lead_s,
        "rendered_exclude": ",".join(job.slurm.exclude),
        "ray_start_attempts": ray.start_attempts if ray else 0,
        "start_failed": "ray-start-failed" if ray else contract.START_FAILED,
        "ray_log_keep_mib": job.run_dir.ray_log_keep_mib,
        "run_root_shared": job.run_dir.shared_root,
        **_contract_context(),
    }


def _contract_context() -> dict:
    """The job contract's tables and names, as the templates read them (hpcrl/contract.py)."""
    c = contract
    return {
        "reason_case": c.reason_case(),
        "stack_mismatch": {"reason": c.STACK_MISMATCH[0], "code": c.STACK_MISMATCH[1]},
        "stack_unchecked": {"event": c.STACK_UNCHECKED[0], "code": c.STACK_UNCHECKED[1], "name": c.STACK_EVENT},
        "continue_case": c.continue_case(),
        "slurm_end_pattern": c.slurm_end_pattern(),
        "crashed": c.CRASHED,
        "run_dir_ends": {"full": c.RUN_DIR_FULL, "unwritable": c.RUN_DIR_UNWRITABLE},
        "node_local_unsafe": c.NODE_LOCAL_UNSAFE,
        "ray_died": c.RAY_DIED,
        "step_end_grace_s": c.STEP_END_GRACE_S,
        "ray_stop_s": c.RAY_STOP_S,
        "reap_wait_s": c.REAP_WAIT_S,
        "breaker_codes": ", ".join(str(code) for code, _ in sorted(c.BREAKERS.values())),
        "ports": {
            "base": c.port_base_shell(),
            "block": c.PORT_BLOCK,
            "service": c.SERVICE_PORT,
            "service_slots": c.SERVICE_SLOTS,
            "node_slots": c.NODE_SLOTS,
            "draws": c.PORT_DRAWS,
            "head_flags": c.HEAD_PORT_FLAGS,
            "node_flags": c.NODE_PORT_FLAGS,
            "metric_vars": c.METRIC_PORT_VARS,
        },
        "layout": c.run_dir_layout(),
        "safety": _safety_context(),
    }


def _safety_context() -> dict:
    """Shared nodes' names and limits (hpcrl/contract.py): the job's own refusals, the watchdog's heartbeat."""
    c = contract
    return {
        "run_dir_unsafe": c.RUN_DIR_UNSAFE,
        "node_local_taken": c.NODE_LOCAL_TAKEN,
        "watchdog_hung": {"reason": c.WATCHDOG_HUNG[0], "code": c.WATCHDOG_HUNG[1]},
        "beat_s": c.WATCHDOG_BEAT_S,
        "quiet_s": c.WATCHDOG_QUIET_S,
        "mktemp": c.mktemp_suffix(),
        "fixed_code_case": c.fixed_code_case(),
    }


def render_script(job: JobSpec) -> str:
    """The sbatch script of a job description."""
    return _environment().get_template(TEMPLATE).render(**_context(job))
