"""The step band and what decides by it: cadence, signal lead, ranking (expected values by hand)."""

from types import SimpleNamespace

from hpcrl.models.catalog import resolve_model
from hpcrl.planning.cadence import GIB, plan_cadence
from hpcrl.planning.layout_rank import rank
from hpcrl.planning.run_plan import make_run_plan


def test_cadence_rests_on_the_upper_step():
    """mid 100 s, high 250 s, 30 min: floor(1800 / 250) = 7 steps (not 18 from the mid)."""
    cad = plan_cadence(100.0, 30, resolve_model("qwen2.5-7b"), 2.0, 300, step_high_s=250.0)
    assert cad.every_steps == 7


def test_signal_lead_is_upper_step_plus_write_plus_stop():
    """qwen2.5-0.5b: write = 12 B x P / (1 GiB/s); lead = ceil((400 + write + 60) / 60) x 60, above a 300 s floor."""
    m = resolve_model("qwen2.5-0.5b")
    write = 12.0 * m.total_params / GIB
    expected = -(-(400 + write + 60) // 60) * 60
    cad = plan_cadence(100.0, 30, m, 1.0, 300, step_high_s=400.0)
    assert cad.lead_s == expected


def _lay(step, idle, learners=1):
    return SimpleNamespace(step_time_s=step, idle_gpus=idle, learners_per_node=learners, learner_headroom=0.3, tp=1)


def test_a_faster_step_outranks_fewer_idle_gpus():
    """Issue 26: a ~304 s layout with no idle GPU ranked above a ~182 s one with idle GPUs."""
    slow, fast = _lay(304, 0), _lay(182, 15)
    assert rank([slow, fast])[0] is fast


def test_idle_gpus_break_a_near_tie():
    a, b = _lay(200, 8), _lay(210, 0)  # within 10%
    assert rank([a, b])[0] is b


def test_seed_003_step_is_within_25_percent_or_says_why_not():
    """Seed 003: the users measured 26.6 s per step (5,000 steps in 36.9 h) for the custom PPO QLoRA
    config on one Berzelius fat A100; the plan either lands within 25% or its basis says why not."""
    rp = make_run_plan("configs/custom-ppo-qwen2.5-3b-qlora.yaml", cluster="berzelius:fat", nodes=1, gpus=1)
    step = rp.layouts[0].step
    assert abs(step.mid_s / 26.6 - 1) <= 0.25 or "not checked against a measured" in step.basis


def test_micro_batches_per_learner_gpu():
    """256 sequences of 10240 tokens over 16 learners packing 10240 tokens each: 16 micro-batches;
    one more sequence needs a 17th on some GPU."""
    from hpcrl.planning.step_time import micro_batches

    assert (micro_batches(256 * 10240, 16, 10240), micro_batches(257 * 10240, 16, 10240)) == (16, 17)


def test_colocated_step_adds_generation_and_training_bands():
    """generation 100 s (band 81-200 s), training 50 s (band 40-80 s): colocated high = 200 + 80."""
    from hpcrl.planning.step_time import Band, combine

    step = combine(Band(81, 100, 200, "g"), Band(40, 50, 80, "t"), colocated=True)
    assert (step.low_s, step.mid_s, step.high_s) == (121, 150, 280)


def test_on_part_of_a_node_a_layout_using_every_gpu_comes_first():
    """--gpus N: each idle GPU is one another job could have had, so a slower layout without idle
    GPUs ranks above a faster one with; on whole nodes the faster one wins."""
    fast_idle, slow_full = _lay(100, 1), _lay(150, 0)
    assert (rank([fast_idle, slow_full], exclusive=False)[0], rank([fast_idle, slow_full])[0]) == (slow_full, fast_idle)


def test_generation_constants_are_what_the_committed_fit_gives():
    """hpcrl/planning/generation.py carries benchmarks/vllm_throughput/fit.py's output on the committed rows
    (constants and the held-out band): the script's --check exits 0."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[1]
    out = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "vllm_throughput" / "fit.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": ""},
    )
    assert out.returncode == 0, out.stdout + out.stderr
