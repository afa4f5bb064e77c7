"""verl's FSDP actor update per verl version (issue 24): the terms 1dda039b (0.10.0.dev, the engine
workers) changes, read from each version's capabilities, against hand computations from the cited
code and against the held-out rows of benchmarks/results/fsdp_current_verl.jsonl (benchmarks/fsdp_memory.py
--verl, 2x H200). Nothing here runs a GPU."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hpcrl.memory.fsdp_learner import FsdpSetup, VerlUpdate, fsdp_learner_memory
from hpcrl.models.spec import ModelSpec
from hpcrl.planning.backends.verl_memory import fsdp_update

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "benchmarks" / "results" / "fsdp_current_verl.jsonl"
OFFLOAD = {"none": "none", "verl": "param_optimizer", "cpu_policy": "cpu_policy"}
# transformer_impl.py:1357 (out of place), :672-698 + 725-730 (no_sync), fsdp_utils.py:549-570 (lm_head unit)
CURRENT = VerlUpdate("0.10.0.dev", "out_of_place", "last_micro_batch", True)


def spec(name: str) -> ModelSpec:
    return ModelSpec.from_hf_config(json.loads((ROOT / "benchmarks" / "configs" / f"{name}.json").read_text()), name)


def setup_of(row: dict) -> FsdpSetup:
    adapters = row["trainable_params"] if row.get("lora_rank") else 0  # peft's own count on the GPU machine
    s = FsdpSetup(
        spec(row["model"]),
        row["world"],
        row["seq"],
        row["micro_batches"],
        row["fsdp"],
        bool(row["ref"]),
        OFFLOAD[row["offload"]],
        adapters,
    )  # type: ignore[arg-type]
    return replace(s, update=CURRENT) if row["verl"] == "1dda039b" else s


def rows(verl: str) -> list[dict]:
    return [r for r in map(json.loads, ROWS.read_text().splitlines()) if r["status"] == "ok" and r["verl"] == verl]


@pytest.mark.parametrize(
    "version,expected",
    [
        # b178a3cd: dp_actor.py:259 logits_rmpad.div_, :660 backward per micro-batch, fsdp_utils.py:523 embedding only
        ("0.8.0.dev", ("in_place", "every_micro_batch", False)),
        # 1dda039b: transformer_impl.py:1357 `/`, :729 _gradient_sync_context, fsdp_utils.py:559 embed_tokens + lm_head
        ("0.10.0.dev", ("out_of_place", "last_micro_batch", True)),
        (None, ("out_of_place", "last_micro_batch", True)),  # the newest hpcrl knows is the default
    ],
)
def test_each_version_reads_its_update_from_its_capabilities(version, expected):
    u = fsdp_update("verl", version)
    assert (u.temperature_divide, u.grad_sync, u.lm_head_own_unit_fsdp2) == expected


def test_the_out_of_place_divide_holds_four_bytes_per_logits_element():
    # Qwen2.5-1.5B, 8192 tokens: 4 x 8192 x 151,936 = 4,978,638,848 bytes (8 B at b178a3cd: 9,957,277,696)
    logits = fsdp_learner_memory(FsdpSetup(spec("qwen2.5-1.5b"), update=CURRENT)).moments["logits"]
    assert logits["log-prob path (4 B x T x V)"] == 4_978_638_848


def test_no_sync_leaves_fsdp1_gradients_unsharded_in_bf16():
    # Qwen2.5-7B (untied), 2 GPUs, 2 micro-batches: 2 B x 7,615,616,512 = 15,231,233,024 per GPU, the
    # same bytes as b178a3cd's fp32 shard 4 B x P / 2 (FSDP1's post-backward returns before its fp32 cast)
    b = fsdp_learner_memory(FsdpSetup(spec("qwen2.5-7b"), n_gpus=2, update=CURRENT))
    assert b.moments["logits"]["unsharded bf16 gradients of earlier micro-batches (no_sync)"] == 15_231_233_024


def test_no_sync_leaves_fsdp2_gradients_unsharded_in_fp32_even_under_cpu_offload_policy():
    # Qwen2.5-1.5B, 2 GPUs, FSDP2: 4 B x 1,543,714,304 = 6,174,857,216 on the GPU (b178a3cd: none, on the host)
    b = fsdp_learner_memory(
        FsdpSetup(spec("qwen2.5-1.5b"), n_gpus=2, fsdp_version=2, offload="cpu_policy", update=CURRENT)
    )
    assert b.moments["logits"]["unsharded fp32 gradients of earlier micro-batches (no_sync)"] == 6_174_857_216


def test_one_micro_batch_has_no_earlier_gradients_under_no_sync():
    b = fsdp_learner_memory(FsdpSetup(spec("qwen2.5-1.5b"), micro_batches=1, fsdp_version=2, update=CURRENT))
    assert b.moments["logits"]["unsharded fp32 gradients of earlier micro-batches (no_sync)"] == 0.0


def test_an_untied_lm_head_in_its_own_fsdp2_unit_frees_its_gathered_weight_after_backward():
    # Qwen2.5-7B, FSDP2, 2 GPUs: 152,064 x 3,584 = 544,997,376 lm_head elements; its bf16 grad and fp32 reduce
    # copy stay at the end of backward (6 B each), the gathered bf16 weight (2 B) is resharded
    b = fsdp_learner_memory(FsdpSetup(spec("qwen2.5-7b"), n_gpus=2, fsdp_version=2, update=CURRENT))
    assert b.moments["backward end"]["root unit params, grads and fp32 reduce copy"] == 6 * 544_997_376


def test_current_verl_rows_peak_allocated_within_five_percent_median_two():
    """Every 1dda039b row is held out (benchmarks/fit_split_current_verl.py; no constant was fitted to them)."""
    errs = {tuple(r[k] for k in ("model", "world", "seq", "micro_batches", "fsdp", "ref", "offload", "lora_rank")):
            fsdp_learner_memory(setup_of(r)).peak_gib / r["peak_alloc_gib"] - 1 for r in rows("1dda039b")}  # fmt: skip
    print("\n".join(f"{k}: {e:+.2%}" for k, e in errs.items()))
    assert len(errs) == 19 and max(map(abs, errs.values())) < 0.05 and statistics.median(map(abs, errs.values())) < 0.02


def test_current_verl_rows_reserved_within_eight_percent():
    """The issue's reserved target, 8%, on every held-out row of both versions, with reserved a sum over CUDA
    streams (the single-pool model missed it: -9.9% FSDP2 CPUOffloadPolicy, -9.4% 7B FSDP1 no_sync,
    -9.0% Qwen3-1.7B FSDP1 with a reference)."""
    for version in ("1dda039b", "b178a3cd"):
        errs = [fsdp_learner_memory(setup_of(r)).reserved_gib / r["peak_reserved_gib"] - 1 for r in rows(version)]
        assert max(map(abs, errs)) < 0.08 and statistics.median(map(abs, errs)) < 0.05


def test_the_b178a3cd_rows_measured_beside_them_keep_the_old_terms():
    """LoRA FSDP2 at 2 GPUs, LoRA with offload, Qwen3 / Llama with a reference policy (b178a3cd, held out)."""
    errs = [fsdp_learner_memory(setup_of(r)).peak_gib / r["peak_alloc_gib"] - 1 for r in rows("b178a3cd")]
    assert len(errs) == 5 and max(map(abs, errs)) < 0.01


def hpcrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True, timeout=120)


def test_plan_memory_follows_the_current_verl_by_default_and_the_named_version_otherwise():
    """The 7B, 2 GPUs, 8192 tokens, 2 micro-batches, FSDP2 rows: 1dda039b measured 77.58 GiB (no_sync's fp32
    gradients at the logits), b178a3cd 70.99 GiB (the optimizer step; fsdp_measured.jsonl, H100)."""
    base = [
        "plan-memory",
        "--json",
        "--backend",
        "verl",
        "--model",
        "Qwen/Qwen2.5-7B",
        "--learner-gpus",
        "2",
        "--tokens-per-gpu",
        "8192",
        "--micro-batches",
        "2",
        "--fsdp-version",
        "2",
    ]
    got = {}
    for version in ([], ["--framework-version", "b178a3cd"]):
        out = hpcrl(*base, *version)
        assert out.returncode == 0, out.stderr
        lr = json.loads(out.stdout)["learner"]
        got[lr["framework_version"]] = (lr["peak_phase"], lr["peak_allocated_gib"])
    assert got["0.10.0.dev"][0] == "logits" and got["0.10.0.dev"][1] == pytest.approx(77.58, rel=0.01)
    assert got["0.8.0.dev"][0] == "optimizer step" and got["0.8.0.dev"][1] == pytest.approx(70.99, rel=0.01)


def test_framework_version_with_a_config_is_refused_in_one_line():
    out = hpcrl("plan-memory", "--config", "verl-grpo-qwen2.5-7b", "--framework-version", "b178a3cd")
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "hpcrl: error: --framework-version b178a3cd: with --config the run's version is its "
        "hpcrl.framework_version (--set hpcrl.framework_version=NAME)"
    ]


@pytest.mark.parametrize(
    "traceback,version",
    [
        ('  File "/opt/verl/verl/workers/actor/dp_actor.py", line 631, in update_policy\n', "0.8.0.dev"),
        ('  File "/opt/verl/verl/workers/engine_workers.py", line 713, in update_actor\n', None),
    ],
)
def test_diagnose_models_the_verl_version_the_traceback_proves(traceback, version):
    """dp_actor.py is gone at 1dda039b (git ls-tree 1dda039b verl/workers/actor/ is empty)."""
    from hpcrl.logs.diagnose_context import Context
    from hpcrl.profiles import load_profile

    ctx = Context(load_profile("berzelius:fat"), {"backend": "verl"})
    ctx.learn("python3 -m verl.trainer.main_ppo trainer.nnodes=1\n" + traceback)
    assert ctx.config().hpcrl.framework_version == version


@pytest.mark.parametrize(
    "args, cited",
    [
        # verl's mixed precision, read at each commit (data/verl/1dda039b/capabilities.json, capabilities.json)
        ((), "verl/workers/engine/fsdp/transformer_impl.py:382 at 1dda039b"),
        (("--framework-version", "b178a3cd"), "verl/workers/fsdp_workers.py:499 at b178a3cd"),
        (("--config", "verl-grpo-qwen2.5-7b"), "verl/workers/engine/fsdp/transformer_impl.py:382 at 1dda039b"),
    ],
)
def test_the_assumptions_cite_the_verl_version_the_run_targets(args, cited):
    model = () if "--config" in args else ("--backend", "verl", "--model", "qwen2.5-1.5b", "--learner-gpus", "1")
    out = hpcrl("plan-memory", *model, *args)
    grads = [line for line in out.stdout.splitlines() if "assumes: gradients reduced in fp32" in line]
    assert len(grads) == 1 and cited in grads[0], out.stdout + out.stderr


def test_a_plan_no_node_count_fits_says_the_unsharded_gradients_are_why():
    # verl 1dda039b keeps unsharded gradients until the last micro-batch (transformer_impl.py:672-698): FSDP1's are
    # bf16 over the model's 72,706,203,648 parameters (Qwen2.5-72B, config.json shapes) = 135.4 GiB on every GPU.
    out = hpcrl(
        "plan",
        "--config",
        "verl-grpo-qwen2.5-7b",
        "--model",
        "72b",
        "--nodes",
        "1",
        "--set",
        "data.max_response_length=16384",
    )
    line = out.stderr.strip()
    assert (
        out.returncode,
        line.count("\n"),
        "(135 GiB per GPU at any GPU count" in line,
        "hpcrl.framework_version=b178a3cd" in line,
    ) == (2, 0, True, True)


@pytest.mark.parametrize("update", [VerlUpdate(), CURRENT])
def test_under_lora_the_reference_is_the_actor_with_its_adapter_disabled(update):
    # ref_in_actor (ray_trainer.py:298-302 at b178a3cd, ppo/v1/trainer_base.py:316-322 at 1dda039b): no second
    # module, so no reference root unit on the GPU. Without LoRA, FSDP1 on 2 GPUs keeps the reference's
    # gathered root (embedding + lm_head of Qwen2.5-1.5B, tied but flattened twice): 2 B x 2 x 151,936 x 1,536.
    base = FsdpSetup(spec("qwen2.5-1.5b"), 2, 8192, 2, 1, True, update=update)
    with_ref = fsdp_learner_memory(base).moments["logits"]["reference root unit (bf16)"]
    lora = fsdp_learner_memory(replace(base, adapter_params=18_464_768)).moments["logits"]["reference root unit (bf16)"]
    assert (with_ref, lora) == (2 * 2 * 151_936 * 1_536, 0.0)


@pytest.mark.parametrize(
    "args, vllm",
    [
        # verl b178a3cd installs vllm==0.11.0 (scripts/install_vllm_sglang_mcore.sh:12); 1dda039b pins 0.24.0
        # (pyproject.toml:95): the engine follows the version the learner follows, with or without a config.
        (
            ("--backend", "verl", "--model", "qwen2.5-1.5b", "--learner-gpus", "1", "--framework-version", "b178a3cd"),
            "0.11.0",
        ),
        (("--config", "verl-grpo-qwen2.5-7b", "--set", "hpcrl.framework_version=b178a3cd"), "0.11.0"),
        (("--backend", "verl", "--model", "qwen2.5-1.5b", "--learner-gpus", "1"), "0.24.0"),
    ],
)
def test_the_engine_follows_the_verl_version(args, vllm):
    out = hpcrl("plan-memory", *args, "--json")
    assert json.loads(out.stdout)["engine"]["vllm_version"] == vllm, out.stderr
