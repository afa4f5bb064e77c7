"""The job contract: what the batch script, the in-job runtime and the readers of a run agree on.

Exit codes and end reasons, which reasons continue the job chain, the per-job block of ports,
the GPU request per style and the run directory's layout live here once. The templates get
their tables rendered from this module (`reason_case`, `continue_case`, ...), and the watchdog,
`report`, `status` and the run-dir reader import it. Standard library only: the in-job runtime
imports it on nodes where hpcrl's dependencies may be missing.
"""

from __future__ import annotations

# --------------------------------------------------------------------------- exit codes, end reasons

# The watchdog's circuit breakers: breaker.json reason -> (driver exit code, jobs.tsv end reason).
BREAKERS = {
    "zero_reward": (90, "breaker-zero-reward"),
    "nan_loss": (91, "breaker-nan-loss"),
    "hang": (92, "breaker-hang"),
    "engine_or_node_died": (93, "breaker-dead-worker"),
    "grad_norm_zero": (96, "breaker-grad-norm"),
    "zero_variance": (97, "breaker-zero-variance"),
}
# The batch script's own ends while the driver runs: end reason -> the job's exit code.
RAY_DIED = {"ray-head-died": 94, "worker-died": 95}
# A driver that fails while a step of its own (TRL's server) is ending is that step's end (worker-died) when
# the step ends within this many seconds of the driver: a server that stops answering before it exits fails
# the driver first (tests/test_trl_e2e.py, the stand-in that lingers 4 s). Chosen, not measured: it delays
# the end of a real crash by at most this.
STEP_END_GRACE_S = 10
# A worker node's Ray gets this many seconds after its TERM (a stop) before its session is KILLed: a raylet
# whose head died can hang in its own shutdown (a fresh-clone CI run: the worker step outlived the head's
# 60 s stop budget and was KILLed before its cleanup). Chosen, not measured; Ray normally exits in under 2 s.
RAY_STOP_S = 10
# Seconds the job script waits for an exited driver's status before taking it as lost (bash 5.2 can lose a
# status it reaped while a trap ran, and its `wait` then blocks on Ray's head): reap_driver in driver.sh.j2.
REAP_WAIT_S = 3
# The job's stack check before Ray starts (hpcrl.runtime.stack.STACK_MISMATCH_EXIT): reason, exit code.
STACK_MISMATCH = ("stack-mismatch", 98)
# The stack check could not run (the training Python did not answer its probe: hpcrl.runtime.stack
# STACK_UNCHECKED_EXIT): not an end; the job goes on and records a `stack` event in jobs.tsv whose
# detail starts with this word, which `status` and `report` show.
STACK_UNCHECKED = ("unchecked", 99)
STACK_EVENT = "stack"
# Steps of exactly zero reward that trip the watchdog unless the run config says (hpcrl.zero_reward_steps).
ZERO_REWARD_STEPS = 10
# The run directory's file system failed under the job: full (ENOSPC, a quota) or unusable (EIO,
# read-only). The watchdog exits with these codes; the batch script records them too when its own
# probe of the run directory fails. Neither continues: the next job would meet the same disk.
RUN_DIR_FULL, RUN_DIR_UNWRITABLE = "run-dir-full", "run-dir-unwritable"
RUN_DIR_ENDS = {RUN_DIR_FULL: 88, RUN_DIR_UNWRITABLE: 89}
COMPLETED, CRASHED = "completed", "crashed"
# The driver's exit code -> the end reason; any other code is CRASHED. The watchdog exits with
# worker-died's code when the driver saw a node die and the worker step confirms it.
END_REASONS = {
    0: COMPLETED,
    **{code: reason for code, reason in BREAKERS.values()},
    **{code: reason for reason, code in RUN_DIR_ENDS.items()},
    RAY_DIED["worker-died"]: "worker-died",
}

