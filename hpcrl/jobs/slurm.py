"""The Slurm client: every Slurm command hpcrl runs goes through `_run`.

Output is parsed into NamedTuples; states are frozen sets. The client asks slurmctld as
little as it can: one batched query for any number of jobs, and accounting detection
once per process.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from hpcrl.contract import SLURM_END_STATES
from hpcrl.errors import SlurmError

NO_SLURM = "hpcrl needs a Slurm login node ({cmd} not found on PATH) — or the local dev cluster: scripts/dev-slurm up"

PENDING_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"})
TERMINAL_STATES = SLURM_END_STATES
# Not a Slurm state: the job is no longer known to slurmctld (past MinJobAge) and there is
# no accounting to ask. Treated as terminal so it is never queried again.
UNKNOWN = "UNKNOWN"
LIVE_STATES = PENDING_STATES | RUNNING_STATES


class JobState(NamedTuple):
    job_id: str
    state: str  # a Slurm state name (first word: "CANCELLED by 0" -> CANCELLED) or UNKNOWN
    reason: str  # Slurm's pending/exit reason, "" when none
    exit_code: int | None  # the batch script's exit code where Slurm reports it
    source: str  # which command answered: sacct | squeue | scontrol | none

    @property
    def terminal(self) -> bool:
        return self.state not in LIVE_STATES


class SlurmResult(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def require(name: str = "sbatch") -> None:
    """Raise the one-line "no Slurm here" error unless `name` is on PATH."""
    if shutil.which(name) is None:
        raise SlurmError(NO_SLURM.format(cmd=name))


def _run(cmd: Sequence[str], *, check: bool = True, timeout: float = 60) -> SlurmResult:
    """Run one Slurm command; missing binary or (with check) a non-zero exit is a SlurmError."""
    require(cmd[0])
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{cmd[0]} did not answer within {timeout:.0f} s (slurmctld busy or down?)") from None
    res = SlurmResult(proc.returncode, proc.stdout, proc.stderr)
    if check and res.returncode != 0:
        raise SlurmError(slurm_message(res, cmd[0]))
    return res


def slurm_message(res: SlurmResult, name: str) -> str:
    """Slurm's own error message on one line (its stderr, else stdout)."""
    text = res.stderr.strip() or res.stdout.strip() or f"exit status {res.returncode}"
    prefix = f"{name}: error: "
    lines = [ln.strip().removeprefix(prefix).removeprefix(f"{name}: ") for ln in text.splitlines() if ln.strip()]
    return prefix + "; ".join(lines)


# --------------------------------------------------------------------------- submit / cancel


def submit(script_path: str, extra_args: Iterable[str] = ()) -> str:
    """`sbatch --parsable [extra_args] script`; returns the job id or raises with Slurm's message."""
    res = _run(["sbatch", "--parsable", *extra_args, str(script_path)])
    out = res.stdout.strip().splitlines()
    # --parsable prints "jobid" or "jobid;cluster"; the last line is the id (warnings precede).
    job_id = out[-1].split(";")[0].strip() if out else ""
    if not job_id.isdigit():
        raise SlurmError(f"sbatch: unexpected output {res.stdout.strip()!r} (expected a job id)")
    return job_id


def with_excluded(extra: list[str], nodes: list[str]) -> list[str]:
    """sbatch arguments with `nodes` added to their --exclude (or a new one)."""
    out, given = [], []
    for arg in extra:
        if arg.startswith("--exclude="):
            given += arg.partition("=")[2].split(",")
        else:
            out.append(arg)
    return [*out, "--exclude=" + ",".join(dict.fromkeys(n for n in given + nodes if n))]


def cancel(job_id: str, signal: str | None = None) -> None:
    """`scancel [--signal=SIG] job`; a job that already ended is not an error."""
    cmd = ["scancel"] + ([f"--signal={signal}"] if signal else []) + [str(job_id)]
    res = _run(cmd, check=False)
    if res.returncode != 0 and "already completed" not in res.stderr and "Invalid job id" not in res.stderr:
        raise SlurmError(slurm_message(res, "scancel"))


