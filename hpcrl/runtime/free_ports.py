"""Draw free TCP ports for this node's Ray: `python3 -m hpcrl.runtime.free_ports COUNT --slot S`.

Ports from a fixed block per job id could be bound first by anyone who knows the job id, on a
shared node. Each port here is drawn at random from the profile's range and kept only if
binding it (on every address) works now; a taken one is drawn again, at most --tries times per
port, each said on stderr. Nodes of one job that share a host (a
test cluster) pass their slot: each draws from its own contiguous share of the range (one of
--slots equal blocks), so they cannot pick the same port at the same moment, and a pattern of
taken ports (say every even one) leaves free ones in every share. Prints the ports on one line; exit 1 when one cannot be found.
Standard library only.
"""

from __future__ import annotations

import argparse
import random
import socket
import sys


def is_free(port: int) -> bool:
    """Whether a TCP listener could take port on every address now (no one listens or binds there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def draw(count: int, low: int, high: int, slot: int, slots: int, tries: int, rng: random.Random) -> list[int] | None:
    """count distinct free ports from slot's block of [low, high] (the range cut in `slots` equal
    contiguous blocks); None when tries run out for one."""
    block = (high - low + 1) // slots
    pool = list(range(low + slot * block, low + (slot + 1) * block))
    got: list[int] = []
    for _ in range(count):
        for _attempt in range(tries):
            port = rng.choice(pool)
            if port in got:
                continue
            if is_free(port):
                got.append(port)
                break
            print(
                f"hpcrl: port {port} on {socket.gethostname()} is taken (another process has it); drawing another",
                file=sys.stderr,
                flush=True,
            )
        else:
            return None
    return got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m hpcrl.runtime.free_ports", description=__doc__.split("\n\n")[0])
    p.add_argument("count", type=int, help="ports to draw")
    p.add_argument("--range", nargs=2, type=int, required=True, metavar=("LOW", "HIGH"), help="inclusive")
    p.add_argument("--slot", type=int, default=0, help="this node's slot among the job's nodes on its host")
    p.add_argument("--slots", type=int, default=1, help="slots per host")
    p.add_argument("--tries", type=int, default=20, help="draws per port before giving up")
    a = p.parse_args(argv)
    low, high = a.range
    if not 0 <= a.slot < a.slots or not 0 < low <= high <= 65535:
        p.error("need 0 <= --slot < --slots and 0 < LOW <= HIGH <= 65535")
    ports = draw(a.count, low, high, a.slot, a.slots, a.tries, random.SystemRandom())
    if ports is None:
        print(
            f"hpcrl: error: no free port in {low}-{high} after {a.tries} draws (slot {a.slot} of {a.slots})",
            file=sys.stderr,
        )
        return 1
    print(" ".join(map(str, ports)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