# Reasons that submit a continuation, with the counter file (in the run's hpcrl/ directory) and
# the setting that bounds it. The time limit and preemption are not the run's fault and cost
# nothing; the failures below are not the run's fault either, are counted apart, exclude the
# blamed nodes and wait a back-off. Crashes, breakers, a stack mismatch and cancels never continue.
LIMIT_REASONS = ("timeout", "preempted")
# A job without Ray (TRL) that cannot start on its nodes (a node Slurm cannot name or address, the head's
# node-local directory) ends START_FAILED where a Ray job ends ray-start-failed: the same continuation.
START_FAILED = "start-failed"
FAILURE_REASONS = ("ray-start-failed", START_FAILED, "ray-head-died", "worker-died", "network-error")
CONTINUATIONS = {
    "limit": (LIMIT_REASONS, "restarts", "hpcrl.max_restarts"),
    "failure": (FAILURE_REASONS, "failure-restarts", "hpcrl.max_failure_restarts"),
}
# The node-local path is another user's or writable by others (the job script's private_dir):
# not the node's fault, so no node is blamed; not continued either, since a new job meets the same
# directory until its owner or an admin removes it (docs/safety.md).
NODE_LOCAL_UNSAFE = "node-local-unsafe"
# Shared nodes (docs/safety.md "Another user on the same nodes"):
# - RUN_DIR_UNSAFE: a level of the run directory's path is another user's or writable by others (who
#   could rename it away and put a link in its place): the job writes nothing there and blames no node.
# - NODE_LOCAL_TAKEN: mktemp found every name it tried taken in a node-local path others may write
#   (EEXIST): someone squats the names; not the node's fault, so no node is blamed.
# - WATCHDOG_HUNG: the watchdog stopped beating (WATCHDOG_BEAT_S) for the hang limit, at least
#   WATCHDOG_QUIET_S: it cannot see a hang any more (blocked on a hung file system, stopped). A hung run
#   is never continued: the next job would hang the same way.
# None of the three continues.
RUN_DIR_UNSAFE, NODE_LOCAL_TAKEN = "run-dir-unsafe", "node-local-taken"
WATCHDOG_HUNG = ("watchdog-hung", 87)
WATCHDOG_BEAT_S, WATCHDOG_QUIET_S = 5, 60
# Random characters in every name a job makes with mktemp in a path others may write (node-local
# directories, Ray's /tmp fallback, the end-record fallback): 62**12 names, which nobody can make all of.
MKTEMP_RANDOM = 12
# Reasons whose exit code is fixed, whatever the driver's own code was when it was stopped.
FIXED_CODES = {**RAY_DIED, WATCHDOG_HUNG[0]: WATCHDOG_HUNG[1]}
# Slurm's job states a job does not leave: `status` stops asking about it, and a later job's sweep
# (templates/leftovers.sh.j2) may clear the node-local directories it left (squeue -o %T prints these).
SLURM_END_STATES = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "PREEMPTED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
# Slurm's terminal state -> end reason, for a job that ended without writing its `end` line.
SLURM_STATE_REASONS = {
    "COMPLETED": COMPLETED,
    "TIMEOUT": "timeout",
    "CANCELLED": "cancelled",
    "PREEMPTED": "preempted",
    "FAILED": CRASHED,
}


def breaker_exit_code(breaker: str) -> int:
    return BREAKERS[breaker][0]


def breaker_end_reason(breaker: str) -> str | None:
    entry = BREAKERS.get(breaker)
    return entry[1] if entry else None


def reason_case(indent: str = "        ") -> str:
    """Bash `case` arms: the driver's exit code ($1) -> its end reason, echoed."""
    arms = [f"{code}) echo {reason} ;;" for code, reason in sorted(END_REASONS.items())]
    return "\n".join(indent + arm for arm in [*arms, f"*) echo {CRASHED} ;;"])


def slurm_end_pattern() -> str:
    """A bash `case` pattern matching every Slurm end state (SLURM_END_STATES)."""
    return " | ".join(sorted(SLURM_END_STATES))


def fixed_code_case(indent: str = "        ") -> str:
    """Bash `case` arms: the end reason ($1) -> its fixed exit code, echoed; any other reason echoes $2."""
    arms = [f"{reason}) echo {code} ;;" for reason, code in sorted(FIXED_CODES.items())]
    return "\n".join(indent + arm for arm in [*arms, '*) echo "$2" ;;'])


