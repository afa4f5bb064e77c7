"""vLLM engine memory as each vLLM version accounts it (issue 25).

Expected values come from vLLM's source at the cited tags or from public vLLM start-up logs
(benchmarks/vllm_startups/cases.jsonl); no GPU here runs vLLM, so nothing is mocked but nothing
is run on a GPU either.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hpcrl.memory import vllm_accounting as va
from hpcrl.memory.constants import GIB
from hpcrl.memory.engine import EngineSetup, engine_memory
from hpcrl.models.catalog import resolve_model
from hpcrl.planning.backends import get_backend
from hpcrl.planning.config import load_run_config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import vllm_engine_check as check  # noqa: E402

QWEN3_32B_H100 = EngineSetup(
    model=resolve_model("qwen3-32b"),
    tp=1,
    gpu_memory_utilization=0.9,
    gpu_total_bytes=79.18 * GIB,
    max_seq_len=16000,
    max_num_seqs=1024,
)
LLAMA_3090_20K = EngineSetup(
    model=resolve_model("meta-llama/Llama-3.1-8B"),
    tp=1,
    gpu_memory_utilization=0.9,
    gpu_total_bytes=23.58 * GIB,
    max_seq_len=20000,
    vllm_version="0.6.4.post1",
)


@pytest.fixture(scope="module")
def h100_profile(tmp_path_factory) -> Path:
    """An H100-80GB profile: 79.18 GiB total as CUDA reports it (issue 25)."""
    text = (ROOT / "clusters" / "berzelius-hopper.yaml").read_text()
    text = re.sub(r"(?m)^(\s*)memory_gib: .*$", r"\1memory_gib: 79.18", text)
    text = re.sub(r"(?m)^(\s*)gpu\.memory_gib: .*$", r'\1gpu.memory_gib: "H100 80GB, 79.18 GiB total (issue 25)"', text)
    path = tmp_path_factory.mktemp("h100") / "h100.yaml"
    path.write_text(text)
    return path


def plan_memory(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpcrl", "plan-memory", *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_graph_pool_is_charged_inside_the_budget_from_0_24():
    # 0.24.0: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 1 (vllm/envs.py:1894-1895): capturing
    # graphs shrinks the pool by the graph pool and nothing else.
    at_0_24 = replace(QWEN3_32B_H100, vllm_version="0.24.0")
    eager, graphs = engine_memory(replace(at_0_24, enforce_eager=True)), engine_memory(at_0_24)
    assert eager.kv_cache - graphs.kv_cache == pytest.approx(va.measured("cuda_graph_pool_gib")["typical"] * GIB)


def test_graphs_outside_the_budget_add_to_the_real_footprint():
    # Before the estimate, vLLM captures graphs after sizing the pool: the GPU holds budget + pool.
    em = engine_memory(QWEN3_32B_H100)
    assert em.footprint == pytest.approx(-(-79.18 * GIB * 0.9 // 1) + 1.0 * GIB)


def test_graphs_leave_the_0_19_pool_alone():
    # 0.19.1: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 0 (vllm/envs.py:1654-1655).
    eager = replace(QWEN3_32B_H100, enforce_eager=True)
    assert engine_memory(eager).kv_cache == engine_memory(QWEN3_32B_H100).kv_cache


def test_0_19_sampler_warm_up_peak_is_the_hand_count_from_its_source():
    # vLLM 0.19.1, Llama-3.1-8B (vocab 128256, hidden 4096), 8192 batched tokens, 1024 sequences:
    # 1024 rows x 128256 x (2 bf16 logits + 4 fp32 copy + 4 probs + 4 noise) = 1,838,678,016 B
    # + Triton buffer 132 x 128256 x 4 = 67,719,168 B + hidden states 2 x 4096 x (8192 + 2 x 1024)
    # = 83,886,080 B (gpu_model_runner.py:5569-5572,5782-5789; sampler.py:90; topk_topp_sampler.py:106-113,
    # 334-346; topk_topp_triton.py:1011-1019) + PyTorch's cuBLAS 32 MiB + cuBLASLt 1 MiB workspaces on Hopper
    # (CublasHandlePool.cpp:147-150,186) = 1.886 GiB. vLLM 0.19.0 logged a 1.89 GiB torch peak for this engine.
    llama = EngineSetup(
        model=resolve_model("meta-llama/Llama-3.1-8B"),
        gpu_total_bytes=79.19 * GIB,
        gpu_memory_utilization=0.95,
        max_num_batched_tokens=8192,
        max_num_seqs=1024,
    )
    assert engine_memory(llama).activation_peak == 1_838_678_016 + 67_719_168 + 83_886_080 + 34_603_008


def test_concurrency_is_blocks_over_blocks_per_request():
    # vllm-project/vllm#10517: 1952 GPU blocks, "Maximum concurrency for 20000 tokens per request: 1.56x".
    assert f"{va.concurrency(1952, 20000, 16):.2f}" == "1.56"


def test_pool_is_whole_blocks():
    em = engine_memory(QWEN3_32B_H100)
    assert em.kv_tokens == int(em.kv_cache // (262_144 * 16)) * 16  # 64 layers x 8 KV heads x 128 x 2 x 2 B


def test_fp8_kv_cache_halves_bytes_per_token():
    em = engine_memory(replace(QWEN3_32B_H100, kv_cache_dtype="fp8"))
    assert em.kv_bytes_per_token == 64 * 8 * 128 * 2 * 1


def test_v0_profiles_the_whole_max_model_len():
    # vLLM 0.6.4 without chunked prefill runs max(max_model_len, 2048) tokens (vllm/config.py:1118);
    # the #10517 log: peak_torch_memory 17.06 GiB after 14.9888 GiB of weights at 20k tokens.
    assert engine_memory(LLAMA_3090_20K).activation_peak / GIB == pytest.approx(17.06 - 14.9888, rel=0.03)


def test_v0_refusal_at_29k_is_a_refusal():
    em = engine_memory(replace(LLAMA_3090_20K, max_seq_len=29000))  # vLLM refused: 23648 tokens < 29000
    assert not em.fits and "refuses to start" in em.reason


def test_committed_start_ups_held_out_within_5_percent_and_no_refusal_called_a_fit():
    cases = check.load_cases()
    held = [c for c in cases if c["role"] == "holdout"]
    bad = [c["id"] for c in held if check.kv_error(c) > 0.05] + [
        c["id"] for c in cases if c["refused"] and check.predict(c).fits
    ]
    assert (len(held), bad) == (11, [])


def test_the_measured_non_torch_growth_is_what_the_tune_logs_print():
    # The non-torch line of the six Llama-3.1-8B vLLM 0.19.0 logs (cases.jsonl, read by hand): 0.25 GiB in the
    # four TP 1 logs, 2.07 at TP 2, 2.13 at TP 4; the data file holds those, and the script reproduces them.
    data = json.loads((Path(va.__file__).parent / "data" / "vllm_accounting.json").read_text())
    assert (
        data["measured"]["non_torch_growth_gib"]["snapshot"]["by_tp"],
        check.non_torch_by_tp(check.load_cases()),
    ) == ({"1": 0.25, "2": 2.07, "4": 2.13}, {"1": 0.25, "2": 2.07, "4": 2.13})


def test_a_tp_with_no_log_takes_the_largest_logged_tp_below_it():
    # 0.19.1 charges growth over its snapshot: TP 8 has no committed log, so TP 4's 2.13 GiB (assumed).
    assert va.accounting("0.19.1").non_torch(8) == pytest.approx(2.13 * GIB)


def test_torch_peaks_of_the_logged_0_19_start_ups_to_the_printed_hundredth():
    # "torch peak memory increase" in each committed vLLM 0.19.0 log (1.89, 2.21, 2.21, 2.29 GiB), printed to
    # 0.01 GiB: the derived warm-up plus PyTorch's cuBLAS workspaces must round to it.
    rows = [c for c in check.load_cases() if "logged_torch_peak_gib" in c]
    off = [c["id"] for c in rows if abs(check.predict(c).activation_peak / GIB - c["logged_torch_peak_gib"]) > 0.005]
    assert (len(rows), off) == (14, [])


def test_the_tight_72b_tp2_start_up_within_5_percent():
    # Issue 25's tight engine: vLLM 0.19.0 logged 3.04 GiB of KV cache (held out; the rows that set the measured
    # non-torch growth are other models' logs).
    case = next(c for c in check.load_cases() if c["id"] == "qwen2.5-72b-h100-tp2-0.95-8k")
    assert (case["role"], check.kv_error(case) <= 0.05) == ("holdout", True)


def test_qwen3_32b_tight_engine_kv_pool_near_the_logged_4_45_gib_at_a_qwen3_era_vllm(h100_profile):
    # Issue 25's tight engine (no log recovered; the tune row of cases.jsonl says why 0.10.1.1). By hand from
    # vLLM 0.10.1.1's source: budget 0.9 x 79.18 = 71.262 GiB; weights 61.024 GiB + the rotary cache
    # 40960 x 128 x 2 B; sampler warm-up over min(2048, 1024) = 1024 rows x 151,936 x 38 B (the vocabulary
    # sort, data/vllm_accounting.json) + hidden states 2 x 5120 x (2048 + 2 x 1024) B + 33 MiB of cuBLAS
    # workspaces = 5.577 GiB; non-torch growth 0.25 GiB (measured, TP 1): 4.40 GiB. vLLM logged 4.45.
    out = plan_memory(
        "--model",
        "qwen3-32b",
        "--vllm-tp",
        "1",
        "--vllm-gpu-memory-utilization",
        "0.9",
        "--max-seq-len",
        "16000",
        "--vllm-max-num-seqs",
        "1024",
        "--vllm-version",
        "0.10.1.1",
        "--cluster-file",
        str(h100_profile),
        "--json",
    )
    assert json.loads(out.stdout)["engine"]["kv_cache_gib"] == pytest.approx(4.45, rel=0.05)


def test_sort_sampler_warm_up_peak_is_the_hand_count_from_its_source():
    # vLLM 0.10.1.1, Qwen3-32B (vocab 151,936, hidden 5120), 2048 batched tokens, 1024 sequences: the sort in
    # apply_top_k_top_p (topk_topp_sampler.py:189-209) holds 2 + 4 + 4 + 8 + 8 + 4 + 8 = 38 B per logit
    # (bf16 logits, fp32 copy, sorted values, int64 indices, PyTorch's reverse indices, cub's third key and
    # value buffers): 1024 x 151,936 x 38 = 5,912,133,632 B, + hidden states 2 x 5120 x (2048 + 2048) =
    # 41,943,040 B (gpu_model_runner.py:2423,2433,2622-2631), + 34,603,008 B of cuBLAS workspaces.
    assert (
        engine_memory(replace(QWEN3_32B_H100, vllm_version="0.10.1.1")).activation_peak
        == 5_912_133_632 + 41_943_040 + 34_603_008
    )


def test_0_8_5_warm_up_holds_only_the_sampled_rows_hidden_states():
    # vLLM 0.8.5.post1's _dummy_run returns hidden_states[logit_indices] (gpu_model_runner.py:1509): the
    # sampler peak adds 2 x 5120 x 1024 B, not the forward's 2048 rows.
    assert (
        engine_memory(replace(QWEN3_32B_H100, vllm_version="0.8.5.post1")).activation_peak
        == 5_912_133_632 + 10_485_760 + 34_603_008
    )


def test_0_8_5_concurrency_is_tokens_over_max_model_len():
    # vLLM 0.8.5.post1 prints KV tokens / max_model_len (kv_cache_utils.py:636), not blocks per request.
    em = engine_memory(replace(QWEN3_32B_H100, vllm_version="0.8.5.post1", max_seq_len=16008))
    assert em.concurrency == em.kv_tokens / 16008


@pytest.mark.parametrize("tp,logged", [(1, 14.99), (2, 7.51), (4, 3.77)])
def test_llama_weights_include_the_unsharded_rotary_cache_as_vllm_0_19_logged(tp, logged):
    # "Model loading took" on H100, vLLM 0.19.0 (llm-d-planner logs in cases.jsonl): the parameters plus one
    # 131072 x 128 bf16 cos/sin cache (rotary_embedding/base.py:57-63), printed to 0.01 GiB.
    llama = EngineSetup(model=resolve_model("meta-llama/Llama-3.1-8B"), tp=tp)
    assert engine_memory(llama).weights / GIB == pytest.approx(logged, abs=0.005)


def test_engine_that_cannot_hold_one_sequence_exits_2_with_the_reason(h100_profile):
    out = plan_memory(
        "--model",
        "qwen3-32b",
        "--vllm-tp",
        "1",
        "--vllm-gpu-memory-utilization",
        "0.9",
        "--max-seq-len",
        "40000",
        "--cluster-file",
        str(h100_profile),
    )
    assert (out.returncode, out.stderr.count("\n"), "refuses to start" in out.stderr) == (2, 1, True)


def test_without_a_tp_the_plan_picks_an_engine_vllm_starts(h100_profile):
    out = plan_memory(
        "--model",
        "qwen3-32b",
        "--vllm-gpu-memory-utilization",
        "0.9",
        "--max-seq-len",
        "40000",
        "--cluster-file",
        str(h100_profile),
        "--json",
    )
    engine = json.loads(out.stdout)["engine"]
    assert engine["tp"] > 1 and engine["kv_tokens"] >= 40000


@pytest.mark.parametrize(
    "flag,value,needle",
    [
        ("--vllm-max-num-seqs", "0", "--vllm-max-num-seqs"),
        ("--vllm-max-num-batched-tokens", "-8", "--vllm-max-num-batched-tokens"),
        ("--vllm-version", "0.5.0", "valid: 0.6.4.post1, 0.8.5.post1, 0.10.1.1, 0.11.0, 0.19.1, 0.24.0, 0.27.1"),
        ("--kv-cache-dtype", "int4", "--kv-cache-dtype"),
    ],
)
def test_bad_engine_flags_exit_2_with_one_line(flag, value, needle, h100_profile):
    out = plan_memory("--model", "qwen3-32b", "--cluster-file", str(h100_profile), flag, value)
    assert (out.returncode, out.stderr.count("\n"), needle in out.stderr) == (2, 1, True)


# Each framework's vLLM and the scheduler sizes its engines get, read from the framework's source
# (vllm_accounting.json's history of this data: open-instruct e6c3044 pyproject.toml:36 and
# vllm_utils.py:1270-1285; verl b178a3cd5 rollout.yaml:62,68 and scripts/install_vllm_sglang_mcore.sh:12 (vllm==0.11.0),
# verl 1dda039b pyproject.toml:95 (vllm==0.24.0); OpenRLHF 3c3be623 setup.py:77).
@pytest.mark.parametrize(
    "config,expected",
    [
        ("grpo-olmo3-32b", {"version": "0.19.1", "max_num_seqs": 128, "max_num_batched_tokens": 2048}),
        ("verl-grpo-qwen2.5-7b", {"version": "0.24.0", "max_num_seqs": 256, "max_num_batched_tokens": 8192}),
        (
            "verl-grpo-qwen2.5-7b --set hpcrl.framework_version=0.8.0.dev",
            {"version": "0.11.0", "max_num_seqs": 256, "max_num_batched_tokens": 8192},
        ),
        ("openrlhf-grpo-qwen2.5-7b", {"version": "0.27.1", "max_num_seqs": 128, "max_num_batched_tokens": 2048}),
    ],
)
def test_plan_sizes_engines_with_the_runs_own_framework_vllm(config, expected):
    out = subprocess.run(
        [sys.executable, "-m", "hpcrl", "plan", "--config", *config.split(), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(out.stdout)["layouts"][0]["engine_vllm"] == expected


def test_plan_memory_with_a_config_uses_the_same_vllm_as_plan():
    out = subprocess.run(
        [sys.executable, "-m", "hpcrl", "plan-memory", "--config", "verl-grpo-qwen2.5-7b", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(out.stdout)["engine"]["vllm_version"] == "0.24.0"


def test_a_pool_within_the_measured_spread_of_one_sequence_is_a_warning_not_a_silent_fit(h100_profile):
    # Qwen3-32B at vLLM 0.19.1 on the H100 profile, as open-instruct builds it (processed_logprobs): a 7.22 GiB
    # pool (the 7.85 GiB of raw_logprobs less the fp32 log-softmax, 1024 x 151,936 x 4 B), one 28,000-token
    # sequence 28,000 x 262,144 B = 6.84 GiB, 0.38 GiB apart: inside the 1.49 GiB held-out spread, so vLLM may
    # well refuse where hpcrl's pool still holds the sequence.
    out = plan_memory(
        "--model",
        "qwen3-32b",
        "--vllm-tp",
        "1",
        "--vllm-gpu-memory-utilization",
        "0.9",
        "--max-seq-len",
        "28000",
        "--vllm-max-num-seqs",
        "1024",
        "--cluster-file",
        str(h100_profile),
        "--json",
    )
    engine = json.loads(out.stdout)["engine"]
    assert (engine["fits"], "measured spread" in (engine["warning"] or "")) == (True, True)


def test_the_tight_engine_says_what_a_qwen3_era_vllm_would_give_when_the_version_is_assumed(h100_profile):
    # Issue 25's must-show command, no --vllm-version: the default (0.19.1) answers, and a note names the
    # other versions' pools, 0.10.1.1's being the hand count above (4.40 GiB; vLLM logged 4.45).
    out = plan_memory(
        "--model",
        "qwen3-32b",
        "--vllm-tp",
        "1",
        "--vllm-gpu-memory-utilization",
        "0.9",
        "--max-seq-len",
        "16000",
        "--vllm-max-num-seqs",
        "1024",
        "--cluster-file",
        str(h100_profile),
    )
    note = [line for line in out.stdout.splitlines() if "rests on the vLLM version" in line]
    assert len(note) == 1 and "assumed 0.19.1" in note[0] and "0.10.1.1 4.40" in note[0]


def test_no_version_note_where_the_versions_agree_or_the_version_is_given(h100_profile):
    # Llama-3.1-8B at TP 2 and 0.95 (a 64 GiB pool): the versions differ by a few percent at most.
    quiet = plan_memory(
        "--model",
        "llama-3.1-8b",
        "--vllm-tp",
        "2",
        "--vllm-gpu-memory-utilization",
        "0.95",
        "--cluster-file",
        str(h100_profile),
    )
    given = plan_memory(
        "--model",
        "qwen3-32b",
        "--vllm-tp",
        "1",
        "--vllm-gpu-memory-utilization",
        "0.9",
        "--max-seq-len",
        "16000",
        "--vllm-max-num-seqs",
        "1024",
        "--vllm-version",
        "0.19.1",
        "--cluster-file",
        str(h100_profile),
    )
    assert [("rests on the vLLM version" in p.stdout, p.returncode) for p in (quiet, given)] == [(False, 0), (False, 0)]


@pytest.mark.parametrize(
    "config, key, value, field, want",
    [
        # verl passes rollout.max_num_seqs / enforce_eager to vLLM (vllm_async_server.py:272-278 at b178a3cd)
        ("verl-grpo-qwen2.5-7b", "actor_rollout_ref.rollout.max_num_seqs", "1024", "max_num_seqs", 1024),
        ("verl-grpo-qwen2.5-7b", "actor_rollout_ref.rollout.enforce_eager", "true", "cuda_graphs_gib", 0.0),
        # open-instruct passes vllm_enforce_eager (vllm_utils.py:1277 at e6c3044a), OpenRLHF vllm.enforce_eager
        # (vllm_engine.py:268 at 3c3be623): no CUDA graphs, so no graph pool.
        ("grpo-olmo3-7b", "vllm_enforce_eager", "true", "cuda_graphs_gib", 0.0),
        ("openrlhf-grpo-qwen2.5-7b", "vllm.enforce_eager", "true", "cuda_graphs_gib", 0.0),
    ],
)
def test_a_configs_own_vllm_keys_reach_the_engine(config, key, value, field, want):
    out = plan_memory("--config", config, "--set", f"{key}={value}", "--json")
    assert json.loads(out.stdout)["engine"][field] == want


def test_plan_sizes_engines_with_the_configs_max_num_seqs():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcrl",
            "plan",
            "--config",
            "verl-grpo-qwen2.5-7b",
            "--nodes",
            "2",
            "--set",
            "actor_rollout_ref.rollout.max_num_seqs=1024",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert json.loads(out.stdout)["layouts"][0]["engine_vllm"]["max_num_seqs"] == 1024


QWEN25_7B = EngineSetup(
    model=resolve_model("Qwen/Qwen2.5-7B"), gpu_total_bytes=79.18 * GIB, max_num_batched_tokens=2048, max_num_seqs=1024
)
LLAMA_8B = replace(QWEN25_7B, model=resolve_model("meta-llama/Llama-3.1-8B"))


@pytest.mark.parametrize(
    "engine, want",
    [
        # 0.24.0, Qwen2.5-7B (Qwen2ForCausalLM: not a default-V2 architecture, config/vllm.py:68-77), raw_logprobs:
        # the FlashInfer pass (14 B) then the native pass, the peak: 1024 rows x 152,064 x (2 bf16 logits + 4 fp32
        # copy + 4 probs + 4 noise) = 2,179,989,504 B + the Triton buffer 132 x 152,064 x 4 = 80,289,792 B
        # (topk_topp_triton.py:906-915) + hidden states 2 x 3584 x (2048 + 2 x 1024) = 29,360,128 B
        # (gpu_model_runner.py:6058,6299-6306) + 34,603,008 B of cuBLAS workspaces.
        (replace(QWEN25_7B, vllm_version="0.24.0"), 2_179_989_504 + 80_289_792 + 29_360_128 + 34_603_008),
        # The same under processed_logprobs: one native pass that also keeps the fp32 log-softmax
        # (topk_topp_sampler.py:140-141): 18 B per logit = 2,802,843,648 B.
        (
            replace(QWEN25_7B, vllm_version="0.24.0", logprobs_mode="processed_logprobs"),
            2_802_843_648 + 80_289_792 + 29_360_128 + 34_603_008,
        ),
        # 0.24.0, Llama-3.1-8B (LlamaForCausalLM: the V2 runner): no top-k/top-p or logprobs in its dummy batch
        # (sample/states.py:30-34, 94-101), so the bf16 logits and their fp32 copy (sample/sampler.py:157):
        # 1024 x 128,256 x 6 = 788,004,864 B + hidden states 2 x 4096 x (2048 + 1024) = 25,165,824 B
        # (gpu/model_runner.py:629-661), above the forward's 226,492,416 B.
        (replace(LLAMA_8B, vllm_version="0.24.0"), 788_004_864 + 25_165_824 + 34_603_008),
        # Llama-3.1-8B at 0.24.0 with processed_logits: V2 refuses that mode (config/vllm.py:2074-2080), so the V1
        # runner's single native pass: 1024 x 128,256 x 14 + 132 x 128,256 x 4 + 2 x 4096 x (2048 + 2048) B.
        (
            replace(LLAMA_8B, vllm_version="0.24.0", logprobs_mode="processed_logits"),
            1_838_678_016 + 67_719_168 + 33_554_432 + 34_603_008,
        ),
        # 0.27.1, Qwen2.5-7B (dense: the V2 runner, config/vllm.py:637-658): nothing asks for processing, so the bf16
        # logits alone (sample/sampler.py:155-156): 1024 x 152,064 x 2 = 311,427,072 B + 2 x 3584 x (2048 + 1024) =
        # 22,020,096 B, above the forward's 276,824,064 B.
        (replace(QWEN25_7B, vllm_version="0.27.1"), 311_427_072 + 22_020_096 + 34_603_008),
        # 0.27.1, Qwen3-30B-A3B (Qwen3MoeForCausalLM: MoE, not listed, so V1): 1024 x 151,936 x 14 + 132 x 151,936
        # x 4 + 2 x 2048 x (2048 + 2048) B, above the forward's 100,663,296 B.
        (
            replace(QWEN25_7B, model=resolve_model("Qwen/Qwen3-30B-A3B"), vllm_version="0.27.1"),
            2_178_154_496 + 80_222_208 + 16_777_216 + 34_603_008,
        ),
        # 0.19.1 under processed_logprobs (open-instruct's, vllm_utils.py:1284 at e6c3044): the fp32 log-softmax
        # beside probs and noise (topk_topp_sampler.py:110-113): Qwen3-32B, 1024 x 151,936 x 18 + 132 x 151,936 x 4
        # + 2 x 5120 x (2048 + 2048) B.
        (
            replace(QWEN3_32B_H100, logprobs_mode="processed_logprobs"),
            2_800_484_352 + 80_222_208 + 41_943_040 + 34_603_008,
        ),
    ],
)
def test_sampler_warm_up_peak_per_runner_and_logprobs_mode_is_the_hand_count_from_its_source(engine, want):
    assert engine_memory(engine).activation_peak == want


@pytest.mark.parametrize(
    "config, overrides, want",
    [
        # OpenRLHF 3c3be623 passes processed_logprobs only with IS correction (cli/train_ppo_ray.py:78,
        # trainer/ray/vllm_engine.py:295-296); otherwise no logprobs_mode, so vLLM's raw_logprobs.
        ("openrlhf-grpo-qwen2.5-7b", [], "raw_logprobs"),
        ("openrlhf-grpo-qwen2.5-7b", ["algo.advantage.is_correction_enable=true"], "processed_logprobs"),
        # verl 1dda039b: rollout.logprobs_mode, processed_logprobs by default (workers/config/rollout.py:197),
        # passed to vLLM (vllm_async_server.py:315).
        ("verl-grpo-qwen2.5-7b", [], "processed_logprobs"),
        ("verl-grpo-qwen2.5-7b", ["actor_rollout_ref.rollout.logprobs_mode=raw_logprobs"], "raw_logprobs"),
    ],
)
def test_a_configs_logprobs_mode_is_what_its_framework_passes_to_vllm(config, overrides, want):
    cfg = load_run_config(config, overrides)
    assert get_backend(cfg.hpcrl.backend).workload_from_config(cfg).vllm.logprobs_mode == want


def test_verls_logprobs_mode_reaches_the_engines_profiling_peak():
    # verl's Qwen2.5-7B at vLLM 0.24.0 (V1 runner), 8192 batched tokens, 1024 sequences, raw_logprobs:
    # 1024 x 152,064 x 14 + 132 x 152,064 x 4 + 2 x 3584 x (8192 + 2048) + 34,603,008 B = 2.206 GiB
    # (processed_logprobs, verl's default, would be 2.786 GiB).
    out = plan_memory(
        "--config",
        "verl-grpo-qwen2.5-7b",
        "--set",
        "actor_rollout_ref.rollout.max_num_seqs=1024",
        "--set",
        "actor_rollout_ref.rollout.logprobs_mode=raw_logprobs",
        "--json",
    )
    assert json.loads(out.stdout)["engine"]["activation_peak_gib"] == 2.206
