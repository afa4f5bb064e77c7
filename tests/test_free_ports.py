"""The port draw (hpcrl.runtime.free_ports) and the readiness check's naming of missing nodes."""

from __future__ import annotations

import socket
import subprocess
import sys

from hpcrl.runtime.ray_ready import parse_table, short_nodes


def test_a_port_someone_listens_on_is_never_handed_out():
    """The only port of the range is held by a listener here (on one address, as Ray binds a
    node's IP): the draw says it is taken and gives up with exit 1 instead of printing it."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "hpcrl.runtime.free_ports", "1", "--range", str(port), str(port), "--tries", "3"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert (out.returncode, out.stdout, out.stderr.count(f"port {port} on ")) == (1, "", 3), out


def test_every_slot_finds_free_ports_when_every_even_port_is_taken():
    """Another user listens on every even port of 30000-30539: each of the 18 slots a shared host's
    nodes draw from (30 ports each: 30000-30029 for slot 0, 30510-30539 for slot 17) still gets its
    9 ports, all odd, inside its own block, and no two slots share one."""
    held = []
    try:
        for port in range(30000, 30540, 2):
            s = socket.socket()
            s.bind(("127.0.0.1", port))
            s.listen()
            held.append(s)
        got = {}
        for slot in (0, 1, 17):
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "hpcrl.runtime.free_ports",
                    "9",
                    "--range",
                    "30000",
                    "30539",
                    "--slot",
                    str(slot),
                    "--slots",
                    "18",
                    "--tries",
                    "60",
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 0, out.stderr[-500:]
            got[slot] = [int(p) for p in out.stdout.split()]
    finally:
        for s in held:
            s.close()
    first = {0: 30000, 1: 30030, 17: 30510}
    for slot, ports in got.items():
        assert len(set(ports)) == 9 and all(p % 2 == 1 and first[slot] <= p < first[slot] + 30 for p in ports), got


def test_the_readiness_check_names_the_nodes_ray_lacks():
    """A 3-node job's table and Ray's node list as ray.nodes() gives it (n2 alive with 2 of its 4
    GPUs, n3 absent): both are named, n1 is not."""
    table = "n1 127.0.0.11 0;n2 127.0.0.12 1;n3 127.0.0.13 2;"
    alive = [
        {"NodeManagerAddress": "127.0.0.11", "Alive": True, "Resources": {"GPU": 4.0, "CPU": 2.0}},
        {"NodeManagerAddress": "127.0.0.12", "Alive": True, "Resources": {"GPU": 2.0, "CPU": 2.0}},
    ]
    assert short_nodes(parse_table(table), alive, 4.0) == ["n2", "n3"]
