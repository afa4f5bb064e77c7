"""The step and checkpoint-write times a run records (hpcrl/logs/step_times.py), the next job's
interval from them (hpcrl/logs/next_cadence.py, hpcrl/runtime/step_cadence.py) and report's plan
vs real (hpcrl/logs/report_timing.py). Expected values are hand-computed or read off the fixture
logs (tests/data/logs); no test asserts a duration of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from hpcrl.logs.driver_log import StepParser
from hpcrl.logs.log_format import union_format
from hpcrl.logs.next_cadence import chain_before, next_cadence
from hpcrl.logs.report import Event
from hpcrl.logs.report_timing import timing
from hpcrl.logs.step_times import StepClock, lost_at_stop, summarize
from hpcrl.models import resolve_model
from hpcrl.planning.backends import get_backend
from hpcrl.runtime.step_cadence import decide

LOGS = Path(__file__).parent / "data" / "logs"


def _clock(backend: str, job: str = "7") -> StepClock:
    t = get_backend(backend).timing_facts
    return StepClock(
        job,
        step_keys=t.step,
        generation_keys=t.generation,
        training_keys=t.training,
        checkpoint_keys=t.checkpoint,
        checkpoint_line=t.checkpoint_line,
    )


def _steps(lines: list[str]):
    p = StepParser(union_format())
    return [s for s in map(p.feed, lines) if s is not None]


# --------------------------------------------------------------------------- parsing


def test_open_instruct_panel_times_and_wall_clock():
    """grpo_fast_healthy.log's panels say `time  total: 183.20 | training: 61.70`; the watchdog's clock
    between the first two step lines (t=1000.0, t=1190.5) is 190.5 s, none for the job's first."""
    steps = _steps((LOGS / "grpo_fast_healthy.log").read_text().splitlines())[:2]
    clock = _clock("open-instruct")
    recs = clock.step(steps[0], 1000.0) + clock.step(steps[1], 1190.5)
    assert [(r["step"], r["wall_s"], r["step_s"], r["training_s"]) for r in recs] == [
        (1, None, 183.2, 61.7),
        (2, 190.5, 183.2, 61.7),
    ]


def test_open_instruct_checkpoint_timer_line():
    """rl_utils.Timer logs "<description>: <s> seconds" (open-instruct e6c3044a rl_utils.py:180)."""
    clock = _clock("open-instruct")
    clock.step(_steps(['{"training_step": 4, "scores": 0.5}'])[0], 50.0)
    rec = clock.line("2026-11-20 10:01:02 - INFO - [Main Thread] 🗡️ Saving checkpoint state: 12.345 seconds", 63.0)
    assert (rec["step"], rec["write_s"], rec["source"]) == (4, 12.345, "line")


def test_verl_step_line_carries_the_checkpoint_save():
    line = (
        "(TaskRunner pid=7) step:12 - actor/pg_loss:0.25 - timing_s/step:40.5 - timing_s/gen:15.0 - "
        "timing_s/update_actor:20.25 - timing_s/save_checkpoint:7.75"
    )
    recs = _clock("verl").step(_steps([line])[0], 10.0)
    assert [
        (r["kind"], r.get("step_s"), r.get("generation_s"), r.get("training_s"), r.get("write_s")) for r in recs
    ] == [("step", 40.5, 15.0, 20.25, None), ("checkpoint", None, None, None, 7.75)]


def test_marker_rewrite_times_the_write_from_the_step_line():
    """OpenRLHF saves right after its step line: the write is the marker's mtime minus that line's time."""
    clock = _clock("openrlhf")
    assert clock.marker(99.0) is None  # no step line yet: nothing to time it from
    clock.step(_steps(["Global step 3: {'policy_loss': 0.1, 'timing/step_total': 30.0}"])[0], 100.0)
    assert clock.marker(112.5)["write_s"] == 12.5


# --------------------------------------------------------------------------- the arithmetic


def _rec(job, step, t, step_s=None, wall_s=None):
    return {"kind": "step", "job": job, "step": step, "time": t, "step_s": step_s, "wall_s": wall_s}


def test_summary_takes_the_framework_timer_over_the_watchdog_clock():
    recs = [_rec("1", 1, 0, 30.0, None), _rec("1", 2, 0, 50.0, 61.0), _rec("1", 3, 0, 40.0, 45.0)]
    s = summarize(recs)
    assert (s["step_s"], s["step_source"]) == ({"median": 40.0, "min": 30.0, "max": 50.0, "n": 3}, "framework")


def test_summary_falls_back_to_the_watchdog_clock():
    s = summarize([_rec("1", 1, 0, None, None), _rec("1", 2, 0, None, 20.0), _rec("1", 3, 0, None, 24.0)])
    assert (s["step_s"]["median"], s["step_source"]) == (22.0, "watchdog")


