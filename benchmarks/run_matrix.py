"""Run a list of benchmark configurations, each in its own launch, within a time budget.

Matrix file: one configuration per line, `NPROC EST_S EST_GIB [host=GIB] ARGS...`, `#` starts a
comment. ARGS go to the --harness script (zero3_memory.py or fsdp_memory.py); EST_S guesses the launch's wall time, EST_GIB its peak
reserved GPU memory per GPU, host= its host memory (optimizer offload). Example:
    1 45 40 --model qwen2.5-1.5b --seq 4096 --gc 1 --logprob-impl eager

    python benchmarks/run_matrix.py --matrix benchmarks/matrices/h200_1gpu.txt \
        --out $OUT/rows.jsonl --budget-s 540 --gpus 0 --gpu-gib 135 --per-gpu 2

Scheduling: items start in file order. A single-GPU item may share a GPU with others while the
estimates add up to at most --gpu-gib (peaks are per process, so each row's memory numbers
stay its own; only its step times are disturbed, and the row says `shared_gpu_with`). An item
that runs out of memory while sharing is run again alone. Multi-GPU items take every GPU.
An item starts only while its estimate fits in the budget left; one still running when the
budget ends is killed and leaves a row with status "timeout".
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
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


@dataclass
class Item:
    index: int
    nproc: int
    est_s: float
    est_gib: float
    host_gib: float
    argv: list[str]
    solo: bool = False


@dataclass
class Running:
    item: Item
    proc: subprocess.Popen
    gpus: list[str]
    start: float
    rows_path: Path
    log: Path
    tag: str
    shared_with: set = field(default_factory=set)


def parse_matrix(path: Path) -> list[Item]:
    items = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        nproc, est_s, est_gib, *rest = shlex.split(line)
        host = 0.0
        if rest and rest[0].startswith("host="):
            host = float(rest.pop(0)[5:])
        items.append(Item(len(items), int(nproc), float(est_s), float(est_gib), host, rest))
    return items


def arg_value(argv: list[str], flag: str, default: str = "") -> str:
    return argv[argv.index(flag) + 1] if flag in argv else default


def config_row(argv: list[str], nproc: int, harness: str) -> dict:
    """The identifying keys of a row, for launches that wrote none."""
    if harness == "fsdp_memory.py":
        return {
            "harness": "fsdp_memory",
            "model": arg_value(argv, "--model"),
            "seq": int(arg_value(argv, "--seq", "0")),
            "micro_batches": int(arg_value(argv, "--micro-batches", "2")),
            "fsdp": int(arg_value(argv, "--fsdp", "1")),
            "ref": int(arg_value(argv, "--ref", "0")),
            "offload": arg_value(argv, "--offload", "none"),
            "entropy": int(arg_value(argv, "--entropy", "0")),
            "lora_rank": int(arg_value(argv, "--lora-rank", "0")),
            "world": nproc,
            "rank": 0,
        }
    impl = arg_value(argv, "--logprob-impl", "eager")
    return {
        "harness": "zero3_memory",
        "harness_mode": arg_value(argv, "--mode", "open-instruct"),
        "model": arg_value(argv, "--model"),
        "seq": seq if "," in (seq := arg_value(argv, "--seq", "0")) else int(seq),
        "mb": 1,
        "micro_batches": int(arg_value(argv, "--micro-batches", "4")),
        "ref": int(arg_value(argv, "--ref", "0")),
        "gc": int(arg_value(argv, "--gc", "1")),
        "offload": arg_value(argv, "--offload", "none"),
        "world": nproc,
        "rank": 0,
        "logprob_impl": "eager_fp32" if impl == "eager" else "compiled",
        "lora_rank": int(arg_value(argv, "--lora-rank", "0")),
    }


class Scheduler:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.deadline = time.time() + args.budget_s
        self.pending = parse_matrix(Path(args.matrix))
        self.gpus = [g for g in args.gpus.split(",") if g]
        self.running: list[Running] = []
        self.port = 29500 + (os.getpid() % 300) * 10
        self.work = Path(args.work_dir)
        self.work.mkdir(parents=True, exist_ok=True)
        self.out = Path(args.out)
        self.progress = self.out.with_suffix(".progress.log")
        self.failures = self.out.with_suffix(".failures.log")
        self.launches = 0

    def say(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')} left {self.deadline - time.time():5.0f}s] {msg}"
        print(line, flush=True)
        with open(self.progress, "a") as f:
            f.write(line + "\n")

    def on_gpu(self, gpu: str) -> list[Running]:
        return [r for r in self.running if gpu in r.gpus]

    def place(self, item: Item, reserved: set) -> list[str] | None:
        """GPUs for the item now, or None if it must wait."""
        host_used = sum(r.item.host_gib for r in self.running)
        if host_used + item.host_gib > self.args.host_gib and self.running:
            return None
        if item.nproc > 1:
            if reserved or any(r.item.nproc > 1 for r in self.running):
                return None
            for g in self.gpus[: item.nproc]:
                here = self.on_gpu(g)
                if here and not self.args.share_multi:
                    return None
                if any(r.item.solo for r in here) or len(here) >= self.args.per_gpu:
                    return None
                if here and sum(r.item.est_gib for r in here) + item.est_gib > self.args.gpu_gib:
                    return None
            return self.gpus[: item.nproc]
        alone = item.solo or item.est_gib > self.args.gpu_gib
        best = None
        for g in self.gpus:
            if g in reserved:
                continue
            here = self.on_gpu(g)
            multi_here = any(r.item.nproc > 1 for r in here) and not self.args.share_multi
            if here and (alone or multi_here or any(r.item.solo for r in here)):
                continue
            if len(here) >= self.args.per_gpu:
                continue
            used = sum(r.item.est_gib for r in here)
            if here and used + item.est_gib > self.args.gpu_gib:
                continue
            if best is None or used < best[0]:
                best = (used, g)
        return [best[1]] if best else None

    def launch(self, item: Item, gpus: list[str]) -> None:
        self.launches += 1
        self.port += 7
        tag = f"{self.args.tag}:{item.index}" + (":solo" if item.solo else "")
        rows_path = self.work / f"rows_{self.launches:03d}.jsonl"
        log = self.work / f"{self.launches:03d}.log"
        rows_path.unlink(missing_ok=True)  # a file left by an earlier scheduler in the same work dir
        env = dict(os.environ, **SAFE_ENV)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        # torchrun would set 1 thread; offloaded AdamW steps on the CPU need more
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // (self.args.per_gpu * len(self.gpus)))))
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(item.nproc),
            "--master_port", str(self.port), str(HERE / self.args.harness), *item.argv,
            "--out", str(rows_path), "--tag", tag,
        ]  # fmt: skip
        f = open(log, "w")
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        f.close()
        run = Running(item, proc, gpus, time.time(), rows_path, log, tag)
        for other in self.running:
            if set(other.gpus) & set(gpus):
                other.shared_with.add(tag)
                run.shared_with.add(other.tag)
        self.running.append(run)
        self.say(f"start #{item.index} gpus={','.join(gpus)} {'solo ' if item.solo else ''}{' '.join(item.argv)}")

    def finish(self, run: Running, rc) -> None:
        self.running.remove(run)
        wall = time.time() - run.start
        rows = []
        if run.rows_path.exists():
            rows = [json.loads(x) for x in run.rows_path.read_text().splitlines() if x.strip()]
        rows.sort(key=lambda r: r.get("rank", 0))
        with open(self.out.with_suffix(".logs.txt"), "a") as f:
            lines = run.log.read_text(errors="replace").splitlines()
            f.write(f"==== #{run.item.index} rc={rc} {' '.join(run.item.argv)}\n" + "\n".join(lines[-60:]) + "\n")
        # rank 0 writes one row per sequence length; another rank's row only says how a length failed
        out = [r for r in rows if r.get("rank", 0) == 0]
        seen = {r.get("seq") for r in out}
        for r in rows:
            if r.get("rank", 0) != 0 and r.get("status") != "ok" and r.get("seq") not in seen:
                out.append(r)
                seen.add(r.get("seq"))
        if rc != 0 and all(r.get("status") == "ok" for r in out):
            row = config_row(run.item.argv, run.item.nproc, self.args.harness)
            row.update(status="timeout" if rc == "timeout" else "killed", rc=str(rc), wall_s=wall, tag=run.tag)
            out.append(row)
        if rc != 0 or any(r.get("status") != "ok" for r in out):
            tail = run.log.read_text(errors="replace").splitlines()[-30:]
            with open(self.failures, "a") as f:
                f.write(f"==== #{run.item.index} rc={rc} {' '.join(run.item.argv)}\n" + "\n".join(tail) + "\n")
        for row in out:
            row["shared_gpu_with"] = len(run.shared_with)
            row["launch_wall_s"] = wall
        oom = [r for r in out if r.get("status") == "oom"]
        if oom and run.shared_with and not run.item.solo:
            oom[0]["status"] = "oom_while_shared"
            again = Item(run.item.index, run.item.nproc, run.item.est_s, run.item.est_gib, run.item.host_gib,
                         run.item.argv, solo=True)  # fmt: skip
            self.pending.insert(0, again)
        with open(self.out, "a") as f:
            for row in out:
                f.write(json.dumps(row) + "\n")
        self.say(f"end   #{run.item.index} rc={rc} {wall:.0f}s " + " ".join(
            f"{r.get('seq')}:{r.get('status')}:{r.get('peak_alloc_gib') or 0:.1f}" for r in out))  # fmt: skip

    def step(self) -> None:
        left = self.deadline - time.time()
        for item in list(self.pending):
            why = None
            if left < item.est_s * self.args.est_factor + self.args.margin_s:
                why = f"budget (est {item.est_s:.0f}s)"
            elif item.host_gib > self.args.host_gib:
                why = f"host memory (needs ~{item.host_gib:.0f} GiB)"
            elif item.nproc > len(self.gpus):
                why = "too few GPUs"
            if why:
                self.pending.remove(item)
                self.say(f"skip  #{item.index} {why}: {' '.join(item.argv)}")
        reserved: set = set()
        for item in list(self.pending):
            gpus = self.place(item, reserved)
            if gpus is None:
                # keep later items off the GPUs this one waits for, so it is not starved
                if item.nproc > 1:
                    if not self.args.share_multi:
                        reserved.update(self.gpus)
                else:
                    loads = {g: len(self.on_gpu(g)) for g in self.gpus if g not in reserved}
                    if loads:
                        reserved.add(min(loads, key=loads.get))
                continue
            self.pending.remove(item)
            self.launch(item, gpus)
        for run in list(self.running):
            rc = run.proc.poll()
            if rc is None and time.time() > self.deadline - self.args.margin_s / 2:
                os.killpg(run.proc.pid, 9)
                run.proc.wait()
                rc = "timeout"
            if rc is not None:
                self.finish(run, rc)

    def run(self) -> None:
        while self.pending or self.running:
            self.step()
            time.sleep(1.0)
        self.say("matrix done")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--matrix", required=True)
    p.add_argument("--out", required=True, help="jsonl to append rows to")
    p.add_argument("--budget-s", type=float, required=True, help="wall time for the whole list")
    p.add_argument("--gpus", default="0", help="CUDA device ids to use, comma separated")
    p.add_argument("--gpu-gib", type=float, default=70.0, help="memory a shared GPU may be planned to")
    p.add_argument("--per-gpu", type=int, default=1, help="launches that may share one GPU")
    p.add_argument("--host-gib", type=float, default=100.0, help="host memory for offloading items together")
    p.add_argument("--share-multi", action="store_true", help="let single-GPU items run beside a multi-GPU one")
    p.add_argument("--est-factor", type=float, default=1.0)
    p.add_argument("--margin-s", type=float, default=10.0)
    p.add_argument("--work-dir", default="/tmp/zero3_work")
    p.add_argument("--tag", default="")
    p.add_argument("--harness", default="zero3_memory.py", help="script in benchmarks/ each launch runs")
    Scheduler(p.parse_args()).run()


if __name__ == "__main__":
    main()
