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
        out = subprocess.run([sys.executable, "-m", "hpcrl.runtime.free_ports", "1", "--range", str(port), str(port),
                              "--tries", "3"], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout, out.stderr.count(f"port {port} on ")) == (1, "", 3), out


def test_the_readiness_check_names_the_nodes_ray_lacks():
    """A 3-node job's table and Ray's node list as ray.nodes() gives it (n2 alive with 2 of its 4
    GPUs, n3 absent): both are named, n1 is not."""
    table = "n1 127.0.0.11 0;n2 127.0.0.12 1;n3 127.0.0.13 2;"
    alive = [{"NodeManagerAddress": "127.0.0.11", "Alive": True, "Resources": {"GPU": 4.0, "CPU": 2.0}},
             {"NodeManagerAddress": "127.0.0.12", "Alive": True, "Resources": {"GPU": 2.0, "CPU": 2.0}}]
    assert short_nodes(parse_table(table), alive, 4.0) == ["n2", "n3"]