def test_lost_work_is_from_the_last_checkpoint_to_the_stop():
    """Steps 1-5 at t=10..50, a write after step 3 done at t=35, the stop at t=70: steps 4 and 5 and 35 s lost."""
    recs = [_rec("9", i, 10.0 * i, 10.0) for i in range(1, 6)]
    recs.insert(3, {"kind": "checkpoint", "job": "9", "step": 3, "time": 35.0, "write_s": 5.0})
    lost = lost_at_stop(recs, "9", 70.0)
    assert (lost["steps_lost"], lost["lost_s"], lost["checkpoint_step"]) == (2, 35.0, 3)


def _plan(every=33, step_s=54.2, pinned=False, max_lost=30.0):
    model = {k: v for k, v in asdict(resolve_model("Qwen/Qwen2.5-0.5B")).items() if k != "sources"}
    return {
        "layout": {"step_time_s": step_s, "generation_time_s": 35.0, "training_time_s": 54.2},
        "cadence": {
            "key": "checkpoint_state_freq",
            "every_steps": every,
            "step_s": step_s,
            "write_s": 3.0,
            "lead_s": 120,
            "pinned": pinned,
            "max_lost_minutes": max_lost,
            "write_gib_s": 2.0,
            "signal_floor_s": 120,
            "lora_rank": 0,
            "model": model,
        },
    }


def test_measured_step_sets_the_next_interval():
    """Median 60 s (of 50, 60, 70) x 1.25 = 75 s; floor(30 min x 60 / 75 s) = 24 steps."""
    recs = [_rec("1", i, 0, s) for i, s in enumerate((50.0, 60.0, 70.0), 1)]
    assert next_cadence(_plan(), recs, ["1"])["every_steps"] == 24


def test_a_pinned_interval_or_too_few_steps_keep_the_plans():
    recs = [_rec("1", i, 0, 60.0) for i in (1, 2, 3)]
    assert next_cadence(_plan(every=5, pinned=True), recs, ["1"])["every_steps"] == 5
    assert next_cadence(_plan(), recs[:2], ["1"])["every_steps"] == 33


def test_only_the_chains_earlier_jobs_count():
    """Job 3 follows 2, which follows 1; job 8 is another run's, with 10 s steps."""
    events = [Event("1", "continue", "t", "2"), Event("2", "continue", "t", "3"), Event("8", "start", "t", "n1")]
    assert chain_before(events, "3") == ["2", "1"]
    recs = [_rec("1", i, 0, 60.0) for i in (1, 2, 3)] + [_rec("8", i, 0, 10.0) for i in (1, 2, 3, 4, 5)]
    assert next_cadence(_plan(), recs, chain_before(events, "3"))["every_steps"] == 24


def test_the_job_script_tool_reads_the_run_dir(tmp_path):
    hp = tmp_path / "hpcrl"
    hp.mkdir()
    (hp / "plan.json").write_text(json.dumps(_plan()))
    (hp / "jobs.tsv").write_text("11\tstart\t2026-01-01T00:00:00Z\tn1\n11\tcontinue\t2026-01-01T01:00:00Z\t12\n")
    (hp / "step-times.jsonl").write_text("".join(json.dumps(_rec("11", i, 0, 60.0)) + "\n" for i in (1, 2, 3)))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcrl.runtime.step_cadence",
            "--run-dir",
            str(tmp_path),
            "--job",
            "12",
            "--planned",
            "33",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (out.returncode, out.stdout) == (0, "24\n"), out.stderr
    assert decide(tmp_path, "11", 33)[0] == 33  # the chain's first job: nothing measured before it


# --------------------------------------------------------------------------- report


def test_report_warns_when_the_real_step_is_outside_the_band(tmp_path):
    (tmp_path / "hpcrl").mkdir()
    (tmp_path / "hpcrl" / "step-times.jsonl").write_text(
        "".join(json.dumps(_rec("1", i, 0, s)) + "\n" for i, s in enumerate((90.0, 100.0, 110.0), 1))
    )
    plan = _plan()
    plan["layout"].update(step_time_low_s=40.0, step_time_high_s=80.0, step_time_basis="derived")
    tm = timing(tmp_path, plan, [{"job_id": "1", "end_reason": "completed"}], {})
    step = tm["rows"][0]
    assert (step["real_s"], step["ratio"], sum("band" in w for w in tm["warnings"])) == (100.0, round(100 / 54.2, 3), 1)
    plan["layout"].update(step_time_high_s=120.0)
    assert not any("band" in w for w in timing(tmp_path, plan, [], {})["warnings"])


