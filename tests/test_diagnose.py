"""`hpcrl diagnose` on error texts: two verbatim from the users' notes (seed004_*, seed001_*),
the rest synthetic, shaped after the real messages (tests/data/logs/README.md says which).

Fixes are checked against the memory planner directly: a suggested pack_length or GPU count
must fit by the planner and the next smaller change must not.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from hpcrl.diagnose import Context, diagnose
from hpcrl.driver_log import parse_steps
from hpcrl.memory.learner import LearnerSetup, learner_memory
from hpcrl.models import resolve_model
from hpcrl.profiles import load_profile

LOGS = Path(__file__).parent / "data" / "logs"
GIB = 1024**3


def run(name: str, cluster: str = "isambard-ai", **given):
    ctx = Context(load_profile(cluster), dict(given))
    return diagnose((LOGS / name).read_text(), ctx)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcrl", "diagnose", *args], capture_output=True, text=True,
                          timeout=120, env={"COLUMNS": "250", "NO_COLOR": "1", "PATH": "/usr/bin:/bin"})


def test_seed_oom_numbers_are_read_from_the_message():
    d = run("seed004_cuda_oom.log")  # verbatim from seed 004
    f = d.findings[0]
    assert f.kind == "cuda_oom"
    assert f.details["tried_gib"] == 17.66 and f.details["capacity_gib"] == 79.18
    assert f.details["free_gib"] == 4.97 and f.details["allocated_by_pytorch_gib"] == 100.77
    # 100.77 GiB allocated on a 79.18 GiB GPU cannot be literal: said so, not hidden.
    assert "more allocated than the GPU holds" in f.details["note"]
    assert any("default" in a for a in d.assumptions)  # no model in three lines: defaults are stated


def _planner_limit_and_scale(model: str, n: int, tokens: int, capacity_gib: float, demand_gib: float):
    base = LearnerSetup(model=resolve_model(model), n_gpus=n, tokens_per_gpu=tokens, zero_stage=3,
                        grad_accum_dtype="fp32")
    scale = max(1.0, demand_gib * GIB / learner_memory(base).peak_allocated)
    return base, capacity_gib * GIB * (1 - 0.03), scale


def test_learner_oom_fix_is_the_largest_pack_length_and_fewest_gpus_that_fit():
    d = run("learner_cuda_oom.log")
    f = d.findings[0]
    assert f.kind == "cuda_oom"
    assert "allenai/Olmo-3-1125-32B (from the log)" in " ".join(d.assumptions)
    # The log: OLMo 3 32B, 8 learners, pack_length 16384, a 94.50 GiB GPU, 84.61 + 9.54 GiB demanded.
    base, limit, scale = _planner_limit_and_scale("olmo3-32b", 8, 16384, 94.50, 84.61 + 9.54)

    def peak(s):
        return learner_memory(s).device_total * scale

    assert peak(base) > limit
    fixes = f.fix.split("; or ")
    t = int(fixes[0].split("-> ")[1].split()[0])
    assert t % 256 == 0 and t < 16384
    assert peak(replace(base, tokens_per_gpu=t)) <= limit < peak(replace(base, tokens_per_gpu=t + 256))
    n = int(fixes[1].split("-> ")[1].split()[0])
    assert peak(replace(base, n_gpus=n)) <= limit < peak(replace(base, n_gpus=n - 1))
    assert fixes[2].startswith("deepspeed_offload_optimizer")


def test_given_values_override_the_log():
    d = run("learner_cuda_oom.log", model="7b", learner_gpus=16, tokens_per_gpu=4096)
    assert "model_name_or_path" not in " ".join(d.assumptions)
    f = d.findings[0]
    # The given sizes are used (16 GPUs, 4096 tokens), and every option offered is re-planned:
    # which options fit depends on how far the log's numbers sit from the planner's.
    assert "learner GPUs 16 -> " in f.fix or "pack_length 4096 -> " in f.fix
    # The log's 94 GiB is far more than the planner gives 7B on 16 GPUs at 4k tokens: flagged.
    assert f.details["scale_from_log"] > 1.5 and "far off" in f.cause


def test_vllm_init_oom_is_told_apart_from_a_learner_oom():
    f = run("vllm_init_oom.log", cluster="berzelius:fat").findings[0]
    assert f.kind == "vllm_cuda_oom"
    assert f.fix.startswith("vllm_tensor_parallel_size 1 -> ")


def test_kv_cache_error_uses_vllms_own_numbers():
    f = run("vllm_kv_cache.log", cluster="berzelius:fat").findings[0]
    assert f.kind == "vllm_kv_cache"
    assert f.details["needed_gib"] == 4.0 and f.details["available_gib"] == 2.53 and f.details["max_seq_len"] == 32768
    assert "max_model_len <= 20,720" in f.fix
    # Shifted onto vLLM's 2.53 GiB, the planner's KV tokens at TP=2 are vLLM's estimate within 1%.
    assert abs(f.details["kv_tokens_now"] - 20720) / 20720 < 0.01
    assert "vllm_tensor_parallel_size 2 -> 4" in f.fix


def test_no_cache_blocks_and_gpu_busy():
    f = run("vllm_no_cache_blocks.log", cluster="berzelius:fat").findings[0]
    assert f.kind == "vllm_no_kv_memory" and "vllm_tensor_parallel_size 2 ->" in f.fix
    f = run("vllm_gpu_busy.log").findings[0]
    assert f.kind == "vllm_gpu_busy"
    # 14.73 GiB free of 94.50, keeping 1 GiB spare: floor(13.73 / 94.50, 2 places) = 0.14.
    assert "vllm_gpu_memory_utilization <= 0.14" in f.fix


@pytest.mark.parametrize("name, kind, text", [
    ("seed001_nccl_duplicate_gpu.log", "nccl_duplicate_gpu", "learners + vLLM engines x TP <= 4"),  # verbatim seed 001
    ("nccl_ofi_not_found.log", "nccl_ofi_plugin_missing", "load brics/nccl"),
    ("cxi_vni_not_found.log", "nccl_libfabric_error", "srun"),
    ("nccl_timeout.log", "nccl_timeout", "first error before this line"),
])
def test_nccl_failures(name, kind, text):
    f = run(name).findings[0]
    assert f.kind == kind and text in f.fix
    assert f.evidence


def test_nccl_details_in_the_cause():
    assert "return code 5" in run("cxi_vni_not_found.log").findings[0].cause
    cause = run("nccl_timeout.log").findings[0].cause
    assert "_ALLGATHER_BASE" in cause and "10.0 min" in cause


def test_placement_group_failures():
    f = run("ray_placement_group.log").findings[0]
    assert f.kind == "ray_missing_gpus" and f.details == {"needed": 16.0, "seen": 8.0}
    assert f.fix.startswith("4 nodes of 4 GPUs")  # 16 GPUs / 4 per Isambard-AI node
    assert run("ray_pg_infeasible.log").findings[0].kind == "ray_placement_group"


def test_disk_full_gives_checkpoint_sizes():
    f = run("disk_full.log").findings[0]
    assert f.kind == "disk_full"
    assert "/proj/berzelius-2025-1/users/x_user/hpcrl-runs/r1/checkpoint_state" in f.cause
    # OLMo 3 32B (from the log): 12 B x 32,233,522,176 params = 360 GiB per ZeRO-3 state checkpoint.
    assert f.details["state_gib"] == pytest.approx(12 * 32_233_522_176 / GIB, abs=0.5)
    assert "hpcrl checkpoints prune" in f.fix


def test_host_ram_oom():
    f = run("ray_host_oom.log", cluster="berzelius").findings[0]
    assert f.kind == "host_ram_oom" and "95%" in f.cause


@pytest.mark.parametrize("name, first, key", [
    ("grpo_fast_zero_reward.log", 4, "scores"),
    ("grpo_legacy_zero_reward.log", 3, "objective/scores"),
    ("plain_dict_zero_reward.log", 3, "scores"),
])
def test_zero_reward_from_the_steps(name, first, key):
    f = run(name).findings[0]
    assert f.kind == "zero_reward" and f.details["first_step"] == first and key in f.cause


def test_zero_reward_notes_truncated_responses():
    assert "stop_rate 0" in run("grpo_fast_zero_reward.log").findings[0].cause


def test_nan_and_deaths():
    assert run("grpo_fast_nan_loss.log").findings[0].kind == "nan_loss"
    assert run("vllm_engine_dead.log").findings[0].kind == "vllm_engine_dead"
    assert run("ray_node_dead.log").findings[0].kind == "ray_node_dead"


def test_healthy_and_unknown_logs_have_no_finding():
    assert run("grpo_fast_healthy.log").findings == []
    d = run("unknown.log")
    assert d.findings == [] and d.last_lines[-1].startswith("slurmstepd: error")


def test_step_parser_reads_wrapped_panels():
    steps = parse_steps((LOGS / "grpo_fast_zero_reward.log").read_text().splitlines())
    assert [s.number for s in steps] == list(range(1, 16))
    s3 = steps[2]
    assert s3.text["scores"] == "0.00" and not s3.reward_is_exactly_zero()  # 0.004 printed as .2f
    assert steps[3].text["scores"] == "0.00e+00" and steps[3].reward_is_exactly_zero()
    assert steps[0].values["epoch"] == 0.0 and steps[0].values["val/stop_rate"] == 0.62  # split over two lines
    assert steps[4].values["learner_tokens_per_second_step"] == 3012.9  # panel with a foreign line inside


# ---------------------------------------------------------------------------- the command


def test_cli_prints_cause_and_fix():
    proc = cli(str(LOGS / "learner_cuda_oom.log"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Cause: cuda_oom") and "fix: pack_length 16384 -> " in proc.stdout


def test_cli_json():
    proc = cli(str(LOGS / "vllm_kv_cache.log"), "--json", "--cluster", "berzelius:fat")
    data = json.loads(proc.stdout)
    assert data["found"] is True and data["findings"][0]["kind"] == "vllm_kv_cache"
    assert set(data["findings"][0]) == {"kind", "cause", "fix", "evidence", "details"}


def test_cli_unknown_log_prints_last_lines_and_exits_2():
    proc = cli(str(LOGS / "unknown.log"))
    assert proc.returncode == 2
    assert proc.stdout.startswith("no known failure found") and "CANCELLED AT" in proc.stdout


def test_cli_missing_log_is_one_line():
    proc = cli("/no/such/log.txt")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["hpcrl: error: /no/such/log.txt: no such log file or run directory"]


def test_cli_run_dir_reads_driver_log_and_breaker(tmp_path):
    hp = tmp_path / "hpcrl"
    hp.mkdir()
    (hp / "driver.log").write_text((LOGS / "grpo_fast_healthy.log").read_text())
    (hp / "breaker.json").write_text(json.dumps({"reason": "hang", "exit_code": 92, "message": "no training step "
                                                 "completed for 61.0 min after step 5", "details": {}}))
    proc = cli(str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [f["kind"] for f in data["findings"]] == ["hang"]
    assert "61.0 min" in data["findings"][0]["cause"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli(str(empty)).returncode == 2


def test_cli_run_dir_without_watchdog_reads_the_newest_job_log(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "job-101.log").write_text((LOGS / "unknown.log").read_text())
    time.sleep(0.05)
    (tmp_path / "logs" / "job-102.log").write_text((LOGS / "nccl_timeout.log").read_text())
    data = json.loads(cli(str(tmp_path), "--json").stdout)
    assert data["log"].endswith("job-102.log") and data["findings"][0]["kind"] == "nccl_timeout"


def test_run_directory_diagnosis_reads_the_ray_logs_the_job_kept(tmp_path):
    """The driver's log says only that an actor died; the raylet.out the job kept in
    logs/ray/<job>/<node>/ says why (Ray's memory monitor): diagnose on the run dir finds it."""
    run = tmp_path / "run"
    (run / "hpcrl").mkdir(parents=True)
    (run / "hpcrl" / "driver.log").write_text("step 12 ...\nray.exceptions.ActorDiedError: The actor died unexpectedly\n")
    kept = run / "logs" / "ray" / "4711" / "n3"
    kept.mkdir(parents=True)
    (kept / "raylet.out").write_text((LOGS / "ray_host_oom.log").read_text())
    out = cli(str(run), "--json")
    assert out.returncode == 0, out.stderr
    kinds = [f["kind"] for f in json.loads(out.stdout)["findings"]]
    assert "host_oom" in kinds or any("oom" in k for k in kinds), kinds
    only_driver = cli(str(run / "hpcrl" / "driver.log"), "--json")
    assert not any("oom" in f["kind"] for f in json.loads(only_driver.stdout)["findings"])
