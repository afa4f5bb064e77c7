"""The learner time model (hpcrl/memory/learner_time.py): each term against a hand count, the profile's
link bandwidths and their defaults, the fit's reproducibility, and plan-memory's learner.time.

Expected values are computed by hand below from the toy model's shapes (a Llama-style model: 2 layers,
hidden 1024, MLP 4096, 8 heads of 128, vocabulary 1000, untied, no biases), never with the code."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpcrl.memory.gpu_rates import Rates, fp32_tflops, link_defaults, links_gbs, rates_for
from hpcrl.memory.learner import LearnerSetup
from hpcrl.memory.learner_time import (
    fetched_tensors,
    learner_time,
    overlapped,
    param_tensors,
    reference_terms,
    time_terms,
)
from hpcrl.models import resolve_model
from hpcrl.models.spec import ModelSpec
from hpcrl.profiles import resolve_profile

from helpers import ROOT, ok_json, run_hpcrl

TOY = ModelSpec(
    name="toy",
    model_type="llama",
    hidden_size=1024,
    intermediate_size=4096,
    num_layers=2,
    num_heads=8,
    num_kv_heads=8,
    head_dim=128,
    vocab_size=1000,
    tie_word_embeddings=False,
)
# 1000 TFLOP/s, 2 TB/s HBM, 100 GB/s between GPUs, 10 GB/s to the host: round numbers for hand counts.
RATES = Rates(1000.0, 2.0, 100.0, 10.0, "toy GPU")
# Hand counts of TOY: per layer q, k, v, o 4 x 1024^2 = 4,194,304 and gate, up, down 3 x 1024 x 4096 =
# 12,582,912 (16,777,216 linear) + 2 norms x 1024 = 16,779,264; 2 layers 33,558,528; embedding and
# lm_head 1,024,000 each; final norm 1024: 35,607,552 parameters.
TOTAL = 35_607_552


def toy(**kw) -> LearnerSetup:
    return LearnerSetup(model=TOY, **{"tokens_per_gpu": 1000, "gradient_checkpointing": False, **kw})


def test_full_training_matmuls_are_six_flops_per_weight_per_token():
    # (33,558,528 decoder + 1,024,000 lm_head) x 1000 tokens x (2 forward + 2 input grads + 2 weight grads)
    micro, _ = time_terms(toy(), RATES)
    assert micro["matmul"] == pytest.approx(6 * 34_582_528 * 1000 / 1e15)


def test_gradient_checkpointing_adds_the_decoder_forward_again():
    micro, _ = time_terms(toy(gradient_checkpointing=True), RATES)
    assert micro["matmul"] == pytest.approx((6 * 34_582_528 + 2 * 33_558_528) * 1000 / 1e15)


def test_lora_s_frozen_base_runs_forward_and_input_gradients_only():
    # The adapters' own matmuls are the adapter path's (next tests), not the base's.
    micro, _ = time_terms(toy(lora_rank=8), RATES)
    assert micro["matmul"] == pytest.approx(4 * 34_582_528 * 1000 / 1e15)


# TOY per layer: in-features q, k, v, o 1024 each, gate, up 1024, down 4096 (sum 10,240); out-features
# q, k, v, o 1024 each, gate, up 4096, down 1024 (sum 13,312); r8 adapters: 2 x 8 x (10,240 + 13,312) =
# 376,832 FLOPs per token per layer, 753,664 for 2 layers.


def test_fp32_adapters_run_their_matmuls_at_the_fp32_peak_and_cast_around_them():
    # Bytes per token per layer, peft's Linear.forward with fp32 adapters: per in-feature cast 2 read + 4
    # written, lora_A reads 4 (10); per out-feature lora_B writes 4, scaling 4 + 4, add 2 + 4 read 4
    # written, cast back 4 + 2 (28): 10 x 10,240 + 28 x 13,312 = 475,136, 950,272 for 2 layers. No GPU
    # family matches "toy GPU": the A100's fp32 / bf16 ratio 19.5 / 312, so 62.5 TFLOP/s. 3 passes.
    micro, _ = time_terms(toy(lora_rank=8, adapter_bytes=4.0), RATES)
    assert micro["lora_path"] == pytest.approx(3 * 1000 * (753_664 / 62.5e12 + 950_272 / 2e12))


def test_bf16_adapters_skip_the_casts_and_run_at_the_bf16_peak():
    # Per in-feature lora_A reads 2; per out-feature lora_B writes 2, scaling 2 + 2, add 2 + 2 read 2
    # written (12): 2 x 10,240 + 12 x 13,312 = 180,224 bytes per layer, 360,448 for 2 layers.
    micro, _ = time_terms(toy(lora_rank=8), RATES)
    assert micro["lora_path"] == pytest.approx(3 * 1000 * (753_664 / 1e15 + 360_448 / 2e12))


def test_bf16_adapters_are_derived_from_the_fp32_adapter_rows():
    s = LearnerSetup(model=resolve_model("qwen2.5-3b"), tokens_per_gpu=8192, lora_rank=16)
    assert "bf16 LoRA adapters" in learner_time(s, resolve_profile("berzelius-hopper", None)).basis


def test_an_h100_s_fp32_peak_is_its_datasheet_67_tflops():
    assert fp32_tflops(Rates(989.0, 3.35, 450.0, 64.0, "NVIDIA H100 80GB HBM3")) == pytest.approx(67.0)


def test_attention_is_quadratic_in_the_packed_tokens():
    # 2 T^2 q_dim per layer forward, twice that backward: 2 x 1000^2 x 1024 x 2 layers x 3
    micro, _ = time_terms(toy(), RATES)
    assert micro["attention"] == pytest.approx(2 * 1000**2 * 1024 * 2 * 3 / 1e15)


def test_zero3_gathers_weights_each_pass_and_reduce_scatters_gradients():
    # N=2, checkpointing: 3 gathers of bf16 weights + bf16 gradients, half of it over the link each way.
    micro, _ = time_terms(toy(n_gpus=2, gradient_checkpointing=True), RATES)
    assert micro["collectives"] == pytest.approx(0.5 * (3 * 2 * TOTAL + 2 * TOTAL) / 100e9)


def test_fp32_gradient_partitions_reduce_four_bytes_each():
    micro, _ = time_terms(toy(n_gpus=2, gradient_checkpointing=True, grad_accum_dtype="fp32"), RATES)
    assert micro["collectives"] == pytest.approx(0.5 * (3 * 2 * TOTAL + 4 * TOTAL) / 100e9)


def test_fsdp_gathers_forward_and_backward_and_reduces_fp32():
    micro, _ = time_terms(toy(n_gpus=4, sharding="fsdp"), RATES)
    assert micro["collectives"] == pytest.approx(0.75 * (2 * 2 * TOTAL + 4 * TOTAL) / 100e9)


def test_fsdp_launches_three_collectives_per_layer_on_more_than_one_gpu():
    micro, _ = time_terms(toy(n_gpus=2, sharding="fsdp"), RATES)
    assert micro["collective_calls"] == 2 * 3


def test_optimizer_offload_runs_adam_on_the_host_for_the_rank_s_partition():
    _, step = time_terms(toy(n_gpus=2, offload="optimizer"), RATES)
    assert (step["cpu_adam"], step["host_copies"]) == pytest.approx((TOTAL / 2, 2 * TOTAL / 2 / 10e9))


def test_gpu_adam_reads_the_rank_s_partition_over_hbm():
    _, step = time_terms(toy(n_gpus=2), RATES)
    assert step["adam_zero"] == pytest.approx(TOTAL / 2 / 2e12)


def test_four_bit_bases_dequantize_their_linears_in_every_pass():
    # 2 x 16,777,216 NF4 weights x (0.5 + 4/64 read, 2 written, 2 read) bytes x 3 passes over 2 TB/s
    micro, _ = time_terms(toy(zero_stage=0, lora_rank=8, load_in_4bit=True, gradient_checkpointing=True), RATES)
    assert micro["dequant_4bit"] == pytest.approx(33_554_432 * 4.5625 * 3 / 2e12)


def test_deepspeed_fetches_every_named_parameter_of_qwen2_5_1_5b():
    # Qwen2ForCausalLM: 28 layers x (q, k, v weights and biases, o, gate, up, down, 2 norms) + embed + norm
    # (the lm_head is tied): 338 named parameters.
    assert param_tensors(resolve_model("qwen2.5-1.5b")) == 338


def test_deepspeed_gathers_only_qwen2_5_1_5b_s_tensors_above_its_persistence_threshold():
    # 28 layers x q (1536 x 1536), k and v (1536 x 256 = 393,216), o, gate, up, down (1536 x 8960): 7 above
    # 100,000 elements; biases and norms below; the tied embedding (151,936 x 1536): 28 x 7 + 1 = 197.
    assert fetched_tensors(resolve_model("qwen2.5-1.5b")) == 197


def test_lora_r16_adds_only_qwen2_5_1_5b_s_adapters_above_the_threshold():
    # r16: lora_A 16 x in, lora_B out x 16; above 100,000 only gate's and up's B (8960 x 16 = 143,360) and
    # down's A (16 x 8960): 3 per layer, 197 + 28 x 3 = 281.
    assert fetched_tensors(resolve_model("qwen2.5-1.5b"), lora_rank=16) == 281


def test_a_gh200_is_not_taken_for_an_h200():
    assert link_defaults("NVIDIA GH200 120GB") == (150.0, 450.0)


def test_a_profile_without_link_fields_gets_its_gpu_model_s_defaults():
    p = resolve_profile("berzelius", None)
    old = p.model_copy(
        update={
            "gpu": p.gpu.model_copy(update={"intra_node_gbs": None, "host_link_gbs": None}),
            "node": p.node.model_copy(update={"inter_node_gbs": None}),
        }
    )
    assert links_gbs(old) == {"intra_node": 300.0, "inter_node": 25.0, "host": 32.0}


def test_learners_spanning_nodes_use_the_network_per_gpu():
    # Berzelius: 8 x 200 Gb/s HDR per node of 8 GPUs = 25 GB/s per GPU
    assert rates_for(resolve_profile("berzelius", None), 16).link_gbs == 25.0


def test_an_a100_s_matmuls_scale_by_its_bf16_peak():
    s = LearnerSetup(model=resolve_model("qwen2.5-3b"), tokens_per_gpu=8192)
    a100 = learner_time(s, resolve_profile("berzelius:fat", None)).micro_terms["matmul"]
    h200 = learner_time(s, resolve_profile("berzelius-hopper", None)).micro_terms["matmul"]
    assert a100 / h200 == pytest.approx(989 / 312)


def test_an_unmeasured_gpu_says_derived():
    s = LearnerSetup(model=resolve_model("qwen2.5-3b"), tokens_per_gpu=8192)
    assert "derived: A100" in learner_time(s, resolve_profile("berzelius:fat", None)).basis


def test_the_committed_constants_are_a_fresh_fit_of_the_committed_rows():
    """The rows regression: fit_time.py re-fits and prints every row's predicted vs measured step and the
    held-out errors (run with -s to see them); --check fails when the committed FIT or split differ."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "fit_time.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(proc.stdout[-3000:])
    assert proc.returncode == 0, proc.stderr


