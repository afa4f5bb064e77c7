"""OpenRLHF's ZeRO-3 learner (issue 24 items 9-12): its terms against hand computations from the
cited code (OpenRLHF 3c3be623, flash-attn v2.8.3), and plan-memory --config against the measured
rows (benchmarks/results/openrlhf_measured.jsonl; the error table is benchmarks/check_openrlhf.py's)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from hpcrl.memory.learner import LearnerSetup, learner_memory
from hpcrl.models import resolve_model
from hpcrl.planning.backends import get_backend

ROOT = Path(__file__).resolve().parents[1]
GIB = 1024**3
QWEN15_PARAMS = 1_543_714_304  # Qwen2.5-1.5B, shared/reference/model_configs.json
QWEN7_PARAMS = 7_615_616_512  # Qwen2.5-7B, same source
QWEN_VOCAB = 151_936  # Qwen2.5-1.5B's vocab_size


def _setup(model: str, **kw) -> LearnerSetup:
    """The learner as the framework's MemoryFacts.learner fixes it, on top of the given fields."""
    fixed = get_backend("openrlhf").memory.learner
    return LearnerSetup(model=resolve_model(model), **{**kw, **fixed})


def test_logprob_path_is_ten_bytes_per_logit():
    # fp32 logits (4, actor.py:267) + flash-attn's new fp32 gradient (4, cross_entropy.py:262)
    # + the bf16 gradient of the cast (2); the bf16 logits are gone (replaced in the output).
    lm = learner_memory(_setup("Qwen/Qwen2.5-1.5B", tokens_per_gpu=16384))
    assert lm.terms["log-prob path (fp32 logits)"] == 10 * 16384 * QWEN_VOCAB


def test_optimizer_step_still_holds_the_fp32_logits():
    # ppo_actor.py:294 keeps `output` (fp32 logits, 4 B each) alive until after optimizer_step (:359);
    # at 4k tokens on one GPU that moment is the peak (row c2:1:s4096).
    lm = learner_memory(_setup("Qwen/Qwen2.5-1.5B", tokens_per_gpu=4096))
    assert lm.terms.get("fp32 logits the step output still holds") == 4 * 4096 * QWEN_VOCAB


def test_reference_process_is_outside_the_actor_allocator():
    # colocate_actor_ref: the reference is its own process with bf16 ZeRO-3 weights 2P/N, its own
    # CUDA context (0.6 GiB) and NCCL buffers (0.4 GiB at N > 1): constants.py's measured values.
    lm = learner_memory(_setup("Qwen/Qwen2.5-7B", n_gpus=2, reference_policy=True))
    assert lm.reference_process_bytes == 2 * QWEN7_PARAMS / 2 + 1.0 * GIB


def test_reference_process_adds_nothing_to_the_actor_peak():
    with_ref = learner_memory(_setup("Qwen/Qwen2.5-7B", n_gpus=2, reference_policy=True))
    assert "reference policy (bf16)" not in with_ref.terms


def test_adapters_are_fp32():
    # peft's default autocast_adapter_dtype keeps adapters fp32 (actor.py:188). LoRA r16 on every
    # linear of Qwen2.5-1.5B (h 1536, kv 256, F 8960, 28 layers): 16 x (3072 + 1792 + 1792 + 3072
    # + 3 x 10496) = 659,456 per layer, 18,464,768 in all; one GPU holds all of it.
    lm = learner_memory(_setup("Qwen/Qwen2.5-1.5B", lora_rank=16))
    assert lm.terms["parameters (bf16)"] == 2 * QWEN15_PARAMS + 4 * 18_464_768


def _check_module():
    spec = importlib.util.spec_from_file_location("check_openrlhf", ROOT / "benchmarks" / "check_openrlhf.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


CHECK = _check_module()
HELD = sorted(CHECK.held_out())
ROWS = {r["tag"]: r for r in map(json.loads, CHECK.ROWS.read_text().splitlines()) if r.get("status") == "ok"}


@pytest.mark.parametrize("tag", [t for t in HELD if t in ROWS])
def test_plan_memory_config_within_5_percent_on_held_out_row(tag):
    row = ROWS[tag]
    planned = CHECK.predicted(row)["peak_allocated_gib"]
    print(f"{tag}: measured {row['peak_alloc_gib']:.2f} GiB, planned {planned:.2f} GiB")
    assert abs(planned / row["peak_alloc_gib"] - 1) < 0.05