# --------------------------------------------------------------------------- states


@functools.lru_cache(maxsize=1)
def accounting_enabled() -> bool:
    """Whether sacct has data (asked once per process: scontrol's AccountingStorageType)."""
    res = _run(["scontrol", "show", "config"], check=False)
    for line in res.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "AccountingStorageType":
            return value.strip() not in ("accounting_storage/none", "")
    return False


def _state_word(raw: str) -> str:
    # sacct writes "CANCELLED by 1234"; squeue/scontrol may add a "+" for requeued states.
    return (raw.strip().split() or [UNKNOWN])[0].rstrip("+").upper()


def _exit(raw: str) -> int | None:
    code = raw.strip().split(":")[0]
    return int(code) if code.isdigit() else None


def _parse_rows(text: str, source: str) -> dict[str, JobState]:
    # "id|state|reason[|exit code]" lines, as sacct -P and squeue -o '%i|%T|%r' print them.
    out: dict[str, JobState] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) < 3 or not parts[0]:
            continue
        jid, state, reason = parts[:3]
        code = _exit(parts[3]) if len(parts) > 3 else None
        out[jid] = JobState(jid, _state_word(state), "" if reason == "None" else reason, code, source)
    return out


def parse_sacct(text: str) -> dict[str, JobState]:
    """`sacct -X -P -n --format=JobID,State,Reason,ExitCode` lines -> states."""
    return _parse_rows(text, "sacct")


def parse_squeue(text: str) -> dict[str, JobState]:
    """`squeue -h -o '%i|%T|%r'` lines -> states (squeue reports no exit code)."""
    return _parse_rows(text, "squeue")


def parse_scontrol(text: str) -> JobState | None:
    """`scontrol -o show job ID` (one line of Key=Value pairs) -> a state."""
    fields: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    if "JobId" not in fields:
        return None
    reason = fields.get("Reason", "")
    return JobState(
        fields["JobId"],
        _state_word(fields.get("JobState", UNKNOWN)),
        "" if reason == "None" else reason,
        _exit(fields.get("ExitCode", "")),
        "scontrol",
    )


def job_states(job_ids: Iterable[str]) -> dict[str, JobState]:
    """States of many jobs with one batched query.

    With accounting: one `sacct`. Without: one `squeue -t all`, which also lists finished
    jobs slurmctld still holds (MinJobAge, 300 s by default); only ids it does not list are
    asked of `scontrol`, one by one — callers stop asking about jobs once they are terminal,
    so that happens at most once per job. An id nobody knows comes back as UNKNOWN.
    """
    ids = list(dict.fromkeys(str(j) for j in job_ids))
    if not ids:
        return {}
    joined = ",".join(ids)
    found: dict[str, JobState] = {}
    if accounting_enabled():
        res = _run(["sacct", "-X", "-P", "-n", "-j", joined, "--format=JobID,State,Reason,ExitCode"], check=False)
        if res.returncode == 0:
            found = parse_sacct(res.stdout)
    missing = [j for j in ids if j not in found]
    if missing:
        res = _run(["squeue", "-h", "-t", "all", "-j", ",".join(missing), "-o", "%i|%T|%r"], check=False)
        if res.returncode != 0 and "Invalid job id" not in res.stderr:
            raise SlurmError(slurm_message(res, "squeue"))
        found.update({k: v for k, v in parse_squeue(res.stdout).items() if k in missing})
    for jid in ids:
        if jid in found:
            continue
        res = _run(["scontrol", "-o", "show", "job", jid], check=False)
        state = parse_scontrol(res.stdout) if res.returncode == 0 else None
        found[jid] = state or JobState(jid, UNKNOWN, "no longer known to Slurm", None, "none")
    return {j: found[j] for j in ids}


class JobView(NamedTuple):
    """A job as `hpcrl watch` shows it: its state, and while it runs its nodes and time left."""

    job_id: str
    state: str
    reason: str
    time_left_s: float | None  # None: not running, or no limit
    time_limit_s: float | None
    node_count: int | None
    nodes: str  # Slurm's node list as it prints it ("c2n[1-2]"), "" before the job has nodes
    comment: str

    @property
    def terminal(self) -> bool:
        return self.state not in LIVE_STATES


