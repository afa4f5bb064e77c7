"""Recognise why a run failed from its log; compute the fix with hpcrl's planners.

Steps and death lines are read with hpcrl.logs.driver_log; what the run was (backend, model, layout)
with hpcrl.logs.diagnose_context; fixes are re-planned in the backend's own keys by
hpcrl.logs.diagnose_fixes. docs/diagnose.md lists every recognised message.
"""

from __future__ import annotations

from typing import Any

import math
import re
from dataclasses import dataclass, field, replace

from hpcrl.errors import HpcrlError
from hpcrl.logs.diagnose_context import DEFAULT_BACKEND, Context
from hpcrl.logs.diagnose_fixes import engine_fixes, learner_fixes
from hpcrl.logs.driver_log import (
    ANSI,
    CUDA_OOM as _OOM,
    LIBFABRIC as _CXI,
    NCCL_TIMEOUT as _TIMEOUT,
    Step,
    death_line,
    parse_steps,
)
from hpcrl.logs.log_format import run_format
from hpcrl.memory import constants as C
from hpcrl.planning.backends import backend_names, get_backend

GIB = C.GIB
__all__ = ["Context", "Diagnosis", "Finding", "diagnose"]


@dataclass
class Finding:
    kind: str
    cause: str
    fix: str
    evidence: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)


@dataclass
class Diagnosis:
    findings: list[Finding]
    last_lines: list[str]
    assumptions: list[str]

    def to_dict(self) -> dict:
        return {
            "found": bool(self.findings),
            "assumptions": self.assumptions,
            "last_lines": self.last_lines,
            "findings": [vars(f) for f in self.findings],
        }


def _grab(before: str, text: str, after: str = "") -> float | None:
    """GiB of the first "<before> N <unit> <after>" in text."""
    m = re.search(before + r"\s*([\d.]+)\s*(GiB|MiB|KiB|GB)\s*" + after, text)
    scale = {"GiB": 1.0, "MiB": 1 / 1024, "KiB": 1 / 1024**2, "GB": 1e9 / GIB}
    return float(m.group(1)) * scale[m.group(2)] if m else None


def _capacity(text: str, ctx: Context) -> float:
    m = re.search(r"Free memory on device \S+ \(([\d.]+)/([\d.]+) GiB\)", text)
    cap = _grab(r"total capacity of", text) or (float(m.group(2)) if m else None)
    if cap is None:
        cap = ctx.profile.gpu.memory_gib
        ctx.assumptions.append(f"GPU memory {cap} GiB ({ctx.profile.gpu.model}, profile {ctx.profile.name})")
    return cap


def _find(
    kind: str,
    cause: str,
    fixes: list[str] | str,
    lines: list[str],
    pat: re.Pattern[str] | None,
    details: dict | None = None,
) -> Finding:
    fix = fixes if isinstance(fixes, str) else "; or ".join(fixes) or "no single change fits by the planner"
    ev = [f"line {i + 1}: {ANSI.sub('', x).strip()[:220]}" for i, x in enumerate(lines) if pat and pat.search(x)]
    return Finding(kind, cause, fix, ev[:3], details or {})


_ENGINE_CTX = re.compile(r"LLMRayActor|EngineCore|RayWorkerWrapper|/vllm/|vllm\.v1|load_model|profile_run|KV cache")
# Training processes: open-instruct's learner, OpenRLHF's model actors, verl's actor update.
_LEARNER_CTX = re.compile(
    r"PolicyTrainerRayProcess|ActorModelRayActor|ReferenceModelRayActor|CriticModelRayActor|"
    r"update_policy|update_actor|dp_actor|\.backward\(|training_step"
)


def _in_engine(lines: list[str], hit: int) -> bool:
    """Whether the OOM at line `hit` is a vLLM engine's: its own prefix, else its traceback, says so."""
    if _LEARNER_CTX.search(lines[hit]):
        return False
    start = next((i for i in range(hit, max(-1, hit - 40), -1) if "Traceback" in lines[i]), max(0, hit - 8))
    near = "\n".join(lines[start : hit + 4])
    return not _LEARNER_CTX.search(near) and bool(_ENGINE_CTX.search(near))


