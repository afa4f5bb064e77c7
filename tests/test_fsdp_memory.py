"""verl FSDP learner memory (hpcrl/memory/fsdp_learner.py) against hand-computed terms and the
measured rows in benchmarks/results/fsdp_measured.jsonl, fsdp_post_fit.jsonl and fsdp_heldout2.jsonl
(benchmarks/fsdp_memory.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcrl.errors import HpcrlError
from hpcrl.memory.fsdp_learner import FsdpSetup, flat_numel, fsdp_learner_memory, root_grad_bytes
from hpcrl.models.spec import ModelSpec

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "benchmarks" / "results" / "fsdp_measured.jsonl"
POST_FIT = ROOT / "benchmarks" / "results" / "fsdp_post_fit.jsonl"
# measured after the fit, never fitted: Qwen3, Llama-3.2, LoRA r32, 32k tokens (2x H200)
HELDOUT2 = ROOT / "benchmarks" / "results" / "fsdp_heldout2.jsonl"
# per-stream rows, named streams after the last update (2x H200; split by their tags, fit: / held:)
STREAMS = ROOT / "benchmarks" / "results" / "fsdp_streams.jsonl"
OFFLOAD = {"none": "none", "verl": "param_optimizer", "cpu_policy": "cpu_policy"}
# the harness's stream names (fsdp_memory.py stream_names) -> fsdp_learner.stream_reserved's
STREAM_OF = {
    "default": "default",
    "actor.post_backward_stream": "post_backward",
    "actor.unshard_stream": "unshard",
    "actor.pre_unshard_stream": "pre_unshard",
    "ref.unshard_stream": "reference unshard",
    "ref.pre_unshard_stream": "reference pre_unshard",
    "actor.reduce_scatter_stream": "reduce_scatter",
    "actor.all_gather_copy_in_stream": "all_gather",
    "actor.all_gather_stream": "all_gather",
    "ref.all_gather_copy_in_stream": "reference all_gather",
    "ref.all_gather_stream": "reference all_gather",
}


def spec(name: str) -> ModelSpec:
    raw = json.loads((ROOT / "benchmarks" / "configs" / f"{name}.json").read_text())
    return ModelSpec.from_hf_config(raw, name)


def setup_of(row: dict) -> FsdpSetup:
    m = spec(row["model"])
    # the row's own count of trainable parameters (peft's, on the GPU machine), not ModelSpec's
    adapters = row["trainable_params"] if row.get("lora_rank") else 0
    return FsdpSetup(m, row["world"], row["seq"], row["micro_batches"], row["fsdp"],
                     bool(row["ref"]), OFFLOAD[row["offload"]], adapters)  # fmt: skip


def setup_of_row(row: dict) -> FsdpSetup:
    """setup_of with the row's verl version's update (1dda039b: the engine workers)."""
    from dataclasses import replace

    from hpcrl.planning.backends.verl_memory import fsdp_update

    s = setup_of(row)
    return replace(s, update=fsdp_update("verl", "1dda039b")) if row.get("verl") == "1dda039b" else s


def measured_streams(row: dict) -> dict[str, float]:
    """GiB reserved per stream after the last update, by fsdp_learner's stream names."""
    out: dict[str, float] = {}
    for name, (reserved, _allocated, _segments) in row["stream_trace"][-1][1].items():
        out[STREAM_OF.get(name, name)] = out.get(STREAM_OF.get(name, name), 0.0) + reserved
    return out


def rows(status: str = "ok", paths: tuple[Path, ...] = (ROWS, POST_FIT, HELDOUT2)) -> list[dict]:
    lines = [line for p in paths for line in p.read_text().splitlines()]
    return [r for r in map(json.loads, lines) if r.get("status") == status]


def test_fsdp1_flattens_a_tied_embedding_twice():
    # Qwen2.5-0.5B: 494,032,768 parameters (model_configs.json) + 151,936 x 896 tied embedding
    assert flat_numel(FsdpSetup(spec("qwen2.5-0.5b"), fsdp_version=1)) == 494_032_768 + 136_134_656


