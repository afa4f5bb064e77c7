"""The stub run: a rendered script run under bash with stand-ins for Slurm, Ray and the driver.

Used by tests/test_render.py and tests/test_backends.py (tests/test_render_e2e.py runs the
scripts on the real local Slurm instead).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hpcrl.planning.run_plan import make_run_plan
from hpcrl.planning.describe import describe_job
from hpcrl.rendering.render import render_script

# The whole script runs under bash with stand-ins on PATH: scontrol (two or three nodes),
# srun (runs the worker function locally per node), ray (blocks like `ray start --block`),
# python3 (records the driver's argv and environment), sbatch (records the continuation).

STUBS = {
    "scontrol": r"""#!/bin/bash
set -- $*
if [[ $1 == show && $2 == hostnames ]]; then printf '%s\n' $STUB_NODES; exit 0; fi
if [[ $1 == show && $2 == node ]]; then
    i=0; for n in $STUB_NODES; do i=$((i + 1)); echo "NodeName=$n Arch=x86_64 NodeAddr=127.0.0.$i NodeHostName=stubhost OS=Linux 6 x"; done
    exit 0
fi
exit 1
""",
    "srun": r"""#!/bin/bash
[[ -e $STUB_OUT/srun.argv ]] || printf '%s\0' "$@" >"$STUB_OUT/srun.argv"  # the worker step's
printf '%s\0' "$@" >"$STUB_OUT/srun-last.argv"
while [[ $# -gt 0 && $1 != bash ]]; do shift; done
script=$3 pids=()
trap 'kill -USR2 "${pids[@]}" 2>/dev/null' USR2
for n in ${STUB_NODES#* }; do SLURMD_NODENAME=$n bash -c "$script" & pids+=($!); done
rc=0
for p in "${pids[@]}"; do  # a USR2 interrupts wait (status > 128): wait again for the task's own
    while :; do r=0; wait "$p" || r=$?; ((r > 128)) && kill -0 "$p" 2>/dev/null || break; done
    ((r)) && rc=$r
done
exit $rc
""",
    "ray": r"""#!/bin/bash
if [[ $1 == --version ]]; then echo "ray, version ${STUB_RAY_VERSION:-2.60.0}"; exit 0; fi
if [[ -n ${STUB_RAY_WORKER_FAIL:-} && " $* " == *" --address="* ]]; then echo "stub ray: cannot start on $SLURMD_NODENAME"; exit 1; fi
printf '%s\0' "$@" >"$STUB_OUT/ray-${SLURMD_NODENAME}.argv"
if [[ -n ${STUB_RAY_WORKER_DIES_AFTER:-} && " $* " == *" --address="* ]]; then sleep "$STUB_RAY_WORKER_DIES_AFTER"; exit 1; fi
if [[ -n ${STUB_RAY_HEAD_DIES_AFTER:-} && " $* " == *" --head "* ]]; then sleep "$STUB_RAY_HEAD_DIES_AFTER"; exit 1; fi
exec sleep 300
""",
    "python3": r"""#!/bin/bash
case "$1 $2" in
    "-m hpcrl.runtime.watchdog"|"-m hpcrl.runtime.smoke")
        # The handler first: tests signal the job once driver.argv exists (their handshake).
        trap 'echo "stub driver: stopping"; exit 0' TERM
        printf '%s\0' "$@" >"$STUB_OUT/driver.argv"
        env -0 >"$STUB_OUT/driver.env"
        pwd >"$STUB_OUT/driver.cwd"
        [[ $2 == hpcrl.runtime.smoke ]] && { echo "hpcrl-smoke: ok nodes=stub"; exit 0; }
        if [[ -n ${STUB_CKPT_AFTER:-} ]]; then  # a checkpoint completes: DeepSpeed rewrites <dir>/latest
            (sleep "$STUB_CKPT_AFTER"; mkdir -p "$HPCRL_RUN_DIR/checkpoints"; echo global_step7 >"$HPCRL_RUN_DIR/checkpoints/latest") &
        fi
        sleep "${STUB_DRIVER_SLEEP:-0}" & wait $!
        exit "${STUB_DRIVER_EXIT:-0}" ;;
    "-m hpcrl.runtime.classify") exec "$STUB_REAL_PYTHON" "$@" ;;  # the real classifier
    "-m hpcrl.runtime.free_ports") exec "$STUB_REAL_PYTHON" "$@" ;;  # the real draw: it only binds and closes
    "-m hpcrl.runtime.ray_ready"|"- "*)  # the readiness check: ready once every node's `ray start` ran
        [[ $1 == - ]] && cat >/dev/null  # its source, fed to a container's python3
        for _ in $(seq 300); do
            ready=1; for n in $STUB_NODES; do [[ -e $STUB_OUT/ray-$n.argv ]] || ready=""; done
            [[ -n $ready ]] && exit 0
            sleep 0.1
        done
        exit 1 ;;
esac
exit 0
""",
    "python": "#!/bin/bash\nexit 0\n",
    # squeue -o %L: the job's time left (the drain after the time-limit warning reads it); a format
    # with %T: the state of the job the run dir's chain lock names, $STUB_OWNER_STATE (none: that
    # job is neither pending nor running).
    "squeue": r"""#!/bin/bash