def _inconsistent(nums: dict) -> list[str]:
    """The OOM message's figures that no GPU of that capacity could show."""
    cap, out = nums["capacity_gib"], []
    for key, what in (
        ("allocated_by_pytorch_gib", "allocated by PyTorch"),
        ("tried_gib", "asked for"),
        ("free_gib", "free"),
    ):
        if nums.get(key) is not None and nums[key] > cap:
            out.append(f"{nums[key]:.2f} GiB {what} on a {cap:.2f} GiB GPU")
    return out


def _unknown_model(ctx: Context) -> str:
    return f"model unknown: give {ctx.missing()} and diagnose computes the fix with the planner"


def rule_cuda_oom(lines: list[str], text: str, ctx: Context) -> Finding | None:
    if not (hits := [i for i, line in enumerate(lines) if _OOM.search(line)]):
        return None
    tried, free = _grab(r"Tried to allocate", text), _grab(r"of which", text)
    alloc, cap = _grab("", text, "is allocated by PyTorch"), _capacity(text, ctx)
    nums = {"tried_gib": tried, "free_gib": free, "allocated_by_pytorch_gib": alloc, "capacity_gib": cap}
    pat = re.compile(_OOM.pattern + r"|Tried to allocate|is allocated by PyTorch")
    fixes: list[str] | str  # the planner's fixes, or why it cannot give any
    if ctx.facts.engines and _in_engine(lines, hits[0]):
        fixes, d = engine_fixes(ctx, cap, _seq_len(ctx))
        return _find(
            "vllm_cuda_oom",
            "A vLLM engine ran out of GPU memory while starting (weights, profiling or "
            "CUDA graphs): its share of the GPU is too small for the model at this TP.",
            _or_unknown(fixes, ctx),
            lines,
            pat,
            {**nums, **d},
        )
    bad = _inconsistent(nums)
    # Figures that contradict the GPU (edited text, or a message pasted from another run) are not used to scale.
    spec = ctx.spec()
    known = spec is not None
    fixes, d = learner_fixes(ctx, cap, None if bad else (alloc or 0.0) + (tried or 0.0) or None) if known else ([], {})
    d = {
        **d,
        "inconsistent": bad,
        "model": spec.name if spec is not None else None,
        "note": "more allocated than the GPU holds: the text may be edited" if alloc and alloc > cap else None,
    }
    said = f"asked for {tried:.2f} GiB more" if tried else "ran out of memory"
    held = f" with {alloc:.2f} GiB already allocated by PyTorch" if alloc else ""
    cause = f"A training process {said}{held} on a {cap:.2f} GiB GPU: the learner step does not fit"
    if bad:
        cause += f". The message is inconsistent ({'; '.join(bad)}): its figures are not used to scale the planner"
    if ctx.spec() is None:
        return _find("cuda_oom", cause + ".", _unknown_model(ctx), lines, pat, {**nums, **d})
    if d.get("planner_fits") and ctx.facts.learner_fixes == "planned":
        fixes = (
            "the planner predicts that the run as read fits, so it cannot check a fix: check that the run "
            "config's mini_batch_size, max_prompt_length, max_response_length and rollout_batch_size are what "
            "the script uses, and what else the script keeps on the GPU"
        )
    elif d.get("planner_fits"):
        fixes = (
            "the planner predicts that the run as read fits, so it cannot check a fix: see what it assumed "
            f"(below) and give what differs ({ctx.missing().removeprefix('--model, ')}, --cluster), or diagnose "
            "a log that holds the driver's command line"
        )
    elif d.get("cannot_plan"):
        fixes = d["cannot_plan"]
    if "scale_transient" in d:  # a planned script's learner, the log's excess on its transients
        scale = d["scale_transient"]
        cause += (
            f" (planner: {d['predicted_gib']:.1f} GiB on the GPU"
            + (f" with the batch- and length-dependent terms x{scale} to match the log" if scale > 1 else "")
            + (" - far off: check that the run config's batch and lengths are the script's" if scale > 1.5 else "")
            + ")"
        )
    elif "predicted_training_gib" in d:
        cause += (
            f" (planner: {d['predicted_training_gib']:.1f} GiB training, {d['predicted_rollout_gib']:.1f} GiB rollout)"
        )
    elif "predicted_gib" in d:
        scale = d["scale_from_log"]
        cause += (
            f" (planner: {d['predicted_gib']:.1f} GiB"
            + (f", x{scale} to match the log" if scale > 1 else "")
            + (" - far off: check the model, learner GPUs and tokens" if scale > 1.5 else "")
            + ")"
        )
    return _find("cuda_oom", cause + ".", fixes, lines, pat, {**nums, **d})