def test_optimizer_step_holds_twenty_bytes_per_shard_element():
    # Qwen2.5-7B (untied), 2 ranks: 4 (fp32 shard) + 4 (grad) + 8 (Adam) + 4 (foreach temporary)
    # bytes x 7,615,616,512 / 2 = 76,156,165,120 bytes before the fitted fixed term
    b = fsdp_learner_memory(FsdpSetup(spec("qwen2.5-7b"), n_gpus=2, tokens_per_gpu=8192, fsdp_version=2))
    step = b.moments["optimizer step"]
    assert sum(v for k, v in step.items() if k != "fixed (fitted)") == 76_156_165_120


def test_one_micro_batch_holds_no_gradients_at_the_logits_moment():
    # zero_grad (dp_actor.py:560) freed them; with two, the first one's 4 B x P/N are alive
    one = fsdp_learner_memory(FsdpSetup(spec("qwen2.5-1.5b"), micro_batches=1, fsdp_version=2))
    two = fsdp_learner_memory(FsdpSetup(spec("qwen2.5-1.5b"), micro_batches=2, fsdp_version=2))
    key = "gradients of earlier micro-batches"
    assert (one.moments["logits"][key], two.moments["logits"][key]) == (0.0, 4 * 1_543_714_304)


def test_seven_b_on_two_gpus_at_8k_peaks_at_the_optimizer_step():
    b = fsdp_learner_memory(FsdpSetup(spec("qwen2.5-7b"), n_gpus=2, tokens_per_gpu=8192))
    assert b.peak_moment == "optimizer step"


def test_every_measured_row_peak_allocated_within_five_percent():
    errs = {(r["model"], r["world"], r["seq"], r["micro_batches"], r["fsdp"], r["ref"], r["offload"], r.get("lora_rank")):
            fsdp_learner_memory(setup_of(r)).peak_gib / r["peak_alloc_gib"] - 1 for r in rows()}  # fmt: skip
    print("\n".join(f"{k}: {e:+.2%}" for k, e in errs.items()))
    assert max(abs(e) for e in errs.values()) < 0.05


def test_rows_that_ran_out_of_memory_are_predicted_over_the_card():
    oom = rows("oom")
    # FSDP2 7B at 16k asked for 4.64 GiB on top of 74.24 allocated: 78.88, the predicted peak
    assert oom and all(fsdp_learner_memory(setup_of(r)).reserved_gib > r["total_gib"] for r in oom)
    # and so does what the verdict rests on where the allocator gives cache back (its floor)
    assert all(fsdp_learner_memory(setup_of(r)).floor_bytes > r["total_gib"] * 2**30 for r in oom)


def test_cpu_offload_policy_is_refused_for_fsdp1():
    with pytest.raises(HpcrlError, match="FSDP2 only"):
        fsdp_learner_memory(FsdpSetup(spec("qwen2.5-1.5b"), fsdp_version=1, offload="cpu_policy"))


def test_verl_config_gives_the_actor_update_it_runs():
    from hpcrl.planning.backends import get_backend
    from hpcrl.planning.config import load_run_config

    verl = get_backend("verl")
    cfg = load_run_config(
        "verl-grpo-qwen2.5-7b",
        ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=6", "actor_rollout_ref.actor.strategy=fsdp2"],
    )
    s = verl.fsdp_setup(cfg, verl.workload_from_config(cfg), n_gpus=2)
    # ppo_mini_batch_size 48 x rollout.n 8 / 2 GPUs = 192 sequences, 6 per micro-batch: 32;
    # use_kl_loss true in the config: a reference policy
    assert (s.micro_batches, s.fsdp_version, s.reference_policy, s.offload) == (32, 2, True, "none")


def test_allocator_margin_covers_every_measured_reserved_peak():
    """The verdict's margin (FIT margin_fraction, fitted on the training rows by benchmarks/fit_fsdp.py):
    no measured row, held out or measured after the fit, reserved more than prediction + margin."""
    from hpcrl.memory.fsdp_learner import fsdp_margin

    over = [
        (r["model"], r["world"], r["seq"], r["fsdp"])
        for r in rows()
        if r["peak_reserved_gib"] * 2**30
        > (b := fsdp_learner_memory(setup_of(r))).reserved_bytes + fsdp_margin(b.reserved_bytes)
    ]
    assert not over