fmt="" job=""
while (($#)); do case $1 in -o) fmt=$2; shift ;; -j) job=$2; shift ;; esac; shift; done
if [[ $fmt == *%T* ]]; then
    if [[ -n ${STUB_OWNER_STATE:-} && $fmt == %T ]]; then echo "$STUB_OWNER_STATE"
    elif [[ -n ${STUB_OWNER_STATE:-} ]]; then echo "$job|$STUB_OWNER_STATE|None"; fi
    exit 0
fi
echo "${STUB_TIME_LEFT:-0:05}"
""",
    # sinfo -t down: the job's nodes Slurm counts down ($STUB_DOWN_NODES, one per line; none by
    # default), so no stub run asks the machine's real cluster.
    "sinfo": r"""#!/bin/bash
[[ -n ${STUB_DOWN_NODES:-} ]] && tr ',' '\n' <<<"$STUB_DOWN_NODES"
exit 0
""",
    "sbatch": r"""#!/bin/bash
printf '%s\0' "$@" >"$STUB_OUT/sbatch.argv"
env -0 >"$STUB_OUT/sbatch.env"
echo 4242
""",
    "apptainer": r"""#!/bin/bash
shift
while [[ $1 == -* ]]; do [[ $1 == --bind ]] && shift; shift; done
printf '%s\n' "$1" >>"$STUB_OUT/apptainer.images"
shift
exec "$@"
""",
}

STUB_PROFILE = """\
name: stub
gpu: {{model: H100, count_per_node: 4, memory_gib: 79.1, hbm_bandwidth_tbs: 3.35, bf16_tflops: 989}}
node: {{cpu_cores: 8, ram_gib: 512, arch: x86_64}}
slurm:
  gpu_request: gpus-per-node
  default_partition: debug
  signal_before_end_s: 60
  partitions: {{debug: {{max_nodes: 4, max_time: "01:00:00"}}}}
modules: {modules}
env: {env}
storage:
  node_local: {{path: {tmp}/nl}}
  run_root: {{path: {tmp}/runs}}
  hf_home: {hf_home}
container: {{runtime: apptainer, flags: [--nv]}}
ray: {{num_cpus_per_node: 8, join_timeout_s: 30}}
"""


def yq(value: str) -> str:
    """A YAML double-quoted scalar."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class Stub:
    """A rendered script run under bash with the stand-ins; results read back from files."""

    def __init__(
        self, tmp: Path, *, nodes: int = 2, profile_env: dict | None = None, modules=(), hf_home: str | None = None
    ):
        self.tmp, self.nodes = tmp, nodes
        self.out = tmp / "stub-out"
        self.out.mkdir()
        bindir = tmp / "bin"
        bindir.mkdir()
        for name, body in STUBS.items():
            (bindir / name).write_text(body)
            (bindir / name).chmod(0o755)
        self.bindir = bindir
        env = "{" + ", ".join(f"{k}: {yq(v)}" for k, v in (profile_env or {}).items()) + "}"
        self.profile = tmp / "stub.yaml"
        self.profile.write_text(
            STUB_PROFILE.format(
                tmp=tmp,
                env=env,
                modules="[" + ", ".join(yq(m) for m in modules) + "]",
                hf_home=yq(hf_home or f"{tmp}/hf"),
            )
        )
        self.job = str(10000 + int.from_bytes(os.urandom(2), "big"))

    def render(
        self, config: Path | str = "grpo-olmo3-7b", *, smoke: bool = False, sets=(), workdir: Path | None = None
    ) -> Path:
        workdir = workdir or self.tmp
        # A test's own --set of a key replaces the stub's default (a key given twice is refused).
        given = dict(s.split("=", 1) for s in ("hpcrl.env_setup=[]", f"hpcrl.workdir={yq(str(workdir))}", *sets))
        rp = make_run_plan(
            str(config), nodes=self.nodes, cluster_file=str(self.profile), sets=[f"{k}={v}" for k, v in given.items()]
        )
        path = self.tmp / "job.sh"
        path.write_text(render_script(describe_job(rp, smoke=smoke)))
        real = Path(str(workdir).replace("$HOME", str(self.tmp)))  # HOME is self.tmp in the run
        (real / "open_instruct").mkdir(parents=True, exist_ok=True)
        (real / "open_instruct" / "grpo_fast.py").write_text("")
        return path

    def start(self, script: Path, **env: str) -> subprocess.Popen:
        nodes = " ".join(f"n{i}" for i in range(1, self.nodes + 1))
        e = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RAY_", "HPCRL_"))}
        e.update(
            PATH=f"{self.bindir}:{os.environ['PATH']}",
            STUB_OUT=str(self.out),
            STUB_NODES=nodes,
            SLURM_JOB_ID=self.job,
            SLURM_JOB_NODELIST=f"n[1-{self.nodes}]",
            SLURM_JOB_NUM_NODES=str(self.nodes),
            SLURM_CPUS_ON_NODE="8",
            SLURMD_NODENAME="n1",
            SLURM_SUBMIT_DIR=str(self.tmp),
            HOME=str(self.tmp),
            STUB_REAL_PYTHON=sys.executable,
            **env,
        )
        return subprocess.Popen(
            ["bash", str(script)],
            env=e,
            cwd=self.tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def run(self, script: Path, timeout: float = 60, **env: str) -> tuple[int, str]:
        proc = self.start(script, **env)
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out

    def argv(self, name: str) -> list[str]:
        return (self.out / name).read_bytes().decode().split("\0")[:-1]

    def env(self, name: str) -> dict[str, str]:
        pairs = (self.out / name).read_bytes().decode().split("\0")[:-1]
        return dict(p.split("=", 1) for p in pairs)

    def events(self, run_dir: Path) -> list[list[str]]:
        return [ln.split("\t") for ln in (run_dir / "hpcrl" / "jobs.tsv").read_text().splitlines()]


def wait_for(path: Path, timeout: float = 30) -> None:
    import time

    end = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.1)
