"""How one vLLM version sizes its KV pool (pure arithmetic over data/vllm_accounting.json).

vLLM charges `total * gpu_memory_utilization` (0.19 on: its ceiling) with the weights, the torch peak
of one profiling run, the non-torch memory (from 0.11: its growth over a snapshot taken after NCCL
starts; 0.9-0.10: a snapshot taken before NCCL starts; V0 and V1 0.8.5: everything outside torch)
and, from 0.21 on, an estimate of the CUDA-graph pool; what is left, cut to whole blocks, is the KV
pool. Every rule here is cited per version in the data file; the few figures no source gives are
read from start-up logs and labelled "measured".
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from hpcrl.errors import HpcrlError
from hpcrl.memory import constants as C
from hpcrl.models.spec import ModelSpec

_DATA = Path(__file__).with_name("data") / "vllm_accounting.json"
KV_DTYPE_BYTES = {"auto": 2, "fp8": 1}
# vLLM's LogprobsMode (0.24.0 vllm/config/model.py:82); raw_logprobs is its default (:221).
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")


@lru_cache(maxsize=1)
def _data() -> dict:
    return json.loads(_DATA.read_text())


def _key(version: str) -> tuple[int, ...]:
    """A release as numbers: 0.10.1.1 -> (0, 10, 1, 1), 0.8.5.post1 -> (0, 8, 5, 0, 1)."""
    head, _, post = version.lower().partition(".post")
    nums = [int(x) for x in re.findall(r"\d+", head)]
    return tuple(nums + [0] * (4 - len(nums))) + ((int(post or 0),) if _ else (0,))


def known_versions() -> list[str]:
    return sorted(_data()["versions"], key=_key)


def read_from(version: str) -> str:
    """What a read release's accounting was read from (its sdist at the release, unless the data file says)."""
    return _data()["versions"][version].get("read_from", f"vllm-{version} sdist (PyPI), files matching tag v{version}")


def read_release(version: str) -> tuple[str, str | None]:
    """(the release whose accounting `version` gets, the note saying so): itself where hpcrl read it; a patch
    release of a minor hpcrl read gets the nearest read release of that minor (the older on a tie). A minor
    hpcrl has not read is refused, naming those it has."""
    text = str(version).strip()
    if text in _data()["versions"]:
        return text, None
    if not re.fullmatch(r"\d+\.\d+(\.\d+)*(\.post\d+)?", text):
        raise HpcrlError(
            f"--vllm-version {version!r}: not a vLLM release number; valid: {', '.join(known_versions())} "
            "or another patch release of their minor versions"
        )
    want = _key(text)
    same = [v for v in known_versions() if _key(v)[:2] == want[:2]]
    if not same:
        raise HpcrlError(
            f"--vllm-version {version!r}: hpcrl has not read that vLLM's memory accounting (no release "
            f"of {want[0]}.{want[1]}); valid: {', '.join(known_versions())}, or another patch release of "
            "their minor versions"
        )

    def distance(v: str) -> tuple:
        diff = [abs(a - b) for a, b in zip(_key(v)[2:], want[2:])]
        return diff, _key(v) > want

    near = min(same, key=distance)
    return near, (
        f"vLLM {text}: hpcrl read {near} of the same minor release, not {text}; its memory accounting is "
        f"used for {text} (a patch release: derived, not read)"
    )


@dataclass(frozen=True)
class VllmEngineFacts:
    """The vLLM a framework installs and the scheduler sizes it gives its engines, with the source
    (each backend's MemoryFacts.vllm; planning/backends/facts.py)."""

    version: str
    max_num_batched_tokens: int
    max_num_seqs: int
    source: str
    enforce_eager: bool = False  # the run's own setting, where its framework passes one to vLLM
    logprobs_mode: str = "raw_logprobs"  # what the framework passes; vLLM's own default otherwise (ModelConfig)


def default_engine() -> VllmEngineFacts:
    """The engine facts a run gets when no backend gives its own (data/vllm_accounting.json default_engine)."""
    return VllmEngineFacts(**_data()["default_engine"])


def measured(key: str) -> dict:
    return _data()["measured"][key]


