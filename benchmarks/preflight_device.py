"""Run preflight's in-job checks on a real GPU machine (the device tool's one host), where CI
and local-dev cannot: NVML health through preflight_gpu.gpus(), and preflight_collective.py's
torch paths, with two pretend nodes on one host (127.0.0.1 and 127.0.0.2):

  torch-nccl, 1 GPU per pretend node   (CUDA_VISIBLE_DEVICES=0 and 1; needs 2 GPUs)
  torch-gloo, no GPU visible           (CUDA_VISIBLE_DEVICES="")

Prints one JSON document and writes it to $OUT/preflight-device.json when $OUT is set.
A pretend node is a process, not a host: NCCL goes over NVLink/PCIe of one host here, so
the bandwidths say the torch path works and measures, not what a multi-node fabric gives.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLLECTIVE = ROOT / "hpcrl" / "runtime" / "preflight_collective.py"
sys.path.insert(0, str(ROOT / "hpcrl" / "runtime"))

import preflight_gpu  # noqa: E402  (standard library at import; pynvml inside gpus())


def collective(visible: list[str], port: int, sizes: list[int]) -> list[dict]:
    n = len(visible)
    procs, secret = [], secrets.token_hex(32)
    for r, vis in enumerate(visible):
        args = {
            "node": f"p{r}",
            "node_rank": r,
            "nnodes": n,
            "nodes": [f"p{k}" for k in range(n)],
            "master_addr": "127.0.0.1",
            "my_addr": f"127.0.0.{r + 1}",
            "port": port,
            "timeout_s": 120,
            "iters": 5,
            "gemm_n": 8192,
            "gemm_iters": 20,
            "sizes": {"torch-nccl": sizes, "tcp": [1 << 20, 8 << 20]},
        }
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=vis, HPCRL_COLLECTIVE_SECRET=secret)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(COLLECTIVE), json.dumps(args)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = [p.communicate(timeout=400)[0] for p in procs]
    found = [re.search(r"^HPCRL-COLLECTIVE (.*)$", o, re.M) for o in outs]
    return [
        json.loads(m.group(1)) if m else {"error": "no result line", "output": o[-2000:]} for m, o in zip(found, outs)
    ]


def main() -> None:
    out = {"nvml": preflight_gpu.gpus()}
    out["nccl_2_pretend_nodes"] = collective(["0", "1"], 29400, [8 << 20, 128 << 20, 1 << 30])
    out["gloo_2_pretend_nodes"] = collective(["", ""], 29500, [])
    text = json.dumps(out, indent=1)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "preflight-device.json").write_text(text)


if __name__ == "__main__":
    main()