def _seq_len(ctx: Context) -> int:
    """One sequence (prompt + response) of the run; the tokens per GPU where the framework has no such key."""
    keys = ctx.facts.seq_len
    return sum(int(ctx.arg(k)) for k in keys) if keys else int(ctx.get("tokens_per_gpu"))


def _or_unknown(fixes: list[str], ctx: Context) -> list[str] | str:
    return _unknown_model(ctx) if not fixes and ctx.spec() is None else fixes


_KV = re.compile(
    r"larger than the (?:available KV cache memory|maximum number of tokens that can be stored in KV cache)"
)
_NOBLOCKS = re.compile(r"No available memory for the cache blocks")
_FREE_LT = re.compile(
    r"Free memory on device \S+ \(([\d.]+)/([\d.]+) GiB\) on startup is less than desired GPU "
    r"memory utilization \(([\d.]+)"
)


def rule_vllm_startup(lines: list[str], text: str, ctx: Context) -> Finding | None:
    if m := _FREE_LT.search(text):
        free, total, util = float(m.group(1)), float(m.group(2)), float(m.group(3))
        fit = math.floor((free - 1.0) / total * 100) / 100
        return _find(
            "vllm_gpu_busy",
            f"When the vLLM engine started only {free:.1f} of {total:.1f} GiB was free "
            f"(another process holds the GPU), less than gpu_memory_utilization={util} asks for.",
            f"{ctx.key('util')} <= {fit:.2f} ({fit * total:.1f} GiB), or engines on GPUs no "
            f"learner uses (learners + engines x TP <= {ctx.profile.gpu.count_per_node} per node)",
            lines,
            _FREE_LT,
            {"free_gib": free, "total_gib": total, "util": util},
        )
    if _KV.search(text):
        seq, est = re.search(r"max seq len \((\d+)\)", text), re.search(r"maximum model length is (\d+)", text)
        need, have = _grab(r"\(", text[text.find("max seq len") :]), _grab(r"available KV cache memory \(", text)
        n = int(seq.group(1)) if seq else _seq_len(ctx)
        fixes, d = engine_fixes(ctx, _capacity(text, ctx), n, have)
        if est:
            fixes.append(f"max_model_len <= {int(est.group(1)):,} (vLLM's own estimate for this memory)")
        return _find(
            "vllm_kv_cache",
            f"The engine's KV cache{f' ({have:.2f} GiB)' if have else ''} cannot hold one "
            f"{n:,}-token sequence{f' (needs {need:.2f} GiB)' if need else ''}.",
            _or_unknown(fixes, ctx),
            lines,
            _KV,
            {**d, "needed_gib": need, "available_gib": have},
        )
    if _NOBLOCKS.search(text):
        fixes, d = engine_fixes(ctx, _capacity(text, ctx), _seq_len(ctx), 0.0)
        return _find(
            "vllm_no_kv_memory",
            "Weights and the profiling pass used the whole vLLM budget "
            "(gpu_memory_utilization x GPU memory): nothing is left for the KV cache.",
            _or_unknown(fixes, ctx),
            lines,
            _NOBLOCKS,
            d,
        )
    return None