def test_lora_under_fsdp_trains_only_the_adapters():
    """LoRA r16 on Qwen2.5-7B, 2 GPUs: hand count. Adapters on q,k,v,o,gate,up,down of 28 layers:
    r x (in + out) per projection = 16 x (3584+3584 + 3584+512 + 3584+512 + 3584+3584 + 3584+18944
    + 3584+18944 + 18944+3584) = 16 x 90,112 = 1,441,792 per layer, x 28 = 40,370,176 parameters.
    Per GPU: Adam 8 B and foreach temporary 4 B over half of them."""
    from hpcrl.memory.fsdp_learner import FsdpSetup, fsdp_learner_memory
    from hpcrl.models import resolve_model

    adapters = 40_370_176
    b = fsdp_learner_memory(FsdpSetup(resolve_model("Qwen/Qwen2.5-7B"), n_gpus=2, adapter_params=adapters))
    step = b.moments["optimizer step"]
    assert (step["Adam moments (fp32) of LoRA adapters"], step["foreach AdamW temporary of LoRA adapters"]) == (
        8.0 * adapters / 2,
        4.0 * adapters / 2,
    )


def test_modelspec_counts_the_measured_qwen3_and_llama32_parameters():
    """The GPU machine's transformers built each config (Qwen3's q/k norms, Llama-3.2's tied embedding)
    and counted its parameters into the row; ModelSpec must agree."""
    got = {r["model"]: spec(r["model"]).total_params for r in rows(paths=(HELDOUT2,))}
    assert got == {r["model"]: r["params"] for r in rows(paths=(HELDOUT2,))}


def test_lora_rank_32_adapters_counted_as_peft_counted_them():
    # Qwen2.5-1.5B, all-linear r32, 28 layers: 32 x (1536+1536 + 1536+256 + 1536+256 + 1536+1536
    # + 1536+8960 + 1536+8960 + 8960+1536) = 32 x 41,216 = 1,318,912 per layer, x 28 = 36,929,536
    row = next(r for r in rows(paths=(HELDOUT2,)) if r["model"] == "qwen2.5-1.5b" and r.get("lora_rank"))
    assert (row["trainable_params"], spec("qwen2.5-1.5b").lora_params(32)) == (36_929_536, 36_929_536)


def test_a_frozen_root_unit_adds_no_cached_gradient_blocks():
    """Qwen2.5-1.5B, FSDP1: the root unit flattens the tied embedding twice, 2 x 151,936 x 1,536 =
    466,747,392 elements, 1,866,989,568 fp32 gradient bytes; under LoRA the root is frozen: none."""
    full = FsdpSetup(spec("qwen2.5-1.5b"), fsdp_version=1)
    lora = FsdpSetup(spec("qwen2.5-1.5b"), fsdp_version=1, adapter_params=36_929_536)
    assert (root_grad_bytes(full), root_grad_bytes(lora)) == (1_866_989_568, 0.0)