def test_plan_memory_json_reports_the_learner_s_time():
    data = ok_json(
        run_hpcrl(
            "plan-memory",
            "--model",
            "qwen2.5-7b",
            "--learner-gpus",
            "2",
            "--tokens-per-gpu",
            "8192",
            "--cluster",
            "berzelius-hopper",
            "--json",
        )
    )
    assert set(data["learner"]["time"]) == {"micro_batch_s", "optimizer_step_s", "low", "high", "basis"}


def test_the_users_qlora_script_s_learner_time_says_its_dequantization_is_derived():
    data = ok_json(
        run_hpcrl(
            "plan-memory",
            "--config",
            "custom-ppo-qwen2.5-3b-qlora",
            "--cluster",
            "berzelius:fat",
            "--learner-gpus",
            "1",
            "--json",
        )
    )
    assert "4-bit dequantization" in data["learner"]["time"]["basis"]


def test_the_reference_forward_is_one_forward_of_the_base():
    assert reference_terms(toy(), RATES)["matmul"] == pytest.approx(2 * 34_582_528 * 1000 / 1e15)


def test_a_micro_batch_takes_the_larger_of_its_cpu_and_gpu_sides():
    # 0.5 s of ZeRO-3 hooks and 0.1 s of collective calls (CPU side) against 0.4 s of matmuls and 0.05 s of log-probs
    assert overlapped({"zero3_hooks": 0.5, "collective_calls": 0.1, "matmul": 0.4, "logprob_eager": 0.05}) == 0.6


def test_a_gh200_is_derived_not_taken_for_a_measured_h200():
    s = LearnerSetup(model=resolve_model("qwen2.5-3b"), tokens_per_gpu=8192)
    assert "derived: GH200" in learner_time(s, resolve_profile("isambard-ai", None)).basis
