"""Wait until Ray reports every node and GPU: `python3 -m hpcrl.runtime.ray_ready --nodes N --gpus G --timeout S`.

The job script's readiness phase runs this against the job's own cluster (RAY_ADDRESS, with the
job's token in the environment) while it watches the head's and the workers' `ray start`. Exit 0
once N nodes are alive with G GPUs between them; 1 when the timeout passes first, with one line
naming the nodes that did not join (from the job's node table, `--table`), also written one per
line to `--missing-out` so the script can blame them. Standard library and ray (imported only
when it runs: --help needs neither).
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def say(text: str) -> None:
    """One line to standard output in one write (as hpcrl.runtime.job_log.say: a container's python3 runs this
    file from its source without hpcrl, so it imports nothing of hpcrl)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def parse_table(table: str) -> dict[str, str]:
    """The job script's node table ("<name> <ip> <slot>;" per node) as ip -> node name."""
    nodes = {}
    for entry in table.split(";"):
        words = entry.split()
        if len(words) >= 2:
            nodes[words[1]] = words[0]
    return nodes


def short_nodes(by_ip: dict[str, str], alive: list[dict], gpus_per_node: float) -> list[str]:
    """The table's nodes not alive in Ray, or alive with fewer GPUs than each node should have."""
    have = {n.get("NodeManagerAddress"): n.get("Resources", {}).get("GPU", 0) for n in alive}
    return sorted(name for ip, name in by_ip.items() if have.get(ip, -1) < gpus_per_node)


def report_missing(names: list[str], by_ip: dict[str, str], out: str | None, why: str) -> int:
    ips = {name: ip for ip, name in by_ip.items()}
    listed = ", ".join(f"{n} ({ips[n]})" for n in names) or "none named (no node table)"
    say(f"hpcrl: {why}; not joined: {listed}")
    if out:
        with open(out, "w") as fh:
            fh.write("".join(f"{n}\n" for n in names))
    return 1


def wait(want_nodes: int, want_gpus: float, timeout: float, table: str = "", missing_out: str | None = None) -> int:
    deadline = time.monotonic() + timeout
    import ray

    address = os.environ["RAY_ADDRESS"]
    by_ip = parse_table(table)
    while True:
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            break
        except Exception as exc:  # the GCS may not be up yet
            if time.monotonic() > deadline:
                head = [name for ip, name in by_ip.items() if address.rsplit(":", 1)[0] == ip]
                return report_missing(head, by_ip, missing_out, f"cannot connect to Ray's head at {address} ({exc})")
            time.sleep(2)
    last = None
    while True:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        gpus = sum(n.get("Resources", {}).get("GPU", 0) for n in alive)
        if (len(alive), gpus) != last:
            last = (len(alive), gpus)
            say(f"hpcrl: Ray has {len(alive)}/{want_nodes} nodes, {gpus:g}/{want_gpus:g} GPUs")
        if len(alive) >= want_nodes and gpus >= want_gpus:
            return 0
        if time.monotonic() > deadline:
            say(f"hpcrl: Ray nodes after {timeout:g} s: {sorted(n['NodeManagerAddress'] for n in alive)}")
            missing = short_nodes(by_ip, alive, want_gpus / max(want_nodes, 1))
            why = f"Ray has {len(alive)} of {want_nodes} nodes after {timeout:g} s"
            return report_missing(missing, by_ip, missing_out, why)
        time.sleep(2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m hpcrl.runtime.ray_ready", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, required=True, help="alive nodes to wait for")
    p.add_argument("--gpus", type=float, required=True, help="GPUs to wait for, all nodes together")
    p.add_argument("--timeout", type=float, required=True, help="seconds")
    p.add_argument("--table", default="", help="the job's node table, '<name> <ip> <slot>;' per node")
    p.add_argument("--missing-out", help="on a timeout, write the nodes that did not join here, one per line")
    a = p.parse_args(argv)
    if "RAY_ADDRESS" not in os.environ:
        p.error("RAY_ADDRESS is not set (the job script exports the cluster's GCS address)")
    return wait(a.nodes, a.gpus, a.timeout, a.table, a.missing_out)


if __name__ == "__main__":
    sys.exit(main())
