"""STAND-IN for `accelerate launch ... trl.scripts.grpo` (no GPU, no TRL here): behaves as TRL 1.16.0's trainer
does at its edges, and prints its console lines in the real format.

* Before training it polls GET {vllm_server_host}:{vllm_server_port}/health every 2 s until the server answers or
  vllm_server_timeout (240 s, trl/trainer/grpo_config.py:640) passes (trl/generation/vllm_client.py:267-290); in
  colocate mode it needs no server.
* Each step asks the server for completions (POST /v1/completions): a server that is gone ends the trainer with a
  connection error, as requests does in TRL's client.
* Each logged step prints the metrics dict as transformers' Trainer does (5.17.0 trainer_callback.py:673-690): a
  Python dict whose floats are ".4g" strings, with the keys GRPOTrainer logs (grpo_trainer.py:2296-2830, 3213-3270;
  tests/data/trl/console_*.log are real runs). --zero-reward prints reward 0 (and zero spread).
* Every save_steps it writes {output_dir}/checkpoint-N with trainer_state.json last (transformers trainer.py:3265),
  keeps save_total_limit of them; --resume_from_checkpoint DIR starts after DIR's global_step (trainer.py:1509).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser()
    p.add_argument("--vllm_mode", default="colocate")
    p.add_argument("--vllm_server_host", default="0.0.0.0")
    p.add_argument("--vllm_server_port", type=int, default=8000)
    p.add_argument("--vllm_server_timeout", type=float, default=240.0)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--save_steps", type=int, default=500)
    p.add_argument("--save_total_limit", type=int, default=None)
    p.add_argument("--max_steps", type=int, default=10)
    p.add_argument("--logging_steps", type=int, default=10)
    p.add_argument("--resume_from_checkpoint", default=None)
    p.add_argument("--zero-reward", action="store_true")
    p.add_argument("--step-s", type=float, default=0.05)
    return p.parse_known_args(argv)


def _get(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read() or b"{}")


def wait_for_server(base: str, total: float) -> None:
    start = time.monotonic()
    while True:
        try:
            _get(f"{base}/health")
            return
        except (urllib.error.URLError, OSError):
            if time.monotonic() - start >= total:
                raise ConnectionError(f"vLLM server at {base} did not answer /health within {total} s") from None
            time.sleep(2.0)


def log_line(step: int, zero: bool) -> str:
    reward = 0.0 if zero else 0.25 + 0.5 * ((step * 7) % 5) / 4
    metrics = {"loss": 0.0 if zero else 0.01 * (step % 3 - 1), "grad_norm": 0.0 if zero else 0.5,
               "learning_rate": 1e-06, "num_tokens": 40.0 * step, "completions/mean_length": 256.0,
               "rewards/accuracy_reward/mean": reward, "rewards/accuracy_reward/std": 0.0 if zero else 0.4,
               "reward": reward, "reward_std": 0.0 if zero else 0.4, "frac_reward_zero_std": 1.0 if zero else 0.25,
               "entropy": 0.6, "step_time": 1.5, "epoch": step / 1000}
    return str({k: f"{v:.4g}" for k, v in metrics.items()})


def main(argv: list[str] | None = None) -> int:
    a, _rest = parse(argv)
    out = Path(a.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    start = 0
    if a.resume_from_checkpoint:
        start = int(json.loads((Path(a.resume_from_checkpoint) / "trainer_state.json").read_text())["global_step"])
        print(f"resuming from {a.resume_from_checkpoint} at step {start}", flush=True)
    base = f"http://{a.vllm_server_host}:{a.vllm_server_port}"
    if a.vllm_mode == "server":
        wait_for_server(base, a.vllm_server_timeout)
        print(f"connected to the vLLM server at {base}", flush=True)
    for step in range(start + 1, a.max_steps + 1):
        if a.vllm_mode == "server":
            req = urllib.request.Request(f"{base}/v1/completions", data=json.dumps({"prompt": ["w1"]}).encode(),
                                         headers={"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=10).read()  # a gone server raises here, ending the trainer
        time.sleep(a.step_s)
        if step % a.logging_steps == 0:
            print(log_line(step, a.zero_reward), flush=True)
        if step % a.save_steps == 0:
            ckpt = out / f"checkpoint-{step}"
            (ckpt / f"global_step{step}").mkdir(parents=True, exist_ok=True)
            (ckpt / "model.safetensors").write_bytes(b"\0" * 64)
            (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
            if a.save_total_limit:
                done = sorted((p for p in out.glob("checkpoint-*") if (p / "trainer_state.json").exists()),
                              key=lambda p: int(p.name.split("-")[1]))
                for old in done[:-a.save_total_limit]:
                    shutil.rmtree(old)
    print(str({k: f"{v:.4g}" for k, v in {"train_runtime": 1.0, "train_loss": 0.01, "epoch": 1.0}.items()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