def slurm_seconds(text: str) -> float | None:
    """squeue's %L/%l ([days-]hours:minutes:seconds, minutes:seconds) in seconds; None for UNLIMITED and the like."""
    days, _, clock = text.strip().rpartition("-")
    parts = clock.split(":")
    if not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3 or (days and not days.isdigit()):
        return None
    secs = 0
    for p in parts:
        secs = secs * 60 + int(p)
    if len(parts) == 1:  # a bare number is minutes
        secs *= 60
    return float(secs + int(days or 0) * 86400)


def parse_views(text: str) -> dict[str, JobView]:
    """`squeue -h -o '%i|%T|%r|%L|%l|%D|%N|%k'` lines -> views (the comment last: it may hold '|')."""
    out: dict[str, JobView] = {}
    for line in text.splitlines():
        parts = line.strip().split("|", 7)
        if len(parts) < 8 or not parts[0]:
            continue
        jid, state, reason, left, limit, count, nodes, comment = (p.strip() for p in parts)
        comment = "" if comment in ("(null)", "N/A") else comment
        out[jid] = JobView(
            jid,
            _state_word(state),
            "" if reason == "None" else reason,
            slurm_seconds(left),
            slurm_seconds(limit),
            int(count) if count.isdigit() else None,
            "" if nodes in ("(null)", "None assigned") else nodes,
            comment,
        )
    return out


def job_views(job_ids: Iterable[str]) -> dict[str, JobView]:
    """Views of many jobs with one `squeue -t all` (its time left, nodes and comment); a job squeue no longer
    lists is asked as job_states asks (sacct, else scontrol), without the time left."""
    ids = list(dict.fromkeys(str(j) for j in job_ids))
    if not ids:
        return {}
    res = _run(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T|%r|%L|%l|%D|%N|%k"], check=False)
    if res.returncode != 0 and "Invalid job id" not in res.stderr:
        raise SlurmError(slurm_message(res, "squeue"))
    found = {k: v for k, v in parse_views(res.stdout).items() if k in ids}
    if missing := [j for j in ids if j not in found]:
        for jid, st in job_states(missing).items():
            found[jid] = JobView(jid, st.state, st.reason, None, None, None, "", "")
    return {j: found[j] for j in ids}


def job_comment(job_id: str) -> str:
    """The job's Slurm comment ("" when none, or Slurm no longer knows the job)."""
    res = _run(["squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%k"], check=False)
    comment = res.stdout.strip() if res.returncode == 0 else ""
    return "" if comment in ("(null)", "N/A") else comment


def job_nodes(job_id: str) -> list[str]:
    """The hostnames of a job's nodes in Slurm's order (with one task per node, task i runs on
    the i-th: Slurm's default block distribution). Empty when Slurm no longer knows the job."""
    res = _run(["scontrol", "-o", "show", "job", str(job_id)], check=False)
    nodelist = ""
    for token in res.stdout.split() if res.returncode == 0 else []:
        if token.startswith("NodeList="):
            nodelist = token.partition("=")[2]
            break
    if (not nodelist or nodelist == "(null)") and accounting_enabled():
        res = _run(["sacct", "-X", "-P", "-n", "-j", str(job_id), "--format=NodeList"], check=False)
        nodelist = res.stdout.strip().splitlines()[0] if res.returncode == 0 and res.stdout.strip() else ""
    if not nodelist or nodelist in ("(null)", "None assigned"):
        return []
    res = _run(["scontrol", "show", "hostnames", nodelist], check=False)
    return res.stdout.split() if res.returncode == 0 else []


__all__ = [
    "JobState",
    "JobView",
    "LIVE_STATES",
    "PENDING_STATES",
    "RUNNING_STATES",
    "TERMINAL_STATES",
    "UNKNOWN",
    "accounting_enabled",
    "cancel",
    "job_comment",
    "job_nodes",
    "job_states",
    "job_views",
    "require",
    "submit",
    "with_excluded",
]