@dataclass(frozen=True)
class SamplerWarmup:
    """What one model runner of one version holds at its sampler warm-up's peak (data file 'sampler_warmup', derived)."""

    bytes_per_logit: float  # under vLLM's default logprobs_mode (raw_logprobs)
    buffer_rows: int = 0  # rows of the Triton top-k/top-p kernel's cached fp32 buffer (an H100's SMs at most)
    holds_forward: bool = True  # profile_run keeps the forward's hidden states through the warm-up
    sampled_copies: int = 2  # bf16 hidden-state copies of the sampled rows (V1: the rows and their random stand-in)
    by_logprobs_mode: tuple[tuple[str, float], ...] = ()  # modes whose warm-up holds another number of bytes

    def bytes_for(self, logprobs_mode: str) -> float:
        return dict(self.by_logprobs_mode).get(logprobs_mode, self.bytes_per_logit)

    @staticmethod
    def read(d: dict | None) -> SamplerWarmup | None:
        if d is None:
            return None
        forward = d.get("holds_forward_hidden_states", True)
        return SamplerWarmup(
            bytes_per_logit=d["bytes_per_logit"],
            buffer_rows=d.get("buffer_rows", 0),
            holds_forward=forward,
            sampled_copies=d.get("sampled_hidden_copies", 2 if forward else 1),
            by_logprobs_mode=tuple(d.get("bytes_per_logit_by_logprobs_mode", {}).items()),
        )


@dataclass(frozen=True)
class Accounting:
    """The rules of one vLLM version (cited in data/vllm_accounting.json)."""

    version: str
    engine: str  # "v0" or "v1"
    graphs_in_budget: bool
    non_torch_baseline: str  # "snapshot" (growth since worker start, after NCCL), "snapshot_before_nccl", "process"
    block_size: int
    default_max_num_seqs: int
    default_max_num_batched_tokens: int = 2048
    chunked_prefill_default_above_len: int | None = None
    chunked_prefill_batched_tokens: int | None = None
    sampler: SamplerWarmup | None = None  # the V1 model runner's; None: not read, the fitted figure
    sampler_v2: SamplerWarmup | None = None  # the V2 model runner's, where the version defaults some models to it
    v2_model_types: tuple[str, ...] = ()  # HF model types of the architectures defaulting to the V2 runner
    v2_dense_models: bool = False  # every dense model defaults to the V2 runner too
    v2_all_models: bool = False  # every model defaults to the V2 runner (0.29: the architecture list is gone)
    v2_not_with_logprobs_modes: tuple[str, ...] = ()  # modes the V2 runner refuses (vLLM falls back to V1)
    concurrency_rule: str = "blocks"  # "blocks": blocks / blocks per request; "tokens": tokens / max_model_len

    def warmup(self, m: ModelSpec, logprobs_mode: str) -> SamplerWarmup | None:
        """The sampler warm-up of the model runner this version picks for `m` (config/vllm.py use_v2_model_runner)."""
        v2 = (
            self.sampler_v2 is not None
            and logprobs_mode not in self.v2_not_with_logprobs_modes
            and (self.v2_all_models or m.model_type in self.v2_model_types or (self.v2_dense_models and not m.is_moe))
        )
        return self.sampler_v2 if v2 else self.sampler

    def batched_tokens(self, max_model_len: int) -> int:
        """vLLM's default tokens in the profiling forward: V0 without chunked prefill profiles a whole
        max_model_len; V1 built as the RL frameworks build it (AsyncLLMEngine.from_engine_args) 2048."""
        if self.engine == "v0":
            long = self.chunked_prefill_default_above_len and max_model_len > self.chunked_prefill_default_above_len
            if long:
                assert self.chunked_prefill_batched_tokens is not None  # given with chunked_prefill_default_above_len
                return self.chunked_prefill_batched_tokens
            return max(max_model_len, 2048)
        return self.default_max_num_batched_tokens

    def non_torch(self, tp: int) -> float:
        """Non-torch bytes vLLM charges (measured from start-up logs per TP, not derived; a TP with no log takes
        the largest logged TP below it). A snapshot taken before NCCL starts also charges NCCL's set-up at
        TP > 1 (hpcrl's NCCL figure, not measured at that version)."""
        before_nccl = self.non_torch_baseline == "snapshot_before_nccl"
        by_tp = measured("non_torch_growth_gib")["snapshot" if before_nccl else self.non_torch_baseline]["by_tp"]
        gib = by_tp[str(max(t for t in map(int, by_tp) if t <= tp))]
        return (gib + (C.NCCL_BUFFERS_GIB if before_nccl and tp > 1 else 0.0)) * C.GIB