_DUP = re.compile(r"Duplicate GPU detected(?: : rank (\d+) and rank (\d+) both on CUDA device (\w+))?")
_OFI_MISSING = re.compile(r"network AWS Libfabric not found|NET/OFI.*(?:Failed to initialize|not found)")


def rule_nccl(lines: list[str], text: str, ctx: Context) -> Finding | None:
    p = ctx.profile
    if m := _DUP.search(text):
        who = f" (ranks {m.group(1)} and {m.group(2)}, bus id {m.group(3)})" if m.group(1) else ""
        return _find(
            "nccl_duplicate_gpu",
            f"Two ranks of one NCCL communicator run on the same GPU{who}: learners "
            "stacked on a GPU, or an engine sharing a learner's GPU in the weight-sync group.",
            f"give every rank its own GPU: per node, learners + vLLM engines x TP <= {p.gpu.count_per_node} "
            f"on {p.name}; `hpcrl plan` lays them out disjointly (NCCL_IGNORE_DUPLICATE_GPU needs a "
            "patched NCCL and is untested)",
            lines,
            _DUP,
        )
    if _OFI_MISSING.search(text):
        mods = [x for x in p.modules if "nccl" in x or "ofi" in x] or ["the aws-ofi-nccl plugin"]
        return _find(
            "nccl_ofi_plugin_missing",
            "NCCL was told to use the libfabric network (NCCL_NET='AWS "
            "Libfabric') but did not load the aws-ofi-nccl plugin.",
            f"load {', '.join(mods)} on every "
            f"node before Ray starts (profile {p.name}); in a container bind the host plugin and libfabric",
            lines,
            _OFI_MISSING,
        )
    if _CXI.search(text):
        rc = re.search(r"RC:?\s*(-?\d+)", text)
        return _find(
            "nccl_libfabric_error",
            "The Slingshot/libfabric layer rejected traffic"
            + (f" (return code {rc.group(1)})" if rc else "")
            + "; VNI_NOT_FOUND means a process used a "
            "network VNI its job step was not granted (started outside the job's srun step).",
            "start every Ray worker from one `srun` step of this job (hpcrl's script does), never via ssh "
            "or another allocation; if one node keeps failing, add it to slurm.exclude_nodes",
            lines,
            _CXI,
        )
    if m := _TIMEOUT.search(text):
        op, limit = re.search(r"OpType=(\w+)", m.group(1)), re.search(r"Timeout\(ms\)=(\d+)", m.group(1))
        return _find(
            "nccl_timeout",
            f"A {op.group(1) if op else 'NCCL'} collective waited {int(m.group(2)) / 60000:.1f}"
            f" min{f' (limit {int(limit.group(1)) / 60000:.0f} min)' if limit else ''}: one rank never "
            "joined it - it died, hung or fell far behind.",
            "the first error before this line (an OOM, a "
            "dead actor) is the cause; if there is none, check that NCCL uses the network plugin, not "
            "sockets" + _timeout_fix(ctx, text, op.group(1) if op else ""),
            lines,
            _TIMEOUT,
        )
    return None


def _timeout_fix(ctx: Context, text: str, op: str) -> str:
    """What the backend itself offers against a collective that times out."""
    if ctx.backend is None:
        return ""
    f = ctx.facts
    if f.timeout_raise:
        return (
            f"; only if the ranks are merely slow (a long first step), raise {ctx.key('timeout')} (seconds, now "
            f"{ctx.arg('timeout')})"
        )
    if f.broadcast_fix and (op.upper().startswith("BROADCAST") or "broadcast_to_vllm" in text):
        return _in_keys(f.broadcast_fix, ctx)
    return f.timeout_note


_PG = re.compile(
    r"Timed out waiting for the learner placement group|cannot be scheduled right now|"
    r"No available node types can fulfill|Waiting for placement group|[Ii]nfeasible"
)


