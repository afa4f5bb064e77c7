"""The Slurm client: parsers on real output, and every command against the real local Slurm."""

from __future__ import annotations

import time

import pytest

from hpcrl.errors import SlurmError
from hpcrl.jobs import slurm as sl


def _wait(predicate, what: str, deadline_s: float = 180):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"gave up waiting for {what}")


def _script(tmp_path, body: str, *extra: str) -> str:
    path = tmp_path / "job.sh"
    lines = [
        "#!/bin/bash",
        "#SBATCH --job-name=hpcrl-test-slurm",
        f"#SBATCH --output={tmp_path}/out-%j.log",
        *extra,
        body,
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


# --------------------------------------------------------------------------- parsers (no cluster)


def test_parse_squeue_as_printed_by_slurm_22():
    text = "2|CANCELLED|None\n1|COMPLETED|None\n4|PENDING|BeginTime\n3|RUNNING|None\n"
    got = sl.parse_squeue(text)
    assert got["4"] == sl.JobState("4", "PENDING", "BeginTime", None, "squeue")
    assert got["2"].terminal and not got["3"].terminal and got["1"].reason == ""


def test_parse_sacct_normalises_states():
    got = sl.parse_sacct("17|CANCELLED by 0|None|0:15\n18|TIMEOUT|None|0:0\n19|FAILED|NonZeroExitCode|3:0\n")
    assert got["17"].state == "CANCELLED" and got["17"].exit_code == 0
    assert got["19"] == sl.JobState("19", "FAILED", "NonZeroExitCode", 3, "sacct")


def test_parse_scontrol_one_line():
    line = (
        "JobId=1 JobName=t.sh UserId=root(0) JobState=COMPLETED Reason=None Dependency=(null) "
        "Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=2:0 RunTime=00:00:01"
    )
    assert sl.parse_scontrol(line) == sl.JobState("1", "COMPLETED", "", 2, "scontrol")
    assert sl.parse_scontrol("slurm_load_jobs error: Invalid job id specified") is None


def test_state_sets_are_disjoint():
    assert not sl.PENDING_STATES & sl.RUNNING_STATES
    assert not sl.LIVE_STATES & sl.TERMINAL_STATES
    assert sl.UNKNOWN not in sl.LIVE_STATES


def test_message_keeps_slurms_words():
    res = sl.SlurmResult(
        1,
        "",
        "sbatch: error: invalid partition specified: nope\n"
        "sbatch: error: Batch job submission failed: Invalid partition name specified\n",
    )
    assert sl.slurm_message(res, "sbatch") == (
        "sbatch: error: invalid partition specified: nope; "
        "Batch job submission failed: Invalid partition name specified"
    )


def test_missing_binary_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SlurmError) as err:
        sl.submit("whatever.sh")
    assert str(err.value) == (
        "hpcrl needs a Slurm login node (sbatch not found on PATH) — or the local dev cluster: scripts/dev-slurm up"
    )


# --------------------------------------------------------------------------- the real local Slurm


def test_accounting_is_detected_off(slurm):
    sl.accounting_enabled.cache_clear()
    assert sl.accounting_enabled() is False


def test_submit_states_and_finished_job(slurm, tmp_path):
    s = sl
    job = s.submit(_script(tmp_path, "echo hello from $SLURM_JOB_ID"))
    assert job.isdigit()
    first = s.job_states([job])[job]
    assert first.source == "squeue" and first.state in s.LIVE_STATES | {"COMPLETED"}
    done = _wait(lambda: (st := s.job_states([job])[job]).terminal and st, f"job {job} to finish")
    # accounting is off: squeue -t all still lists the finished job (MinJobAge)
    assert done.state == "COMPLETED" and done.source == "squeue"
    assert (tmp_path / f"out-{job}.log").read_text().strip() == f"hello from {job}"


def test_batched_query_mixes_live_finished_and_unknown(slurm, tmp_path):
    s = sl
    quick = s.submit(_script(tmp_path, "true"))
    slow = s.submit(_script(tmp_path, "sleep 300", "#SBATCH --time=00:05:00"))
    try:
        _wait(lambda: s.job_states([quick])[quick].terminal, "the quick job to end")
        got = s.job_states([quick, slow, "99999999"])
        assert list(got) == [quick, slow, "99999999"]
        assert got[quick].state == "COMPLETED"
        assert got[slow].state in s.LIVE_STATES
        assert got["99999999"].state == s.UNKNOWN and got["99999999"].terminal
    finally:
        s.cancel(slow)
    assert _wait(lambda: (st := s.job_states([slow])[slow]).terminal and st, "the cancel").state == "CANCELLED"
    s.cancel(slow)  # cancelling an ended job is not an error


def test_sbatch_rejection_is_slurms_message(slurm, tmp_path):
    s = sl
    with pytest.raises(SlurmError) as err:
        s.submit(_script(tmp_path, "true", "#SBATCH --partition=no-such-partition"))
    assert "invalid partition" in str(err.value).lower() and str(err.value).startswith("sbatch: error: ")


def _time_left_function() -> str:
    """The rendered script's time_left_s (templates/rundir.sh.j2), cut out of a real render."""
    from hpcrl.planning.run_plan import make_run_plan
    from hpcrl.planning.describe import describe_job
    from hpcrl.rendering.render import render_script

    text = render_script(describe_job(make_run_plan("grpo-olmo3-7b", nodes=3, cluster="local-dev")))
    start = text.index("time_left_s() {")
    return text[start : text.index("\n}\n", start) + 3]


def test_time_left_reads_the_real_squeue(slurm, tmp_path):
    """The drain's time_left_s parses what the real `squeue -o %L` prints (M:SS under an hour; the
    partitions here allow no more); a fallback to SIGNAL_LEAD_S (-1 here) would show."""
    limit, most = "00:05:00", 300
    body = (
        f'SIGNAL_LEAD_S=-1\n{_time_left_function()}\necho "raw=$(squeue -h -j "$SLURM_JOB_ID" -o %L) s=$(time_left_s)"'
    )
    job = sl.submit(_script(tmp_path, body, f"#SBATCH --time={limit}", "#SBATCH --partition=debug"))
    _wait(lambda: sl.job_states([job])[job].terminal, f"job {job} to finish")
    out = (tmp_path / f"out-{job}.log").read_text()
    raw, seconds = out.split()[0][len("raw=") :], int(out.split()[1][len("s=") :])
    assert raw.count(":") == 1, out
    assert most - 120 < seconds <= most, out  # Slurm counts from the job's start; it ran at once
