"""From a checked run plan to its job description (hpcrl/planning/job_spec.py): pure.

Every question to the backend and every check the script's values need (Slurm values, the account,
the run name, the container runtime, the driver's words) happens here, once; the renderer only
formats what this returns. `hpcrl plan` builds it too, so it never approves what `render` refuses.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hpcrl import __version__, contract
from hpcrl.errors import ConfigError, HpcrlError
from hpcrl.memory import constants as C
from hpcrl.planning import driver_cadence
from hpcrl.planning.backends import stack_expect
from hpcrl.planning.disk import GIB
from hpcrl.planning.disk_check import run_budget
from hpcrl.planning.backends.processes import PLACEHOLDER, Process
from hpcrl.planning.job_spec import (
    Chain,
    Checkpoints,
    Container,
    Driver,
    Environment,
    GpuMonitor,
    Header,
    Health,
    JobSpec,
    NodeRole,
    Phase,
    RaySpec,
    Resume,
    RunDirectory,
    RunFile,
    Service,
    ShellWord,
    Smoke,
    Step,
    Watchdog,
)
from hpcrl.planning.run_types import RunPlan
from hpcrl.planning.slurm_request import check_run_name, cluster_label, run_root, slurm_request

CONTAINER_RUNTIMES = ("apptainer", "singularity")
# Host paths bound into a container, by the variables that name them in the script.
CONTAINER_BINDS = ("HPCRL_RUN_DIR", "HPCRL_NODE_LOCAL", "HF_HOME")
# Ray's socket paths must stay under 107 bytes: <temp>/session_<date>_<time>_<pid>/sockets/plasma_store
# adds up to 64 characters to Ray's temp dir; the script falls back to /tmp past this length.
RAY_TEMP_MAX = 40
# `ray start` tries per node before the job gives up (NeMo-RL's ray.sub retries the head 3 times).
RAY_START_ATTEMPTS = 3
# Nodes of one host that start Ray at once before ray.start_stagger_s applies. 1: every node after
# the head waits. With 4 (the first four at once) the local-dev 8-node bring-up failed under load
# where staggering every node had passed (benchmarks/results/bringup_nodes.jsonl).
STAGGER_FREE_SLOTS = 1
# The module torchrun is (a launcher the script checks is importable before the driver starts).
TORCHRUN_MODULE = "torch.distributed.run"


def umask(rp: RunPlan) -> str:
    """The script's umask: the job's files are the user's alone unless the group shares runs."""
    return "027" if rp.profile.storage.share_runs_with_group else "077"


def plan_summary(rp: RunPlan) -> list[str]:
    """The plan in a few comment lines: layout, per-GPU memory, step estimate."""
    lay, w, p = rp.layout, rp.workload, rp.profile
    d = lay.to_dict()
    eng = lay.memory.engine
    if lay.colocated:
        gpus = f"all {lay.learner_gpus} GPUs train and generate (colocated)"
        mem = lay.phased.colocated_summary()
    else:
        gpus = f"{lay.learner_gpus} learner GPUs, {lay.engines * lay.tp} engine GPUs, {lay.idle_gpus} idle"
        mem = (
            f"learner peak {d['learner_peak_gib']:.1f} GiB/GPU of {d['gpu_usable_gib']:.1f} usable; "
            f"engine {eng.weights / C.GIB:.1f} GiB weights + {d['engine_kv_cache_gib']:.1f} GiB KV cache per GPU; "
            f"host peak {d['host_peak_gib']:.0f} GiB/node"
        )
    return [
        f"model {w.model.name}: {w.seqs} sequences of {w.seq_len} tokens per step, {rp.backend.tokens_text(rp)}",
        (
            f"{p.job_gpus} {p.gpu.model} ({p.gpu.memory_gib:g} GiB) of one node, not the whole node (--gpus "
            f"{p.job_gpus}): {gpus}"
            if p.job_gpus
            else f"{rp.nodes} x {p.gpu.count_per_node} {p.gpu.model} ({p.gpu.memory_gib:g} GiB): {gpus}"
        ),
        rp.backend.summary(rp),
        mem,
        f"step {lay.step.text()} (generation {lay.step.generation_s:.0f} s, training {lay.step.training_s:.0f} s), "
        f"bottleneck {lay.bottleneck}; the checkpoint cadence and time-limit lead use the upper estimate",
        f"step basis: {lay.step.basis}",
    ] + ([rp.cadence.summary(rp.backend.checkpoint_key, rp.config.hpcrl.max_lost_minutes)] if rp.cadence else [])


