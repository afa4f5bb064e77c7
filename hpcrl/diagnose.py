"""Recognise why a run failed from its log; compute the fix with hpcrl's planners.

Steps and death lines are read with hpcrl.driver_log. docs/diagnose.md lists every recognised
message.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from hpcrl.driver_log import ANSI, CUDA_OOM as _OOM, LIBFABRIC as _CXI, NCCL_TIMEOUT as _TIMEOUT, death_line, parse_steps
from hpcrl.memory import constants as C
from hpcrl.memory.engine import EngineSetup, engine_memory
from hpcrl.memory.learner import LearnerSetup, learner_memory
from hpcrl.memory.plan import LEARNER_HEADROOM
from hpcrl.models import ModelSpec, resolve_model
from hpcrl.profiles import ClusterProfile

GIB = C.GIB


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
        return {"found": bool(self.findings), "assumptions": self.assumptions, "last_lines": self.last_lines,
                "findings": [vars(f) for f in self.findings]}


@dataclass
class Context:
    """What the planners need: given values, else read from the log, else a stated default."""

    profile: ClusterProfile
    given: dict = field(default_factory=dict)
    text: str = ""
    assumptions: list[str] = field(default_factory=list)

    # name -> (open-instruct argument, default)
    KEYS = {"model": ("model_name_or_path", "32b"), "tokens_per_gpu": ("pack_length", 10240),
            "zero_stage": ("deepspeed_stage", 3), "vllm_tp": ("vllm_tensor_parallel_size", 1),
            "vllm_util": ("vllm_gpu_memory_utilization", 0.9), "learner_gpus": ("num_learners_per_node", 8)}

    def get(self, name: str):  # noqa: ANN201 - int, float or str by name
        if self.given.get(name) is None:
            key, value = self.KEYS[name]
            m = re.search(rf"(?:--|\b){key}['\"]?(?:\s*[:=]\s*|\s+)['\"]?(\[[^\]]*\]|[\w./\-]+)", self.text)
            nums = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", m.group(1))] if m else []
            if m and (nums or name == "model"):
                value = m.group(1) if name == "model" else sum(nums) if name == "learner_gpus" else nums[0]
                value = value if name in ("model", "vllm_util") else int(value)
                self.assumptions.append(f"{key}={m.group(1)} (from the log)")
            else:
                self.assumptions.append(f"{key}={value} (default; not in the log)")
            self.given[name] = value
        return self.given[name]

    def spec(self) -> ModelSpec:
        try:
            return resolve_model(str(self.get("model")))
        except Exception:  # noqa: BLE001 - a model in a log that hpcrl does not know is not an error
            self.assumptions.append(f"model {self.given['model']!r} is not in hpcrl's catalog; using 32b")
            self.given["model"] = "32b"
            return resolve_model("32b")


def _grab(before: str, text: str, after: str = "") -> float | None:
    """GiB of the first "<before> N <unit> <after>" in text."""
    m = re.search(before + r"\s*([\d.]+)\s*(GiB|MiB|KiB|GB)\s*" + after, text)
    scale = {"GiB": 1.0, "MiB": 1 / 1024, "KiB": 1 / 1024**2, "GB": 1e9 / GIB}
    return float(m.group(1)) * scale[m.group(2)] if m else None


def learner_fixes(ctx: Context, capacity_gib: float, demand_gib: float | None) -> tuple[list[str], dict]:
    """Smallest single changes (pack_length, learner GPUs, optimizer offload) that fit, by the planner."""
    base = LearnerSetup(model=ctx.spec(), n_gpus=ctx.get("learner_gpus"), tokens_per_gpu=ctx.get("tokens_per_gpu"),
                        zero_stage=ctx.get("zero_stage"), grad_accum_dtype="fp32")
    now, limit = learner_memory(base), capacity_gib * GIB * (1 - LEARNER_HEADROOM)
    # Where the log shows more demand than predicted, scale every prediction by that ratio.
    scale = max(1.0, demand_gib * GIB / now.peak_allocated) if demand_gib else 1.0
    peak = lambda s: learner_memory(s).device_total * scale  # noqa: E731
    details = {"capacity_gib": round(capacity_gib, 2), "predicted_gib": round(now.device_total / GIB, 2),
               "scale_from_log": round(scale, 3), "limit_gib": round(limit / GIB, 2)}
    fixes = []
    lo, hi = 1, base.tokens_per_gpu // 256 - 1  # largest multiple of 256 below today's that fits
    while lo <= hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if peak(replace(base, tokens_per_gpu=mid * 256)) <= limit else (lo, mid - 1)
    if hi >= 1:
        fixes.append(f"pack_length {base.tokens_per_gpu} -> {hi * 256} (tokens per learner GPU): predicted peak "
                     f"{peak(replace(base, tokens_per_gpu=hi * 256)) / GIB:.1f} GiB of {capacity_gib:.1f}")
    n = next((n for n in range(base.n_gpus + 1, 1025) if peak(replace(base, n_gpus=n)) <= limit), None)
    if n and base.zero_stage == 3:
        fixes.append(f"learner GPUs {base.n_gpus} -> {n} (num_learners_per_node): predicted peak "
                     f"{peak(replace(base, n_gpus=n)) / GIB:.1f} GiB")
    if peak(off := replace(base, offload="optimizer")) <= limit:
        fixes.append(f"deepspeed_offload_optimizer: predicted peak {peak(off) / GIB:.1f} GiB (check host RAM "
                     "with `hpcrl plan-memory --offload optimizer`)")
    return fixes, details


def engine_fixes(ctx: Context, capacity_gib: float, max_seq_len: int, seen_kv_gib: float | None = None
                 ) -> tuple[list[str], dict]:
    """TP, gpu_memory_utilization or sequence length that give an engine room (shifted by the planner's
    error where vLLM reported its KV memory)."""
    m = ctx.spec()
    base = EngineSetup(model=m, tp=ctx.get("vllm_tp"), gpu_memory_utilization=ctx.get("vllm_util"),
                       gpu_total_bytes=capacity_gib * GIB, max_seq_len=max_seq_len)
    now = engine_memory(base)
    offset = now.kv_cache - seen_kv_gib * GIB if seen_kv_gib is not None else 0.0

    def tokens(e: EngineSetup) -> int:
        em = engine_memory(e)
        return int(max(0.0, em.kv_cache - offset) // em.kv_bytes_per_token)

    details = {"capacity_gib": round(capacity_gib, 2), "tp": base.tp, "util": base.gpu_memory_utilization,
               "kv_tokens_now": tokens(base), "planner_offset_gib": round(offset / GIB, 2), "max_seq_len": max_seq_len}
    fixes = []
    tps = [t for t in m.tp_sizes(ctx.profile.gpu.count_per_node) if t > base.tp]
    if (tp := next((t for t in tps if tokens(replace(base, tp=t)) >= max_seq_len), None)):
        fixes.append(f"vllm_tensor_parallel_size {base.tp} -> {tp}: {tokens(replace(base, tp=tp)):,} KV tokens")
    utils = [p / 100 for p in range(round(base.gpu_memory_utilization * 100) + 1, 96)]
    if (u := next((u for u in utils if tokens(replace(base, gpu_memory_utilization=u)) >= max_seq_len), None)):
        fixes.append(f"vllm_gpu_memory_utilization {base.gpu_memory_utilization} -> {u} (only if nothing else "
                     f"shares the GPU): {tokens(replace(base, gpu_memory_utilization=u)):,} KV tokens")
    if 0 < tokens(base) < max_seq_len:
        fixes.append(f"sequences (prompt + response) of at most {tokens(base):,} tokens at TP={base.tp}")
    return fixes, details


def _capacity(text: str, ctx: Context) -> float:
    m = re.search(r"Free memory on device \S+ \(([\d.]+)/([\d.]+) GiB\)", text)
    cap = _grab(r"total capacity of", text) or (float(m.group(2)) if m else None)
    if cap is None:
        cap = ctx.profile.gpu.memory_gib
        ctx.assumptions.append(f"GPU memory {cap} GiB ({ctx.profile.gpu.model}, profile {ctx.profile.name})")
    return cap


def _find(kind: str, cause: str, fixes: list[str] | str, lines: list[str], pat: re.Pattern[str] | None,
          details: dict | None = None) -> Finding:
    fix = fixes if isinstance(fixes, str) else "; or ".join(fixes) or "no single change fits by the planner"
    ev = [f"line {i + 1}: {ANSI.sub('', x).strip()[:220]}" for i, x in enumerate(lines) if pat and pat.search(x)]
    return Finding(kind, cause, fix, ev[:3], details or {})


_ENGINE_CTX = re.compile(r"LLMRayActor|EngineCore|/vllm/|vllm\.v1|load_model|profile_run|KV cache")


def rule_cuda_oom(lines: list[str], text: str, ctx: Context) -> Finding | None:
    if not (hits := [i for i, line in enumerate(lines) if _OOM.search(line)]):
        return None
    tried, free = _grab(r"Tried to allocate", text), _grab(r"of which", text)
    alloc, cap = _grab("", text, "is allocated by PyTorch"), _capacity(text, ctx)
    nums = {"tried_gib": tried, "free_gib": free, "allocated_by_pytorch_gib": alloc, "capacity_gib": cap}
    pat = re.compile(_OOM.pattern + r"|Tried to allocate|is allocated by PyTorch")
    near = "\n".join(lines[max(0, hits[0] - 8):hits[0] + 4])  # the traceback around the first OOM
    if "PolicyTrainerRayProcess" not in lines[hits[0]] and _ENGINE_CTX.search(near):
        fixes, d = engine_fixes(ctx, cap, ctx.get("tokens_per_gpu"))
        return _find("vllm_cuda_oom", "A vLLM engine ran out of GPU memory while starting (weights, profiling or "
                     "CUDA graphs): its share of the GPU is too small for the model at this TP.", fixes, lines, pat,
                     {**nums, **d})
    fixes, d = learner_fixes(ctx, cap, (alloc or 0.0) + (tried or 0.0) or None)
    d["note"] = "more allocated than the GPU holds: the text may be edited" if alloc and alloc > cap else None
    said = f"asked for {tried:.2f} GiB more" if tried else "ran out of memory"
    held = f" with {alloc:.2f} GiB already allocated by PyTorch" if alloc else ""
    scaled = (f", x{d['scale_from_log']} to match the log" if d["scale_from_log"] > 1 else "") + (
        " - far off: check the model, learner GPUs and tokens" if d["scale_from_log"] > 1.5 else "")
    return _find("cuda_oom", f"A training process {said}{held} on a {cap:.2f} GiB GPU: the learner step does not "
                 f"fit (planner: {d['predicted_gib']:.1f} GiB{scaled}).", fixes, lines, pat, {**nums, **d})


_KV = re.compile(r"larger than the (?:available KV cache memory|maximum number of tokens that can be stored in KV cache)")
_NOBLOCKS = re.compile(r"No available memory for the cache blocks")
_FREE_LT = re.compile(r"Free memory on device \S+ \(([\d.]+)/([\d.]+) GiB\) on startup is less than desired GPU "
                      r"memory utilization \(([\d.]+)")


def rule_vllm_startup(lines: list[str], text: str, ctx: Context) -> Finding | None:
    if (m := _FREE_LT.search(text)):
        free, total, util = float(m.group(1)), float(m.group(2)), float(m.group(3))
        fit = math.floor((free - 1.0) / total * 100) / 100
        return _find("vllm_gpu_busy", f"When the vLLM engine started only {free:.1f} of {total:.1f} GiB was free "
                     f"(another process holds the GPU), less than gpu_memory_utilization={util} asks for.",
                     f"vllm_gpu_memory_utilization <= {fit:.2f} ({fit * total:.1f} GiB), or engines on GPUs no "
                     f"learner uses (learners + engines x TP <= {ctx.profile.gpu.count_per_node} per node)",
                     lines, _FREE_LT, {"free_gib": free, "total_gib": total, "util": util})
    if _KV.search(text):
        seq, est = re.search(r"max seq len \((\d+)\)", text), re.search(r"maximum model length is (\d+)", text)
        need, have = _grab(r"\(", text[text.find("max seq len"):]), _grab(r"available KV cache memory \(", text)
        n = int(seq.group(1)) if seq else ctx.get("tokens_per_gpu")
        fixes, d = engine_fixes(ctx, _capacity(text, ctx), n, have)
        if est:
            fixes.append(f"max_model_len <= {int(est.group(1)):,} (vLLM's own estimate for this memory)")
        return _find("vllm_kv_cache", f"The engine's KV cache{f' ({have:.2f} GiB)' if have else ''} cannot hold one "
                     f"{n:,}-token sequence{f' (needs {need:.2f} GiB)' if need else ''}.", fixes, lines, _KV,
                     {**d, "needed_gib": need, "available_gib": have})
    if _NOBLOCKS.search(text):
        fixes, d = engine_fixes(ctx, _capacity(text, ctx), ctx.get("tokens_per_gpu"), 0.0)
        return _find("vllm_no_kv_memory", "Weights and the profiling pass used the whole vLLM budget "
                     "(gpu_memory_utilization x GPU memory): nothing is left for the KV cache.", fixes, lines,
                     _NOBLOCKS, d)
    return None


_DUP = re.compile(r"Duplicate GPU detected(?: : rank (\d+) and rank (\d+) both on CUDA device (\w+))?")
_OFI_MISSING = re.compile(r"network AWS Libfabric not found|NET/OFI.*(?:Failed to initialize|not found)")


def rule_nccl(lines: list[str], text: str, ctx: Context) -> Finding | None:
    p = ctx.profile
    if (m := _DUP.search(text)):
        who = f" (ranks {m.group(1)} and {m.group(2)}, bus id {m.group(3)})" if m.group(1) else ""
        return _find("nccl_duplicate_gpu", f"Two ranks of one NCCL communicator run on the same GPU{who}: learners "
                     "stacked on a GPU, or an engine sharing a learner's GPU in the weight-sync group.",
                     f"give every rank its own GPU: per node, learners + vLLM engines x TP <= {p.gpu.count_per_node} "
                     f"on {p.name}; `hpcrl plan` lays them out disjointly (NCCL_IGNORE_DUPLICATE_GPU needs a "
                     "patched NCCL and is untested)", lines, _DUP)
    if _OFI_MISSING.search(text):
        mods = [x for x in p.modules if "nccl" in x or "ofi" in x] or ["the aws-ofi-nccl plugin"]
        return _find("nccl_ofi_plugin_missing", "NCCL was told to use the libfabric network (NCCL_NET='AWS "
                     "Libfabric') but did not load the aws-ofi-nccl plugin.", f"load {', '.join(mods)} on every "
                     f"node before Ray starts (profile {p.name}); in a container bind the host plugin and libfabric",
                     lines, _OFI_MISSING)
    if _CXI.search(text):
        rc = re.search(r"RC:?\s*(-?\d+)", text)
        return _find("nccl_libfabric_error", "The Slingshot/libfabric layer rejected traffic"
                     + (f" (return code {rc.group(1)})" if rc else "") + "; VNI_NOT_FOUND means a process used a "
                     "network VNI its job step was not granted (started outside the job's srun step).",
                     "start every Ray worker from one `srun` step of this job (hpcrl's script does), never via ssh "
                     "or another allocation; if one node keeps failing, add it to slurm.exclude_nodes", lines, _CXI)
    if (m := _TIMEOUT.search(text)):
        op, limit = re.search(r"OpType=(\w+)", m.group(1)), re.search(r"Timeout\(ms\)=(\d+)", m.group(1))
        return _find("nccl_timeout", f"A {op.group(1) if op else 'NCCL'} collective waited {int(m.group(2)) / 60000:.1f}"
                     f" min{f' (limit {int(limit.group(1)) / 60000:.0f} min)' if limit else ''}: one rank never "
                     "joined it - it died, hung or fell far behind.", "the first error before this line (an OOM, a "
                     "dead actor) is the cause; if there is none, check that NCCL uses the network plugin, not "
                     "sockets", lines, _TIMEOUT)
    return None


_PG = re.compile(r"Timed out waiting for the learner placement group|cannot be scheduled right now|"
                 r"No available node types can fulfill|Waiting for placement group|[Ii]nfeasible")


def rule_placement(lines: list[str], text: str, ctx: Context) -> Finding | None:
    per = ctx.profile.gpu.count_per_node
    if (m := re.search(r"requires GPU=(\d+(?:\.\d+)?) but Ray currently sees GPU=(\d+(?:\.\d+)?)", text)):
        need, seen = float(m.group(1)), float(m.group(2))
        return _find("ray_missing_gpus", f"Ray sees {seen:g} GPUs but the learner placement group needs {need:g}: "
                     "worker nodes did not join the Ray cluster (or joined without their GPUs).",
                     f"{math.ceil(need / per)} nodes of {per} GPUs must register before the driver starts; check "
                     "each worker's `ray start` output", lines, re.compile("Ray currently sees GPU"),
                     {"needed": need, "seen": seen})
    hits = sum(1 for line in lines if _PG.search(line))
    if hits >= (1 if re.search(r"Timed out waiting for the learner|fulfill", text) else 3):
        return _find("ray_placement_group", "A Ray placement group can never be placed: the learner bundles "
                     "(STRICT_SPREAD, one per node) or an engine's TP GPUs ask for more than a node offers.",
                     f"num_learners_per_node needs one entry per node, each <= {per} minus that node's engine GPUs, "
                     "no more entries than nodes; vllm_tensor_parallel_size <= GPUs free on one node", lines, _PG)
    return None


_DISK = re.compile(r"No space left on device|Disk quota exceeded|Errno 28\]|Errno 122\]")
_HOST_OOM = re.compile(r"killed due to memory pressure|node running low on memory|NODE_OUT_OF_MEMORY")


def rule_disk_or_ram(lines: list[str], text: str, ctx: Context) -> Finding | None:
    if _DISK.search(text):
        from hpcrl.disk import plan_disk  # noqa: PLC0415 - only needed here

        plan = plan_disk(ctx.spec(), n_learners=ctx.get("learner_gpus"), zero_stage=ctx.get("zero_stage"))
        where = re.search(r"(?:device|exceeded)[^/'\n]*'(/[^']+)'", text)
        return _find("disk_full", f"The filesystem{f' at {where.group(1)}' if where else ''} is full or over quota; "
                     "checkpoints are the usual cause.", f"one ZeRO-3 state checkpoint of {plan.setup.model.name} is "
                     f"{plan.state_bytes / GIB:,.0f} GiB and one HF save {plan.hf_bytes / GIB:,.0f} GiB: `hpcrl "
                     "plan-disk` gives the run's peak against the quota; `hpcrl checkpoints prune RUN --keep 1` "
                     "frees old saves", lines, _DISK, {"state_gib": round(plan.state_bytes / GIB, 1)})
    if _HOST_OOM.search(text):
        r = ctx.profile
        return _find("host_ram_oom", f"Host RAM passed Ray's kill threshold ({r.ray.memory_kill_threshold:.0%} of "
                     f"{r.node.ram_gib:.0f} GiB per node on {r.name}) and Ray killed a worker; optimizer offload is "
                     "the usual cause.", "fewer learners per node or no optimizer offload; `hpcrl plan-memory` shows "
                     "host RAM per node", lines, _HOST_OOM)
    return None


def rule_death(lines: list[str], text: str, ctx: Context) -> Finding | None:
    if (hit := next(((i, k) for i, line in enumerate(lines) if (k := death_line(line))), None)) is None:
        return None
    what = {"vllm_engine_dead": "A vLLM engine", "ray_node_dead": "A Ray node", "ray_actor_died": "A Ray actor"}
    return Finding(hit[1], f"{what[hit[1]]} died at line {hit[0] + 1}; the run cannot go on without it.",
                   "the root cause is the first error before that line (OOM, segfault, node failure); the watchdog "
                   "stops such runs (exit 93) instead of training on empty rollouts",
                   [f"line {hit[0] + 1}: {lines[hit[0]].strip()[:220]}"])


def rule_steps(lines: list[str], text: str, ctx: Context, k: int = 10) -> Finding | None:
    run, best = [], []  # type: ignore[var-annotated]
    for s in parse_steps(lines):
        if (bad := s.bad_losses()):
            return Finding("nan_loss", f"The loss became {next(iter(bad.values()))} at step {s.number}.", "resume "
                           "from the last state checkpoint with a lower learning rate; check for empty or all-masked "
                           "batches", [f"step {s.number}: {bad}"])
        if s.reward_key:
            run = run + [s] if s.reward_is_exactly_zero() else []
            best = run if len(run) > len(best) else best
    if len(best) < k:
        return None
    stop = best[-1].values.get("val/stop_rate")
    return Finding("zero_reward", f"The mean reward ({best[0].reward_key}) was exactly 0 for {len(best)} consecutive "
                   f"steps from step {best[0].number}: " + ("every response ran to response_length (stop_rate 0)."
                                                           if stop == 0 else "no rollout earned any reward."),
                   "check generation first (a dead or disconnected engine returns empty rollouts), then the verifier "
                   "and the answer format, then response_length", [f"steps {best[0].number}-{best[-1].number}"],
                   {"first_step": best[0].number, "steps": len(best)})


RULES = (rule_cuda_oom, rule_disk_or_ram, rule_vllm_startup, rule_nccl, rule_placement, rule_death, rule_steps)


def diagnose(text: str, ctx: Context, breaker: dict | None = None) -> Diagnosis:
    """Every known failure in a log, most likely root cause first."""
    lines = text.splitlines()
    ctx.text = text
    findings = [f for rule in RULES if (f := rule(lines, text, ctx)) is not None]
    b_kinds = {breaker.get("reason"), (breaker.get("details") or {}).get("kind")} if breaker else set()
    if breaker and not any(f.kind in b_kinds for f in findings):
        findings.append(Finding(str(breaker.get("reason")), f"The watchdog stopped the run: {breaker.get('message')}",
                                "see the other findings, if any, for the cause", [], breaker.get("details") or {}))
    return Diagnosis(findings, lines[-20:], ctx.assumptions)