def accounting(version: str) -> Accounting:
    """The accounting of `version` (a patch release of a read minor: the nearest read release's, read_release);
    a minor not read from source is refused, naming those that were."""
    version, _ = read_release(version)
    v = _data()["versions"][version]
    v2 = v.get("model_runner_v2", {})
    return Accounting(
        version=version,
        engine=v["engine"],
        graphs_in_budget=v["graphs_in_budget"],
        non_torch_baseline=v["non_torch_baseline"],
        block_size=v["block_size"],
        default_max_num_seqs=v["default_max_num_seqs"],
        default_max_num_batched_tokens=v.get("default_max_num_batched_tokens", 2048),
        chunked_prefill_default_above_len=v.get("chunked_prefill_default_above_len"),
        chunked_prefill_batched_tokens=v.get("chunked_prefill_batched_tokens"),
        sampler=SamplerWarmup.read(v.get("sampler_warmup")),
        sampler_v2=SamplerWarmup.read(v2.get("sampler_warmup")),
        v2_model_types=tuple(v2.get("model_types", ())),
        v2_dense_models=v2.get("dense_models", False),
        v2_all_models=v2.get("all_models", False),
        v2_not_with_logprobs_modes=tuple(v2.get("not_with_logprobs_modes", ())),
        concurrency_rule=v.get("concurrency_rule", "blocks"),
    )


def forward_peak(m: ModelSpec, tp: int, tokens: int) -> float:
    """Torch peak of the profiling forward (derived): at the MLP, three hidden-size bf16 tensors
    (layer input, residual, normed input) beside the gate/up output and its activated half (3 x the
    intermediate size, sharded over TP)."""
    f = m.moe_intermediate_size * m.num_experts_per_tok if m.is_moe else m.intermediate_size
    return tokens * 2 * (3 * m.hidden_size + 3 * f / tp)


def sampler_peak(
    m: ModelSpec, rows: int, acc: Accounting, batched_tokens: int, logprobs_mode: str = "raw_logprobs"
) -> float:
    """Torch peak of the sampler warm-up over `rows` x the full vocabulary (gathered on every TP rank).

    Where the version's sampler was read (data file 'sampler_warmup', per model runner), derived: the
    bytes per logit live at the warm-up's peak under `logprobs_mode` (e.g. 0.19.1-0.27.1's V1 runner,
    Triton top-k/top-p: bf16 logits, fp32 copy, probabilities and noise, and the fp32 log-softmax
    under processed_logprobs; 0.8.5-0.11, the vocabulary sort; 0.24.0's V2 runner, the logits and
    their fp32 copy; 0.27.1's, the logits alone), the Triton kernel's cached fp32 buffer of up to
    `buffer_rows` rows, and the bf16 hidden states still held (the forward's tokens where kept, and
    the sampled rows). Elsewhere rows x vocab x the bytes per logit fitted by
    benchmarks/vllm_engine_check.py."""
    w = acc.warmup(m, logprobs_mode)
    if w is None:
        return rows * m.vocab_size * measured("sampler_bytes_per_logit")["value"]
    logits = rows * m.vocab_size * w.bytes_for(logprobs_mode)
    kernel_buffer = min(rows, w.buffer_rows) * m.vocab_size * 4
    hidden = 2 * m.hidden_size * ((batched_tokens if w.holds_forward else 0) + w.sampled_copies * rows)
    return logits + kernel_buffer + hidden


def cublas_workspace(acc: Accounting) -> float:
    """PyTorch's cuBLAS (32 MiB on Hopper) and cuBLASLt (1 MiB) workspaces, taken from the caching allocator
    at the first GEMM on the profiling stream, so inside V1's torch peak increase (derived; data file 'torch')."""
    return float(_data()["torch"]["cublas_workspace_bytes"]) if acc.engine == "v1" else 0.0


def rope_cache_bytes(m: ModelSpec) -> float:
    """The rotary cos/sin cache vLLM builds while loading (derived): one buffer of max_position_embeddings x
    head_dim in the model dtype (bf16), shared by every layer, inside 'Model loading took'."""
    return m.max_position_embeddings * m.head_dim * 2.0


def cuda_graph_pool() -> float:
    """The graph pool a captured engine keeps (measured from start-up logs, not derived)."""
    return measured("cuda_graph_pool_gib")["typical"] * C.GIB


def requested_bytes(total: float, util: float) -> float:
    return float(math.ceil(total * util))


def kv_blocks(kv_bytes: float, per_token: int, block_size: int) -> int:
    """Whole blocks of `block_size` tokens the pool holds (vLLM floors available // page // layers)."""
    return max(0, int(kv_bytes // (per_token * block_size)))


def concurrency(blocks: int, max_model_len: int, block_size: int, rule: str = "blocks") -> float:
    """vLLM's 'Maximum concurrency': blocks over the blocks one max_model_len request needs (0.8.5: the
    pool's tokens over max_model_len)."""
    if rule == "tokens":
        return blocks * block_size / max_model_len
    return blocks / -(-max_model_len // block_size)


def edge_spread() -> float:
    """How close to the one-sequence edge a pool may be before the verdict is a warning (measured)."""
    return measured("edge_spread_gib")["value"] * C.GIB
