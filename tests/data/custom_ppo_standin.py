"""A stand-in for a user's own PPO script (seed 003's qwen_gsm8k_ppo_train.py) on local-dev: no GPU, no model.

    python custom_ppo_standin.py --steps 5 --output_dir "$RUN_DIR/checkpoints" [--nan-at 3]

Prints one JSON metric line per step with the keys the example config gives the watchdog
(avg_reward, loss, policy_loss, value_loss), writes a checkpoint directory every
$HPCRL_SAVE_STEPS steps and then rewrites checkpoints/latest (the marker the job script
watches after its time-limit warning), and says which GPUs Slurm gave it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--output_dir", type=Path, required=True)
    p.add_argument("--nan-at", type=int, default=0,
                   help="log a NaN value_loss at this step: a loss key only the config names (the watchdog's breaker 91)")
    p.add_argument("--sleep", type=float, default=0.2)
    a = p.parse_args()
    print(f"standin: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')} "
          f"HPCRL_SAVE_STEPS={os.environ.get('HPCRL_SAVE_STEPS')}", flush=True)
    every = max(1, int(os.environ.get("HPCRL_SAVE_STEPS") or 1))
    a.output_dir.mkdir(parents=True, exist_ok=True)
    for step in range(1, a.steps + 1):
        loss = 1.0 / step
        value_loss = float("nan") if step == a.nan_at else loss * 2
        print(json.dumps({"step": step, "avg_reward": 0.5 + step / 100, "loss": loss, "policy_loss": -loss / 2,
                          "value_loss": value_loss}), flush=True)
        if step % every == 0:
            (a.output_dir / f"checkpoint-{step}").mkdir(exist_ok=True)
            (a.output_dir / "latest").write_text(f"{step}\n")
        time.sleep(a.sleep)
    print("standin: done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
