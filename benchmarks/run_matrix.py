"""Run a list of zero3_memory.py configurations, each in its own launch, within a time budget.

Matrix file: one configuration per line, `NPROC EST_S ARGS...` (ARGS go to zero3_memory.py;
EST_S is a guess of the launch's wall time), `#` starts a comment. Example:
    1 45 --model qwen2.5-1.5b --seq 4096 --gc 1 --logprob-impl eager

    python benchmarks/run_matrix.py --matrix benchmarks/matrices/h200_1gpu_a.txt \
        --out $OUT/rows.jsonl --budget-s 540

A configuration starts only while its estimate fits in the budget left; a launch still running
when the budget ends is killed and leaves a row with status "timeout". With --lane-gpus, several
single-GPU configurations run at once, one lane per entry (entries may repeat a GPU: then
processes share that GPU and their rows say so in concurrent_on_gpu).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SAFE_ENV = {
    # NVLink multicast stays off on shared hosts (device KINDS.md)
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "PYTHONUNBUFFERED": "1",
    "TORCH_CUDA_ARCH_LIST": "9.0",
    "DS_BUILD_OPS": "0",
    "TOKENIZERS_PARALLELISM": "false",
}


def parse_matrix(path: Path) -> list[tuple[int, float, list[str]]]:
    items = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        nproc, est, *rest = shlex.split(line)
        items.append((int(nproc), float(est), rest))
    return items


def arg_value(argv: list[str], flag: str, default: str = "") -> str:
    return argv[argv.index(flag) + 1] if flag in argv else default


def config_row(argv: list[str], nproc: int) -> dict:
    """The identifying keys of a row, for rows the harness itself could not write."""
    impl = arg_value(argv, "--logprob-impl", "eager")
    return {
        "model": arg_value(argv, "--model"),
        "seq": int(arg_value(argv, "--seq", "0")),
        "mb": 1,
        "gc": int(arg_value(argv, "--gc", "1")),
        "offload": arg_value(argv, "--offload", "none"),
        "world": nproc,
        "rank": 0,
        "logprob_impl": "eager_fp32" if impl == "eager" else "compiled",
        "lora_rank": int(arg_value(argv, "--lora-rank", "0")),
    }


class Runner:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.deadline = time.time() + args.budget_s
        self.items = parse_matrix(Path(args.matrix))
        self.next = 0
        self.lock = threading.Lock()
        self.port = 29500 + (os.getpid() % 500) * 10
        self.logs = Path(args.log_dir)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.progress = Path(args.out).with_suffix(".progress.log")

    def say(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')} left {self.deadline - time.time():5.0f}s] {msg}"
        with self.lock:
            print(line, flush=True)
            with open(self.progress, "a") as f:
                f.write(line + "\n")

    def take(self) -> tuple[int, int, tuple[int, float, list[str]]] | None:
        with self.lock:
            if self.next >= len(self.items):
                return None
            i = self.next
            self.next += 1
            self.port += 7
            return i, self.port, self.items[i]

    def lane(self, gpu: str | None, lanes_on_gpu: int) -> None:
        while (job := self.take()) is not None:
            i, port, (nproc, est, argv) = job
            left = self.deadline - time.time()
            if left < est * self.args.est_factor + self.args.margin_s:
                self.say(f"skip #{i} (est {est:.0f}s): {' '.join(argv)}")
                continue
            self.run_one(i, port, nproc, argv, gpu, lanes_on_gpu, timeout=left - self.args.margin_s / 2)

    def run_one(
        self, i: int, port: int, nproc: int, argv: list[str], gpu: str | None, lanes_on_gpu: int, timeout: float
    ) -> None:
        env = dict(os.environ, **SAFE_ENV)
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        env["ZERO3_CONCURRENT_ON_GPU"] = str(lanes_on_gpu)
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // max(1, self.args.lanes * nproc))))
        tag = f"{self.args.tag}:{i}"
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_port", str(port), str(HERE / "zero3_memory.py"), *argv,
            "--out", self.args.out, "--tag", tag,
        ]  # fmt: skip
        log = self.logs / f"{i:03d}.log"
        self.say(f"start #{i} gpu={gpu} nproc={nproc}: {' '.join(argv)}")
        t0 = time.time()
        with open(log, "w") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            try:
                rc = proc.wait(timeout=max(1.0, timeout))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
                rc = "timeout"
        wall = time.time() - t0
        wrote = has_row(self.args.out, tag)
        if not wrote or rc not in (0,):
            tail = log.read_text(errors="replace").splitlines()[-40:]
            with self.lock, open(Path(self.args.out).with_suffix(".failures.log"), "a") as f:
                f.write(f"==== #{i} rc={rc} {' '.join(argv)}\n" + "\n".join(tail) + "\n")
        if not wrote:
            row = config_row(argv, nproc)
            row.update(status="timeout" if rc == "timeout" else "killed", rc=str(rc), wall_s=wall, tag=tag)
            with self.lock, open(self.args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
        self.say(f"end   #{i} rc={rc} {wall:.0f}s wrote_row={wrote}")


def has_row(path: str, tag: str) -> bool:
    try:
        with open(path) as f:
            return any(json.loads(line).get("tag") == tag for line in f if line.strip())
    except FileNotFoundError:
        return False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--matrix", required=True)
    p.add_argument("--out", required=True, help="jsonl to append rows to")
    p.add_argument("--budget-s", type=float, required=True, help="wall time for the whole list")
    p.add_argument("--lane-gpus", default="", help="comma list, one CUDA_VISIBLE_DEVICES per lane; empty = one lane")
    p.add_argument("--est-factor", type=float, default=1.0)
    p.add_argument("--margin-s", type=float, default=10.0)
    p.add_argument("--log-dir", default="/tmp/zero3_logs")
    p.add_argument("--tag", default="")
    args = p.parse_args()
    gpus = [g for g in args.lane_gpus.split(",") if g] or [None]
    args.lanes = len(gpus)
    runner = Runner(args)
    if args.lanes > 1 and any(n > 1 for n, _, _ in runner.items):
        sys.exit("lanes run single-GPU configurations only")
    threads = [
        threading.Thread(target=runner.lane, args=(g, gpus.count(g) if g is not None else 1)) for g in gpus
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    runner.say("matrix done")


if __name__ == "__main__":
    main()
