"""Wait until Ray reports every node and GPU: `python3 -m hpcrl.runtime.ray_ready --nodes N --gpus G --timeout S`.

The job script's readiness phase runs this against the job's own cluster (RAY_ADDRESS, with the
job's token in the environment) while it watches the head's and the workers' `ray start`. Exit 0
once N nodes are alive with G GPUs between them; 1 when the timeout passes first, with one line
naming what came up. Standard library and ray (imported only when it runs: --help needs neither).
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def wait(want_nodes: int, want_gpus: float, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    import ray

    address = os.environ["RAY_ADDRESS"]
    while True:
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            break
        except Exception as exc:  # the GCS may not be up yet
            if time.monotonic() > deadline:
                print(f"hpcrl: cannot connect to Ray at {address}: {exc}", flush=True)
                return 1
            time.sleep(2)
    last = None
    while True:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        gpus = sum(n.get("Resources", {}).get("GPU", 0) for n in alive)
        if (len(alive), gpus) != last:
            last = (len(alive), gpus)
            print(f"hpcrl: Ray has {len(alive)}/{want_nodes} nodes, {gpus:g}/{want_gpus:g} GPUs", flush=True)
        if len(alive) >= want_nodes and gpus >= want_gpus:
            return 0
        if time.monotonic() > deadline:
            print(f"hpcrl: Ray nodes after {timeout:g} s: {sorted(n['NodeManagerAddress'] for n in alive)}", flush=True)
            return 1
        time.sleep(2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m hpcrl.runtime.ray_ready", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, required=True, help="alive nodes to wait for")
    p.add_argument("--gpus", type=float, required=True, help="GPUs to wait for, all nodes together")
    p.add_argument("--timeout", type=float, required=True, help="seconds")
    a = p.parse_args(argv)
    if "RAY_ADDRESS" not in os.environ:
        p.error("RAY_ADDRESS is not set (the job script exports the cluster's GCS address)")
    return wait(a.nodes, a.gpus, a.timeout)


if __name__ == "__main__":
    sys.exit(main())