def test_report_shows_generation_against_its_planned_band(tmp_path):
    """The driver logged generation 30, 50 and 70 s (median 50): against a plan of 35 s with the band
    22.8-61.2 s it is inside (no warning), ratio 50 / 35 = 1.429; a band of 22.8-45 s warns once."""
    (tmp_path / "hpcrl").mkdir()
    recs = [{**_rec("1", i, 0, 60.0), "generation_s": g} for i, g in enumerate((30.0, 50.0, 70.0), 1)]
    (tmp_path / "hpcrl" / "step-times.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    plan = _plan()
    plan["layout"].update(generation_time_low_s=22.8, generation_time_high_s=61.2, generation_time_basis="vLLM")
    tm = timing(tmp_path, plan, [], {})
    gen = tm["rows"][1]
    assert (gen["what"], gen["real_s"], gen["ratio"], gen["plan_low_s"], gen["plan_high_s"]) == (
        "generation",
        50.0,
        1.429,
        22.8,
        61.2,
    )
    assert not any("real generation" in w for w in tm["warnings"])
    plan["layout"].update(generation_time_high_s=45.0)
    assert sum("real generation" in w for w in timing(tmp_path, plan, [], {})["warnings"]) == 1


def test_a_plan_without_a_band_is_compared_with_its_estimate_and_the_factor(tmp_path):
    (tmp_path / "hpcrl").mkdir()
    (tmp_path / "hpcrl" / "step-times.jsonl").write_text(json.dumps(_rec("1", 1, 0, 60.0)) + "\n")
    step = timing(tmp_path, _plan(step_s=54.0), [], {})["rows"][0]
    assert (step["plan_low_s"], step["plan_high_s"]) == (43.2, 67.5)  # 54 / 1.25, 54 x 1.25


def test_the_watchdog_records_every_step_and_write(tmp_path):
    """The real watchdog over grpo_fast_healthy.log (five panels, `time  total: 183.20`) and a timer line."""
    feed = (
        f"import sys; sys.stdout.write(open({str(LOGS / 'grpo_fast_healthy.log')!r}).read()); "
        "print('[Main Thread] Saving checkpoint state: 4.500 seconds')"
    )
    words = get_backend("open-instruct").timing_facts.words()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcrl.runtime.watchdog",
            "--run-dir",
            str(tmp_path),
            *words,
            "--",
            sys.executable,
            "-c",
            feed,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    recs = [json.loads(ln) for ln in (tmp_path / "hpcrl" / "step-times.jsonl").read_text().splitlines()]
    assert [(r["kind"], r.get("step_s"), r.get("write_s")) for r in recs] == [("step", 183.2, None)] * 5 + [
        ("checkpoint", None, 4.5)
    ]


def test_report_takes_the_interval_the_last_job_ran_with(tmp_path):
    """Plan: 33 steps; the continuation's script set 8. At a 162 s real step: 8 x 162 / 60 = 21.6 min at risk."""
    (tmp_path / "hpcrl").mkdir()
    recs = [_rec("1", i, 0, 162.0) for i in (1, 2, 3)] + [
        {"kind": "interval", "job": "1", "every_steps": 33},
        {"kind": "interval", "job": "2", "every_steps": 8},
    ]
    (tmp_path / "hpcrl" / "step-times.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    i = timing(tmp_path, _plan(), [], {})["interval"]
    assert (i["every_steps"], i["real_at_risk_min"]) == (8, 21.6)


def test_report_warns_when_the_lead_is_shorter_than_a_real_step_and_write(tmp_path):
    """Lead 120 s; real step 54 s + write 10 s + 60 s to stop = 124 s > 120 s. With 50 s steps: 120 s, no warning."""
    (tmp_path / "hpcrl").mkdir()
    path = tmp_path / "hpcrl" / "step-times.jsonl"
    write = {"kind": "checkpoint", "job": "1", "step": 1, "time": 0, "write_s": 10.0}
    path.write_text("".join(json.dumps(r) + "\n" for r in [_rec("1", 1, 0, 54.0), write]))
    assert sum("time-limit warning" in w for w in timing(tmp_path, _plan(), [], {})["warnings"]) == 1
    path.write_text("".join(json.dumps(r) + "\n" for r in [_rec("1", 1, 0, 50.0), write]))
    assert sum("time-limit warning" in w for w in timing(tmp_path, _plan(), [], {})["warnings"]) == 0


def test_a_step_times_file_that_cannot_be_written_is_said_once_then_its_recovery(tmp_path, capsys):
    """A run dir whose hpcrl/ is gone (as after ENOENT or a full disk): three checkpoint lines give
    one complaint on the watchdog's stderr, not three; once the directory is back, one line says
    so and the next record lands in the file."""
    from hpcrl.runtime.watchdog_io.step_recorder import TimeRecorder

    clock = StepClock("7", checkpoint_line=r"Saving checkpoint state: (?P<s>[0-9.]+) seconds")
    path = tmp_path / "gone" / "step-times.jsonl"
    rec = TimeRecorder(clock, path)
    for _ in range(3):
        rec.line("[Main Thread] Saving checkpoint state: 2.500 seconds", None)
    err = capsys.readouterr().err.splitlines()
    assert err == [f"hpcrl-watchdog: cannot record step times in {path}: No such file or directory"]
    path.parent.mkdir()
    rec.line("[Main Thread] Saving checkpoint state: 1.250 seconds", None)
    assert capsys.readouterr().err.splitlines() == [f"hpcrl-watchdog: recording step times in {path} again"]
    assert [json.loads(ln)["write_s"] for ln in path.read_text().splitlines()] == [1.25]
