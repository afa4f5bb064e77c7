"""What `submit` sends, prepared and checked before anything is written: from a script hpcrl
builds from a request, or from one it rendered earlier (RUN_DIR, restarts, cluster and umask read
from its lines)."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from hpcrl.errors import ConfigError, HpcrlError
from hpcrl.jobs.run_dir import RunDir
from hpcrl.shell import path_problem

if TYPE_CHECKING:
    from hpcrl.jobs.run_script import RunScript


class Submission(NamedTuple):
    """Everything `submit` needs, prepared (and validated) before anything is written."""

    script: str
    run_dir: RunDir
    name: str
    cluster: str
    config_hash: str
    max_restarts: int | None
    plan: dict | None
    source: str = ""  # the run config or the rendered script it came from
    warnings: tuple[str, ...] = ()
    dir_mode: int | None = None  # the run directory's mode (0700, or 0750 when the group shares runs)
    run_root_shared: bool = False  # the profile's storage.run_root_shared (hpcrl/jobs/path_safety.py)


def expand_path(raw: str, what: str, extra: dict[str, str] | None = None) -> Path:
    """Expand ~ and $VARS as the login node sees them (plus `extra`); an unset variable is a user error."""

    def var(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        return (extra or {}).get(name) or os.environ.get(name) or m.group(0)

    if problem := path_problem(raw):
        raise ConfigError(f"{what} {raw!r}: {problem}")
    path = re.sub(r"\$\{(\w+)\}|\$(\w+)", var, os.path.expanduser(raw))
    if "$" in path:
        missing = ", ".join(sorted(set(re.findall(r"\$\{?(\w+)", path))))
        raise ConfigError(f"{what} {raw!r} uses {missing}, not set here; set hpcrl.run_root or export {missing}")
    return Path(path)


def from_run_script(built: RunScript) -> Submission:
    """A Submission of a script built from a request (jobs/run_script.py: the path render takes too): the
    run directory, cluster, plan and directory mode come from its job description."""
    job = built.job
    # The job's own $SLURM_JOB_ACCOUNT is the account it is submitted under (Berzelius' /proj/<account>).
    known = {"SLURM_JOB_ACCOUNT": job.slurm.account} if job.slurm.account else {}
    root = expand_path(job.run_dir.root, "run_root", known)
    return Submission(
        built.text,
        RunDir(root / job.run_dir.name),
        job.run_dir.name,
        job.header.cluster,
        job.header.config_digest,
        job.chain.max_restarts,
        dict(job.plan),
        built.plan.config.source,
        job.header.warnings,
        _dir_mode(job.environment.umask),
        job.run_dir.shared_root,
    )


def _dir_mode(umask: str | None) -> int | None:
    """A directory mode from the script's umask (077 -> 0700); None leaves the user's umask."""
    return None if umask is None else 0o777 & ~int(umask, 8)


_RUN_DIR_LINE = re.compile(r"^\s*(?:export\s+|readonly\s+|declare\s+(?:-\w+\s+)*)?RUN_DIR=(\S.*)$")
_MAX_RESTARTS_LINE = re.compile(r"^\s*(?:export\s+|readonly\s+)?MAX_RESTARTS=['\"]?(\d+)")
_UMASK_LINE = re.compile(r"^umask\s+(0?[0-7]{3})\s*$")
_SHARED_LINE = re.compile(r"^RUN_ROOT_SHARED=1\s*$")  # as templates/rundir.sh.j2 writes it
# "# cluster isambard-ai; config ..." as hpcrl render writes it, or "# hpcrl-cluster: NAME".
_CLUSTER_LINE = re.compile(r"^#\s*(?:hpcrl[ -]cluster:\s*|cluster\s+)([\w.:-]+)", re.IGNORECASE)


def _shell_word(rhs: str) -> str | None:
    """The first shell word of an assignment's right side, quotes removed ("${X}"'/a' -> ${X}/a)."""
    try:
        words = shlex.split(rhs, comments=True)
    except ValueError:
        return None
    return words[0] if words else None


def from_script(path: str | os.PathLike, *, run_dir: str | None = None, cluster: str | None = None) -> Submission:
    """A Submission from an already rendered script; RUN_DIR is read from it unless given."""
    src = Path(path)
    try:
        text = src.read_text()
    except OSError as exc:
        raise HpcrlError(f"{src}: cannot read the script ({exc.strerror})") from None
    if not text.startswith("#!"):
        raise HpcrlError(f"{src}: not a batch script (no #! line); give a script rendered by hpcrl render")
    lines = text.splitlines()
    found = next((_shell_word(m.group(1)) for ln in lines if (m := _RUN_DIR_LINE.match(ln))), None)
    raw = run_dir or found
    if not raw:
        raise HpcrlError(f"{src}: no RUN_DIR=... line in the script; pass --run-dir DIR")
    rd = RunDir(expand_path(raw, "RUN_DIR"))
    restarts = next((int(m.group(1)) for ln in lines if (m := _MAX_RESTARTS_LINE.match(ln))), None)
    cluster = cluster or next((m.group(1) for ln in lines if (m := _CLUSTER_LINE.match(ln))), None) or "-"
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    umask = next((m.group(1) for ln in lines if (m := _UMASK_LINE.match(ln))), None)
    return Submission(
        text,
        rd,
        rd.path.name,
        cluster,
        digest,
        restarts,
        None,
        str(src.resolve()),
        dir_mode=_dir_mode(umask),
        run_root_shared=any(_SHARED_LINE.match(ln) for ln in lines),
    )
