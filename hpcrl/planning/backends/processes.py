"""A backend's processes when its job is not one driver on a Ray cluster: which nodes run what, as plain
data (pure). hpcrl/planning/describe.py turns them into the job description's steps; the renderer formats
those (one `srun` step per process, on its nodes).

Words may hold placeholders the job fills in:

* `{python}`: the run's Python (hpcrl.python);
* `{node_rank}`: the node's rank among the process's nodes (Slurm's SLURM_NODEID in its step), filled on
  each node;
* `{host:ROLE}`: the address of the first node of the process of that role;
* `{port:NAME}`: a port drawn for this job on the first node of the process that lists NAME in `ports`
  (free there at the draw, from the profile's port range: a port known in advance could be bound first
  by another user of a shared node);
* `$RUN_DIR`: the run directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PLACEHOLDER = re.compile(r"\{(python|node_rank|host:[a-z0-9-]+|port:[a-z0-9-]+)\}")


@dataclass(frozen=True)
class HealthCheck:
    """An HTTP GET that answers 200 once the process is up, on one of its drawn ports."""

    path: str
    port: str  # a name in the process's `ports`
    timeout_s: int
    source: str


@dataclass(frozen=True)
class ResumeRule:
    """What a continuation adds to the process's words: `flag DIR/<newest match of pattern holding
    complete_file>`, nothing when there is none yet."""

    flag: str
    directory: str  # under the run directory
    pattern: str
    complete_file: str
    source: str


@dataclass(frozen=True)
class Process:
    """One process per node on `nodes` (indices into the job's nodes, 0 the first), started in a step of
    its own. The one with `driver` runs under the watchdog (its output is the driver log); the others
    start first, in order, each once the ones it `waits_for` answer their health checks."""

    role: str
    argv: tuple[str, ...]
    nodes: tuple[int, ...]
    gpus_per_node: int
    env: tuple[tuple[str, str], ...] = ()
    ports: tuple[str, ...] = ()  # drawn on the first node before it starts ({port:NAME})
    health: HealthCheck | None = None
    waits_for: tuple[str, ...] = ()
    resume: ResumeRule | None = None
    driver: bool = False


@dataclass(frozen=True)
class RunFile:
    """A file the job writes under the run directory before its processes start (mode 0600)."""

    path: str  # relative to the run directory
    text: str  # `{run_dir}` in it is the run directory's path, filled when the job writes the file


__all__ = ["HealthCheck", "PLACEHOLDER", "Process", "ResumeRule", "RunFile"]