def plan_record(rp: RunPlan, *, smoke: bool = False) -> dict[str, Any]:
    """hpcrl/plan.json: what the script was rendered from (plain JSON values)."""
    lay = rp.layout
    data: dict[str, Any] = {
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
    if not smoke and (disk := _disk_record(rp)) is not None:
        data["disk"] = disk
    if rp.config.hpcrl.reward_keys:  # the watchdog's reward keys: `hpcrl report` reads the metrics with them
        data["reward_keys"] = list(rp.config.hpcrl.reward_keys)
    if rp.config.hpcrl.loss_keys:
        data["loss_keys"] = list(rp.config.hpcrl.loss_keys)
    if "zero_reward_steps" in rp.config.hpcrl.model_fields_set:  # the report's "reward key never seen" window
        data["zero_reward_steps"] = rp.config.hpcrl.zero_reward_steps
    if rp.profile.job_gpus is not None:  # a job with part of a node (--gpus N)
        data["job_gpus"] = rp.profile.job_gpus
    plain: dict[str, Any] = json.loads(json.dumps(data, default=str))  # plain JSON: it round-trips with the job
    return plain


# Disk budget items that lie outside the run directory (on the same quota): the HF caches.
_OUTSIDE_RUN_DIR = ("model_cache", "dataset_cache")


def _disk_record(rp: RunPlan) -> dict[str, Any] | None:
    """plan.json's `disk`: the disk plan's peak (all of it, and the run directory's part), the run root's quota
    and the run's training steps where known; `hpcrl watch` sets the run directory's size against it."""
    try:
        b = run_budget(rp)
    except HpcrlError:  # nothing to plan the disk from (render refuses such a run before this, unless forced)
        return None
    inside = sum(i.peak_bytes for i in b.items if i.kind not in _OUTSIDE_RUN_DIR)
    quota = b.inputs.quota_bytes
    return {
        "peak_gib": round(b.peak_bytes / GIB, 1),
        "run_dir_peak_gib": round(inside / GIB, 1),
        "quota_gib": None if quota is None else round(quota / GIB, 1),
        "total_steps": b.inputs.total_steps,
        "fits": b.fits,
    }


def _container(rp: RunPlan) -> Container | None:
    image = rp.config.hpcrl.container
    if not image:
        return None
    runtime = rp.profile.container.runtime
    if runtime not in CONTAINER_RUNTIMES:
        raise ConfigError(
            f"hpcrl.container is set but cluster {rp.profile.name}'s container runtime is {runtime!r}; "
            f"render supports {', '.join(CONTAINER_RUNTIMES)} (or start your container in hpcrl.env_setup)"
        )
    return Container(runtime=runtime, flags=tuple(rp.profile.container.flags), image=image, binds=CONTAINER_BINDS)


def _environment(rp: RunPlan) -> Environment:
    prof, hp = rp.profile, rp.config.hpcrl
    return Environment(
        modules=tuple(prof.modules),
        profile_env=tuple(prof.env.items()),
        profile_setup=tuple(prof.setup),
        env_setup=tuple(hp.env_setup),
        hf_home=prof.storage.hf_home,
        umask=umask(rp),
        shared_with_group=prof.storage.share_runs_with_group,
        container=_container(rp),
    )


def _ray(rp: RunPlan) -> RaySpec | None:
    if not rp.backend.uses_ray:
        return None
    prof = rp.profile
    return RaySpec(
        cpus_per_node=prof.ray.num_cpus_per_node,
        object_store_bytes=int(prof.ray.object_store_gib * C.GIB) if prof.ray.object_store_gib else None,
        # The last of the nodes sharing one host starts this much later: its wait is added.
        join_timeout_s=prof.ray.join_timeout_s + prof.ray.start_stagger_s * max(0, rp.nodes - STAGGER_FREE_SLOTS),
        start_stagger_s=prof.ray.start_stagger_s,
        stagger_free_slots=STAGGER_FREE_SLOTS,
        metrics=prof.ray.metrics,
        start_attempts=RAY_START_ATTEMPTS,
        temp_max=RAY_TEMP_MAX,
        min_version=contract.RAY_TOKEN_MIN,
        # The worker step asks for the GPUs of every node but the head.
        worker_gpu_request=contract.gpu_request_option(prof.slurm.gpu_request, prof.gpu.count_per_node, rp.nodes - 1)
        if rp.nodes > 1
        else "",
    )


def _services(rp: RunPlan) -> tuple[Service, ...]:
    timeout = rp.config.hpcrl.code_server_timeout_s
    return tuple(
        Service(
            name=s.name,
            command=tuple(s.command),
            health_path=s.health_path,
            port=s.port,
            env=tuple(s.env),
            why=s.why,
            timeout_s=timeout,
        )
        for s in rp.backend.services(rp.config)
    )


def _driver(rp: RunPlan) -> tuple[Driver, int | None]:
    """The driver, and the planned checkpoint interval that "$CKPT_EVERY" carries in it (None: none does)."""
    hp, backend = rp.config.hpcrl, rp.backend
    args, in_args = driver_cadence.interval_words(rp, backend.driver_command(rp))
    # Placeholders of a job with steps (backends/processes.py) read as the job's variables here too: the stack
    # check parses these words.
    args = tuple(tuple(_step_word(w.text) if PLACEHOLDER.search(w.text) else w for w in line) for line in args)
    env, in_env = driver_cadence.env_words(rp)
    launcher = tuple(backend.launcher_words(rp))
    driver = Driver(
        backend=backend.name,
        label=backend.label,
        workdir=hp.workdir,
        python=hp.python,
        entry_point=hp.entry_point,
        entry_module=backend.runs_module(hp),
        # A framework's own entry module, else a user's module (the custom backend's `python -m`).
        module_owner=backend.name if backend.entry_is_module else "its package",
        launcher=launcher,
        launcher_module=TORCHRUN_MODULE if TORCHRUN_MODULE in launcher else "",
        args=args,
        env=env,
        override_style=backend.command_facts.style,
    )
    return driver, driver_cadence.adjustable_every(rp) if in_args or in_env else None


def _smoke(rp: RunPlan) -> Smoke:
    backend, lay = rp.backend, rp.layout
    return Smoke(
        backend=backend.name,
        placement=backend.smoke_facts.comment,
        words=tuple(backend.smoke_words(rp)) if backend.uses_ray else (),
        learners=" ".join([str(lay.learners_per_node)] * lay.learner_nodes),
        engines=lay.engines,
        tp=lay.tp,
    )


def _stack(rp: RunPlan, smoke: bool) -> dict[str, Any] | None:
    """The job's stack check expectation; None for a smoke test (its driver is hpcrl's), hpcrl.stack_check
    off, or a backend without install facts (custom scripts)."""
    if smoke or rp.config.hpcrl.stack_check == "off":
        return None
    ray_min = contract.RAY_TOKEN_MIN if rp.backend.uses_ray else None
    return stack_expect.run_expectation(rp.config, rp.profile.node.arch, ray_min) or None


def role_variable(kind: str, name: str) -> str:
    """The shell variable a step's `{host:ROLE}` or `{port:NAME}` becomes: HPCRL_VLLM_SERVER_HOST, HPCRL_MAIN_PORT."""
    return f"HPCRL_{re.sub(r'[^A-Za-z0-9]', '_', name).upper()}_{kind.upper()}"


# What an expanded step word may hold besides the variables the job sets: no quote, backslash or command
# substitution (the renderer double-quotes it).
_EXPANDED = re.compile(r"^[A-Za-z0-9_.=/@+:,%{}-]*$")
_JOB_VARS = re.compile(r"\$(?:RUN_DIR|PYTHON|CKPT_EVERY|HPCRL_[A-Z0-9_]+_(?:HOST|PORT))(?![A-Za-z0-9_])")


def _step_word(text: str) -> ShellWord:
    """A process word as the job holds it: placeholders as the job's variables (`{node_rank}` stays, for each
    node to fill), expanded when it names one."""

    def var(m: re.Match[str]) -> str:
        token = m.group(1)
        if token == "python":
            return "$PYTHON"
        if token == "node_rank":
            return "{node_rank}"
        kind, _, name = token.partition(":")
        return "$" + role_variable(kind, name)

    out = PLACEHOLDER.sub(var, text)
    if "$" not in out:
        return ShellWord(text=out)
    if not _EXPANDED.match(_JOB_VARS.sub("", out)):
        raise ConfigError(
            f"{text!r}: a word the job expands may hold only letters, digits and _ . = / @ + : , % - "
            "besides the job's own variables"
        )
    return ShellWord(text=out, expand=True)


def _cadence_words(rp: RunPlan, words: list[ShellWord]) -> tuple[list[ShellWord], bool]:
    """The step's words with the planned checkpoint interval as "$CKPT_EVERY", and whether one was."""
    every, key = driver_cadence.adjustable_every(rp), rp.backend.checkpoint_key
    for i in range(len(words) - 1):
        if every is not None and words[i].text == f"--{key}" and words[i + 1].text == str(every):
            return [*words[: i + 1], ShellWord(text=f"${driver_cadence.VAR}", expand=True), *words[i + 2 :]], True
    return words, False


def _steps(rp: RunPlan, processes: tuple[Process, ...]) -> tuple[tuple[Step, ...], bool]:
    """The backend's processes as steps (env words before the command), and whether the driver's words carry
    the planned checkpoint interval."""
    steps, in_words = [], False
    for p in processes:
        words = [ShellWord(text="env"), *(_step_word(f"{k}={v}") for k, v in p.env)] if p.env else []
        words += [_step_word(w) for w in p.argv]
        if p.driver:
            words, in_words = _cadence_words(rp, words)
        steps.append(
            Step(
                role=p.role,
                nodes=p.nodes,
                gpus_per_node=p.gpus_per_node,
                command=tuple(words),
                ports=p.ports,
                health=Health(path=p.health.path, port=p.health.port, timeout_s=p.health.timeout_s)
                if p.health
                else None,
                waits_for=p.waits_for,
                driver=p.driver,
                resume=Resume(
                    flag=p.resume.flag,
                    directory=p.resume.directory,
                    pattern=p.resume.pattern,
                    complete_file=p.resume.complete_file,
                )
                if p.resume
                else None,
            )
        )
    taken = {"environment", "stack_check", "head", "files", "services", "driver", "stop"}
    if clash := [s.role for s in steps if _fn(s.role) in taken]:
        raise ValueError(f"backend {rp.backend.name}: a step role may not be named as a phase: {clash}")
    drivers = [s for s in steps if s.driver]
    if len(drivers) != 1 or len(steps) > 2 or steps[-1] is not drivers[0]:
        raise ValueError(f"backend {rp.backend.name}: the job takes one driver step, last, after at most one other")
    return tuple(steps), in_words


def _roles(rp: RunPlan, ray: bool, services: bool) -> tuple[NodeRole, ...]:
    on_every = ("services, " if services else "") + ("Ray and " if ray else "") + "the GPU monitor"
    roles = [NodeRole(role="head", count=1, does=f"the batch script: the driver under the watchdog, {on_every}")]
    if rp.nodes > 1 and ray:  # without Ray the other nodes are the framework's own to use (no step of hpcrl's)
        roles.append(NodeRole(role="worker", count=rp.nodes - 1, does=f"one srun step: {on_every}"))
    return tuple(roles)


def _step_roles(rp: RunPlan, steps: tuple[Step, ...]) -> tuple[NodeRole, ...]:
    by_node: dict[int, list[str]] = {}
    for st in steps:
        for i in st.nodes:
            by_node.setdefault(i, []).append(st.role)
    roles: dict[str, int] = {}
    for i in range(rp.nodes):
        name = "+".join(by_node.get(i, [])) or "idle"
        roles[name] = roles.get(name, 0) + 1
    return tuple(
        NodeRole(
            role=name,
            count=n,
            does="one srun step each: " + name.replace("+", ", then ") if name != "idle" else "nothing the plan needs",
        )
        for name, n in roles.items()
    )


def _phases(rp: RunPlan, ray: bool, smoke: bool, label: str, steps: tuple[Step, ...] = ()) -> tuple[Phase, ...]:
    phases = [
        Phase(
            name="environment",
            does="the profile's and the config's environment, the run directory and job log, nodes, ports",
        ),
        Phase(name="stack_check", does="what the job's environment must provide before anything starts"),
        Phase(name="head", does="this node: GPU monitor, services" + (", Ray's head" if ray else "")),
    ]
    if ray:
        phases += [
            Phase(
                name="workers",
                does="one srun step: services and Ray on every other node" if rp.nodes > 1 else "none: one node",
            ),
            Phase(name="readiness", does="Ray reports every node and GPU"),
        ]
    if steps:
        phases.append(Phase(name="files", does="the configs the job's steps read, into the run directory"))
        for st in steps[:-1]:
            phases.append(
                Phase(
                    name=_fn(st.role),
                    does=f"{st.role} on {len(st.nodes)} node(s), until it answers {st.health.path}"
                    if st.health
                    else f"{st.role} on {len(st.nodes)} node(s)",
                )
            )
    phases += [
        Phase(name="services", does="every service answers"),
        Phase(name="driver", does=("the smoke test" if smoke else f"{label} under the watchdog") + ", until it exits"),
        Phase(
            name="stop", does="its exit code -> the end reason; record it, continue the chain when the reason allows"
        ),
    ]
    return tuple(phases)


def _fn(role: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", role)


def describe_job(rp: RunPlan, *, smoke: bool = False) -> JobSpec:
    """The job description of a checked plan; raises ConfigError/HpcrlError on any value the script cannot carry."""
    hp, prof, backend = rp.config.hpcrl, rp.profile, rp.backend
    run_name = check_run_name(hp.run_name)
    ray = _ray(rp)
    services = _services(rp)
    driver, ckpt_every = _driver(rp)
    processes = () if smoke else backend.job_processes(rp)
    steps: tuple[Step, ...] = ()
    if processes:
        steps, in_words = _steps(rp, processes)
        ckpt_every = driver_cadence.adjustable_every(rp) if in_words or ckpt_every is not None else None
    rule = prof.idle_gpu_policy
    return JobSpec(
        header=Header(
            hpcrl_version=__version__,
            cluster=cluster_label(rp),
            config_name=Path(rp.config.source).name if rp.config.source else "-",
            config_digest=rp.config.digest(),
            framework=rp.framework,
            summary=tuple(plan_summary(rp)),
            assumptions=tuple(rp.assumptions),
            warnings=tuple(rp.warnings),
            user_exclude=tuple(rp.user_exclude),
            user_exclude_file=rp.user_exclude_file,
            smoke=smoke,
        ),
        slurm=slurm_request(rp),
        gpus_per_node=prof.gpu.count_per_node,
        cpus_per_node=prof.node.cpu_cores,
        roles=_step_roles(rp, steps) if steps else _roles(rp, ray is not None, bool(services)),
        phases=_phases(rp, ray is not None, smoke, backend.label, steps),
        environment=_environment(rp),
        run_dir=RunDirectory(
            root=run_root(rp).rstrip("/") or "/",
            name=run_name,
            node_local=prof.storage.node_local.path,
            ray_log_keep_mib=prof.ray.log_keep_mib,
            shared_root=prof.storage.run_root_shared,
        ),
        ray=ray,
        services=services,
        steps=steps,
        files=tuple(RunFile(path=f.path, text=f.text) for f in backend.run_files(rp)) if steps else (),
        port_range=(prof.ray.ports[0], prof.ray.ports[1]),
        driver=None if smoke else driver,
        smoke=_smoke(rp) if smoke else None,
        watchdog=Watchdog(
            zero_reward_steps=hp.zero_reward_steps,
            hang_minutes=hp.hang_minutes,
            grad_norm_steps=hp.grad_norm_steps,
            zero_variance_steps=hp.zero_variance_steps,
            reward_keys=tuple(hp.reward_keys),
            loss_keys=tuple(hp.loss_keys),
            timing_words=tuple(backend.timing_facts.words()),
            marker_after_step=backend.timing_facts.marker_after_step,
        ),
        checkpoints=Checkpoints(
            key=backend.checkpoint_key,
            marker=backend.checkpoint_marker,
            every=None if smoke else ckpt_every,
            variable=driver_cadence.VAR,
            signal_lead_s=rp.cadence.lead_s if rp.cadence else prof.slurm.signal_before_end_s,
        ),
        chain=Chain(
            max_restarts=hp.max_restarts,
            max_failure_restarts=hp.max_failure_restarts,
            failure_backoff_s=hp.failure_backoff_s,
            no_resume=rp.no_resume,
        ),
        stack=_stack(rp, smoke),
        gpu_monitor=GpuMonitor(min_mean_power_w=rule.min_mean_power_w, grace_minutes=rule.grace_minutes)
        if rule is not None
        else GpuMonitor(),
        kill_wait_s=prof.slurm.kill_wait_s,
        signal_before_end_s=prof.slurm.signal_before_end_s,
        grace_s=max(30, prof.slurm.signal_before_end_s - 120),
        plan=plan_record(rp, smoke=smoke),
    )


__all__ = ["describe_job", "plan_record", "plan_summary", "umask"]