def rule_placement(lines: list[str], text: str, ctx: Context) -> Finding | None:
    per = ctx.profile.gpu.count_per_node
    if m := re.search(r"requires GPU=(\d+(?:\.\d+)?) but Ray currently sees GPU=(\d+(?:\.\d+)?)", text):
        need, seen = float(m.group(1)), float(m.group(2))
        return _find(
            "ray_missing_gpus",
            f"Ray sees {seen:g} GPUs but the learner placement group needs {need:g}: "
            "worker nodes did not join the Ray cluster (or joined without their GPUs).",
            f"{math.ceil(need / per)} nodes of {per} GPUs must register before the driver starts; check "
            "each worker's `ray start` output",
            lines,
            re.compile("Ray currently sees GPU"),
            {"needed": need, "seen": seen},
        )
    hits = sum(1 for line in lines if _PG.search(line))
    if hits >= (1 if re.search(r"Timed out waiting for the learner|fulfill", text) else 3):
        return _find(
            "ray_placement_group",
            "A Ray placement group can never be placed: the learner bundles "
            "(STRICT_SPREAD, one per node) or an engine's TP GPUs ask for more than a node offers.",
            _placement_fix(ctx, per),
            lines,
            _PG,
        )
    return None


_DISK = re.compile(r"No space left on device|Disk quota exceeded|Errno 28\]|Errno 122\]")
_HOST_OOM = re.compile(r"killed due to memory pressure|node running low on memory|NODE_OUT_OF_MEMORY")


def _placement_fix(ctx: Context, per: int) -> str:
    """What a placeable layout keeps to, in the run's framework's keys (the default backend's when nothing says:
    the fix is given as before, without an assumption of its own)."""
    try:
        facts = get_backend(ctx.backend or DEFAULT_BACKEND).diagnose_facts
    except HpcrlError:  # a --backend or plan.json naming a backend this hpcrl does not have
        facts = get_backend(DEFAULT_BACKEND).diagnose_facts
    return facts.placement_fix.format_map(_Keys({**facts.keys, "per": str(per)}))


def _offload(ctx: Context) -> str:
    """The backend's settings that keep training state in host RAM."""
    return _in_keys(ctx.facts.offload_fix, ctx)


class _Keys(dict):
    def __missing__(self, what: str) -> str:
        return what


def _in_keys(text: str, ctx: Context) -> str:
    """`text` with each {name} as the backend's key (the name itself where it has none)."""
    return text.format_map(_Keys(ctx.facts.keys))


def _disk_fix(ctx: Context) -> tuple[str, dict]:
    """Checkpoint sizes of the run (its backend, model, LoRA rank, learners) by the disk plan."""
    from hpcrl.planning.disk_backends import KEYS as DISK_KEYS, budget  # noqa: PLC0415 - only needed here
    from hpcrl.planning.disk_budget import DiskInputs  # noqa: PLC0415

    spec, b = ctx.spec(), ctx.fix_backend
    if spec is None:
        return _unknown_model(ctx) + " (checkpoint sizes)", {}
    keys, reads = DISK_KEYS[b], ctx.facts.disk_reads
    s = DiskInputs(spec, learners=int(ctx.get("learner_gpus")), zero_stage=int(ctx.get("zero_stage")), total_steps=None)
    if reads:
        w = ctx.workload()

        def value(setting: str) -> Any:
            key = keys[setting]
            return ctx.config_value(key) if key is not None else None

        run: dict[str, Any] = {"lora_rank": w.lora_rank if w else 0, "keep": value("keep")} | {
            k: bool(value(k)) for k in ("save_hf", "disable_ds") if k in reads
        }
        s = replace(s, **{k: v for k, v in run.items() if k in reads})
    plan = budget(b, s)
    state = plan.item("deepspeed_state") or plan.item("fsdp_state")
    hf = plan.item("final_save") or plan.item("hf_save")
    frozen = next((v for k, v in (state.terms if state else {}).items() if "frozen base" in k), 0.0)
    parts = []
    if state:
        parts.append(
            f"one {state.what.split(' (')[0]} checkpoint of {spec.name} is {state.one_bytes / GIB:,.0f} GiB"
            + (
                f" ({frozen / GIB:,.0f} GiB of it the frozen base: LoRA under ZeRO-3 saves the base too)"
                if frozen
                else ""
            )
        )
    if hf:
        kind = hf.what.split(" (")[0].split(": ", 1)[-1]
        parts.append(f"one HF save ({kind}) {hf.one_bytes / GIB:,.1f} GiB")
    lora = f" --lora-rank {s.lora_rank}" if s.lora_rank else ""
    fix = (
        ", ".join(parts)
        + f"; {ctx.facts.disk_bound}: `hpcrl plan-disk --backend {b} --model {spec.name}{lora} --learners "
        f"{s.learners}` gives the run's peak against the quota and the settings that fit; `hpcrl checkpoints prune "
        "RUN --keep 1` frees old saves"
    )
    return fix, {
        "state_gib": round(state.one_bytes / GIB, 1) if state else None,
        "frozen_base_gib": round(frozen / GIB, 1),
        "hf_save_gib": round(hf.one_bytes / GIB, 2) if hf else None,
    }