def mktemp_suffix() -> str:
    """mktemp's template suffix: MKTEMP_RANDOM random characters."""
    return "X" * MKTEMP_RANDOM


def continue_case(indent: str = "        ") -> str:
    """Bash `case` arms: the reason ($reason) -> kind, counter, limit and setting of its continuation."""
    limits = {"limit": "$MAX_RESTARTS", "failure": "$MAX_FAILURE_RESTARTS"}
    arms = []
    for kind, (reasons, counter, setting) in CONTINUATIONS.items():
        arms.append(
            f"{' | '.join(reasons)}) kind={kind} counter=$HPCRL_DIR/{counter} limit={limits[kind]} setting={setting} ;;"
        )
    return "\n".join(indent + arm for arm in [*arms, "*) return 0 ;;"])


# --------------------------------------------------------------------------- Ray

# The first Ray that honours RAY_AUTH_MODE=token; older ones ignore it silently (DESIGN.md). The job script
# refuses to start an older one, preflight checks it, and pyproject.toml's `ray` extra asks at least this
# (tests/test_job_spec.py holds the three together).
RAY_TOKEN_MIN = (2, 52)


# --------------------------------------------------------------------------- ports

# Ray's ports are drawn per job and node at random from the profile's ray.ports (default RAY_PORTS),
# each kept only when it binds now (python3 -m hpcrl.runtime.free_ports), a taken one drawn again at
# most PORT_DRAWS times: a port known in advance could be bound first by another user on a shared
# node. RAY_PORTS ends below Linux's default ephemeral range (32768-60999), where the kernel puts
# Ray's worker processes (--min/max-worker-port=0).
RAY_PORTS, PORT_DRAWS = (10000, 32767), 20
# Flags of the head's ports (drawn on the head before the workers start; the workers get the GCS
# port from the environment), then each node's own, in the order drawn.
HEAD_PORT_FLAGS = ("port", "dashboard-port", "ray-client-server-port")
NODE_PORT_FLAGS = (
    "node-manager-port",
    "object-manager-port",
    "metrics-export-port",
    "dashboard-agent-grpc-port",
    "dashboard-agent-listen-port",
    "runtime-env-agent-port",
)
# Ray's two Prometheus servers on fixed ports (44217, 44227), on every address and without the token
# (ray/autoscaler/_private/constants.py:106, dashboard/consts.py:67 in Ray 2.60.0, commit b7f4259e): with ray.metrics
# they get drawn ports too, in this order (AUTOSCALER_METRIC_PORT, DASHBOARD_METRIC_PORT).
METRIC_PORT_VARS = ("AUTOSCALER_METRIC_PORT", "DASHBOARD_METRIC_PORT")
# Nodes of one job on one host (a test cluster) draw from disjoint contiguous blocks (the range cut in
# NODE_SLOTS: 18), so the 16-node bring-up on one machine (scripts/dev-slurm) gives every node its own.
NODE_SLOTS = 18

# Services (hpcrl.code_server) and the preflight's collective test use a block of PORT_BLOCK ports
# per job, from the job id. A service on a node listens at +SERVICE_PORT+slot (slots 0..SERVICE_SLOTS-1).
PORT_FIRST, PORT_JOBS, PORT_BLOCK = 10000, 200, 100
SERVICE_PORT, SERVICE_SLOTS = 3, 7
# The preflight's collective test (no Ray runs then): past the services.
COLLECTIVE_PORT = 97


def port_base(job_id: int) -> int:
    """The first port of a job's block."""
    return PORT_FIRST + job_id % PORT_JOBS * PORT_BLOCK


def port_base_shell(job_var: str = "SLURM_JOB_ID") -> str:
    """`port_base` as bash arithmetic on the job id's variable."""
    return f"$(({PORT_FIRST} + {job_var} % {PORT_JOBS} * {PORT_BLOCK}))"


# --------------------------------------------------------------------------- GPU request

# How a site wants GPUs asked for (profile slurm.gpu_request): the sbatch/srun option per style.
GPU_REQUEST_STYLES = ("gpus-per-node", "gpus", "gres")