def test_fsdp1_side_streams_by_hand_qwen25_7b_two_gpus():
    """Qwen2.5-7B (untied), FSDP1, 2 GPUs, 2 micro-batches. Root unit 2 x 152,064 x 3,584 = 1,089,994,752
    elements; a layer (7,615,616,512 - 1,089,994,752) / 28 = 233,057,920. verl 1dda039b (no_sync):
    unshard = 2 B x root + 2 B x 7,615,616,512 (the unsharded bf16 gradients) + 2 B x 4 layers
    = 19,275,685,888 B (measured 17.97 GiB = 19.30e9 B); post-backward = 4 B x 7,615,616,512 / 2 (the shards)
    + 4 B x root + 4 B x layer = 20,523,443,712 B (measured 19.12 GiB); b178a3cd (a reduce per micro-batch):
    unshard 2 B x root x 2 + 2 B x 4 layers = 6,224,442,368 B (measured 5.80 GiB), post-backward one more
    root shard, 4 B x root / 2: 22,703,433,216 B (measured 21.15 GiB); pre-unshard 2 B x root / 2 both."""
    from hpcrl.planning.backends.verl_memory import fsdp_update

    now = fsdp_learner_memory(FsdpSetup(spec("qwen2.5-7b"), n_gpus=2, update=fsdp_update("verl", "1dda039b"))).streams
    old = fsdp_learner_memory(FsdpSetup(spec("qwen2.5-7b"), n_gpus=2)).streams
    assert (now["unshard"], now["post_backward"], now["pre_unshard"]) == (19_275_685_888, 20_523_443_712, 1_089_994_752)
    assert (old["unshard"], old["post_backward"], old["pre_unshard"]) == (6_224_442_368, 22_703_433_216, 1_089_994_752)


def test_fsdp2_side_streams_by_hand_cpu_offload_policy():
    """Qwen2.5-1.5B (tied), FSDP2 with CPUOffloadPolicy, 2 GPUs: V x h = 151,936 x 1,536 = 233,373,696.
    The reduce-scatter stream holds one root-unit shard, 4 B x V h / 2 = 466,747,392 B (measured 0.45 GiB =
    483e6 B); the all-gather streams its output 2 B x V h and, per rank, the fp32 shard copied in and its bf16
    cast, 6 B x V h / 2: 1,166,868,480 B (measured 1.10 GiB). No default-stream term but the fitted cache."""
    b = fsdp_learner_memory(FsdpSetup(spec("qwen2.5-1.5b"), n_gpus=2, fsdp_version=2, offload="cpu_policy"))
    assert (b.streams["reduce_scatter"], b.streams["all_gather"]) == (466_747_392, 1_166_868_480)
    assert b.reserved_bytes == sum(b.streams.values())


def test_side_streams_match_every_per_stream_row():
    """Each side stream's high-water (derived, no constant fitted) against its measured reserve on the rows of
    fsdp_streams.jsonl (2x H200, named streams after the last update): within 0.7 GiB each (the worst: FSDP1
    pre-unshard under LoRA on one GPU, 2.79 GiB predicted, the whole bf16 copy, 2.12 measured)."""
    misses = []
    for r in rows(paths=(STREAMS,)):
        want = measured_streams(r)
        got = fsdp_learner_memory(setup_of_row(r)).streams
        misses += [
            (r["tag"], k, round(want.get(k, 0.0), 2), round(v / 2**30, 2))
            for k, v in got.items()
            if k != "default" and abs(v / 2**30 - want.get(k, 0.0)) > 0.7
        ]
    assert not misses


def test_per_stream_rows_held_out_reserved_within_eight_percent():
    """The held: rows of fsdp_streams.jsonl (split by the matrix's tags before the run; read by no fit)."""
    errs = {
        r["tag"]: fsdp_learner_memory(setup_of_row(r)).reserved_gib / r["peak_reserved_gib"] - 1
        for r in rows(paths=(STREAMS,))
        if not r["tag"].startswith("fit:")
    }
    print("\n".join(f"{k}: {e:+.1%}" for k, e in errs.items()))
    assert len(errs) == 16 and max(abs(e) for e in errs.values()) < 0.08


def test_new_architectures_lora_and_32k_held_out_reserved_within_eight_percent():
    """fsdp_heldout2.jsonl was measured after the fit and never fitted (the issue's reserved target: 8%)."""
    errs = {(r["model"], r["world"], r["seq"], r["fsdp"], r.get("lora_rank")):
            fsdp_learner_memory(setup_of(r)).reserved_gib / r["peak_reserved_gib"] - 1
            for r in rows(paths=(HELDOUT2,))}  # fmt: skip
    print("\n".join(f"{k}: {e:+.1%}" for k, e in errs.items()))
    assert len(errs) == 12 and max(abs(e) for e in errs.values()) < 0.08