def rule_disk_or_ram(lines: list[str], text: str, ctx: Context) -> Finding | None:
    if _DISK.search(text):
        where = re.search(r"(?:device|exceeded)[^/'\n]*'(/[^']+)'", text)
        fix, details = _disk_fix(ctx)
        return _find(
            "disk_full",
            f"The filesystem{f' at {where.group(1)}' if where else ''} is full or over quota; "
            "checkpoints are the usual cause.",
            fix,
            lines,
            _DISK,
            details,
        )
    if _HOST_OOM.search(text):
        r = ctx.profile
        return _find(
            "host_ram_oom",
            f"Host RAM passed Ray's kill threshold ({r.ray.memory_kill_threshold:.0%} of "
            f"{r.node.ram_gib:.0f} GiB per node on {r.name}) and Ray killed a worker; offloaded training "
            f"state is the usual cause.",
            f"{_offload(ctx)}; `hpcrl plan-memory` shows host RAM per node",
            lines,
            _HOST_OOM,
        )
    return None


def rule_death(lines: list[str], text: str, ctx: Context) -> Finding | None:
    if (hit := next(((i, k) for i, line in enumerate(lines) if (k := death_line(line))), None)) is None:
        return None
    what = {"vllm_engine_dead": "A vLLM engine", "ray_node_dead": "A Ray node", "ray_actor_died": "A Ray actor"}
    note = get_backend(ctx.backend).diagnose_facts.death_note if ctx.backend else ""
    where = f" ({note})" if note else ""
    return Finding(
        hit[1],
        f"{what[hit[1]]} died at line {hit[0] + 1}{where}; the run cannot go on without it.",
        "the root cause is the first error before that line (OOM, segfault, node failure; a raylet log "
        f"saying memory pressure means host RAM: {_offload(ctx)}); the watchdog stops such runs (exit 93) "
        "instead of training on empty rollouts",
        [f"line {hit[0] + 1}: {lines[hit[0]].strip()[:220]}"],
    )


def _stop_rate(ctx: Context, step: Step) -> tuple[float | None, str]:
    """The step's fraction of responses that ended before the length limit (None: not logged) and the limit's key,
    as the log's backend names them (else the backend whose stop-rate metric the step logged, else the default)."""
    names = [ctx.log_backend] if ctx.log_backend else [*backend_names(), DEFAULT_BACKEND]
    for name in names:
        try:
            facts = get_backend(name).diagnose_facts
        except HpcrlError:  # a plan.json naming a backend this hpcrl does not have
            continue
        if (facts.stop_rate and facts.stop_rate in step.values) or name == names[-1]:
            return step.values.get(facts.stop_rate) if facts.stop_rate else None, facts.keys.get(
                "response", "the response length limit"
            )
    return None, "the response length limit"