def gpu_request(style: str, gpus_per_node: int, nodes: int) -> tuple[str, str]:
    """(option name, value) asking gpus_per_node GPUs on each of nodes nodes, in the site's style."""
    if style == "gpus":
        return "gpus", str(gpus_per_node * nodes)
    if style == "gres":
        return "gres", f"gpu:{gpus_per_node}"
    if style == "gpus-per-node":
        return "gpus-per-node", str(gpus_per_node)
    raise ValueError(f"GPU request style {style!r}: one of {', '.join(GPU_REQUEST_STYLES)}")


def gpu_request_option(style: str, gpus_per_node: int, nodes: int) -> str:
    name, value = gpu_request(style, gpus_per_node, nodes)
    return f"--{name}={value}"


# --------------------------------------------------------------------------- run directory

# Sub-directories of a run directory (docs/run-dir.md); hpcrl's own files are in META.
META, LOGS, OUTPUT, CHECKPOINTS = "hpcrl", "logs", "output", "checkpoints"
RUN_SUBDIRS = (META, LOGS, OUTPUT, CHECKPOINTS)
# Files in META.
JOBS_TSV, PLAN, SCRIPT, BREAKER, DRIVER_LOG = "jobs.tsv", "plan.json", "job.sbatch", "breaker.json", "driver.log"
RESTARTS, FAILURE_RESTARTS, CANCEL, EXCLUDED_NODES = "restarts", "failure-restarts", "cancel", "excluded-nodes"
# The watchdog's record of every step's and checkpoint write's time (hpcrl/logs/step_times.py).
STEP_TIMES = "step-times.jsonl"
# The chain that owns the run dir: its newest job's id, written under flock (hpcrl/jobs/chain_lock.py).
CHAIN_LOCK = "chain.lock"
# Per job, in META: the nodes blamed for a failure, and the marker that the driver has started.
BLAME, DRIVER_STARTED = "blame-{job}", "driver-started-{job}"
# Where a job's events go when the run directory cannot take them: JOBS_TSV in a private directory
# <node-local>/EVENTS_FALLBACK.<MKTEMP_RANDOM characters> (mktemp, 0700, kept after the job) on the node that records them,
# and the job's Slurm comment, which `hpcrl status` reads from any login node:
# END_COMMENT + "<reason>:<exit code>".
EVENTS_FALLBACK, END_COMMENT = "hpcrl-ended-{job}", "hpcrl-end:"
# Per job, in LOGS: the job's own log, and Slurm's output when the run dir's path was known at submit.
JOB_LOG, SLURM_LOG = "job-{job}.log", "slurm-{job}.out"
# In each node-local directory of a job: its node and run dir (two lines), for the later job of the
# user that finds it left behind (its job died without its cleanup) and keeps its Ray logs in
# LOGS/ray/<job>/<node>/; there, RAY_LOGS_RECOVERED says that they were kept later: "<job> <UTC time>".
NODE_OWNER, RAY_LOGS_RECOVERED = "hpcrl-owner", "hpcrl-recovered"


def run_dir_layout() -> dict[str, str | tuple[str, ...]]:
    """The names the templates use, as one dict (render passes it as `layout`)."""
    job = "$SLURM_JOB_ID"
    return {
        "meta": META,
        "logs": LOGS,
        "subdirs": RUN_SUBDIRS,
        "jobs_tsv": JOBS_TSV,
        "plan": PLAN,
        "script": SCRIPT,
        "driver_log": DRIVER_LOG,
        "cancel": CANCEL,
        "excluded_nodes": EXCLUDED_NODES,
        "chain_lock": CHAIN_LOCK,
        "failure_restarts": FAILURE_RESTARTS,
        "blame": BLAME.format(job=job),
        "driver_started": DRIVER_STARTED.format(job=job),
        "job_log": JOB_LOG.format(job=job),
        "events_fallback": EVENTS_FALLBACK.format(job=job),
        "end_comment": END_COMMENT,
        "node_owner": NODE_OWNER,
        "ray_logs_recovered": RAY_LOGS_RECOVERED,
    }