def rule_steps(lines: list[str], text: str, ctx: Context, k: int = 10, n: int = 20) -> Finding | None:
    runs: dict[str, list] = {"zero": [], "flat": [], "same": []}
    best: dict[str, list] = {"zero": [], "flat": [], "same": []}
    for s in parse_steps(lines, run_format(ctx.log_backend), (ctx.plan or {}).get("reward_keys") or ()):
        if bad := s.bad_losses():
            return Finding(
                "nan_loss",
                f"The loss became {next(iter(bad.values()))} at step {s.number}.",
                "resume "
                "from the last state checkpoint with a lower learning rate; check for empty or all-masked "
                "batches",
                [f"step {s.number}: {bad}"],
            )
        g, v = s.grad_norm(), s.zero_variance()
        for name, known, hit in (
            ("zero", s.reward_key, s.reward_is_exactly_zero()),
            ("flat", g, g is not None and abs(g[1]) <= 1e-6),
            ("same", v, bool(v and v[0])),
        ):
            if known is not None:
                runs[name] = runs[name] + [s] if hit else []
                best[name] = runs[name] if len(runs[name]) > len(best[name]) else best[name]
    if len(z := best["zero"]) >= k:
        stop, limit = _stop_rate(ctx, z[-1])
        return Finding(
            "zero_reward",
            f"The mean reward ({z[0].reward_key}) was exactly 0 for {len(z)} consecutive "
            f"steps from step {z[0].number}: "
            + (f"every response ran to {limit} (stop_rate 0)." if stop == 0 else "no rollout earned any reward."),
            "check generation first (a dead or disconnected engine returns empty rollouts), then the "
            f"verifier and the answer format, then {limit}",
            [f"steps {z[0].number}-{z[-1].number}"],
            {"first_step": z[0].number, "steps": len(z)},
        )
    stalls = {
        "flat": (
            "grad_norm_zero",
            "The gradient norm ({}) was ~0",
            "the policy no longer changed",
            "check that the trained parameters are the ones the loss reaches (LoRA target modules, frozen "
            "layers) and that the loss mask is not empty",
            lambda s: s.grad_norm()[0],
        ),
        "same": (
            "zero_variance",
            "Every group had zero reward variance ({})",
            "GRPO's advantages were all zero",
            "the prompts are all solved or all failed: harder or easier data, more samples per prompt, or a "
            "reward with partial credit",
            lambda s: s.zero_variance()[1],
        ),
    }
    for name, (kind, what, so, fix, evidence) in stalls.items():
        if len(r := best[name]) >= n:
            return Finding(
                kind,
                f"{what.format(evidence(r[0]))} for {len(r)} consecutive steps from step {r[0].number}: {so}.",
                fix,
                [f"steps {r[0].number}-{r[-1].number}"],
                {"first_step": r[0].number, "steps": len(r)},
            )
    return None


RULES = (rule_cuda_oom, rule_disk_or_ram, rule_vllm_startup, rule_nccl, rule_placement, rule_death, rule_steps)


def diagnose(text: str, ctx: Context, breaker: dict | None = None) -> Diagnosis:
    """Every known failure in a log, most likely root cause first."""
    lines = text.splitlines()
    ctx.learn(text)
    findings = [f for rule in RULES if (f := rule(lines, text, ctx)) is not None]
    b_kinds = {breaker.get("reason"), (breaker.get("details") or {}).get("kind")} if breaker else set()
    if breaker and not any(f.kind in b_kinds for f in findings):
        findings.append(
            Finding(
                str(breaker.get("reason")),
                f"The watchdog stopped the run: {breaker.get('message')}",
                "see the other findings, if any, for the cause",
                [],
                breaker.get("details") or {},
            )
        )
    return Diagnosis(findings, lines[-20:], ctx.assumptions)
