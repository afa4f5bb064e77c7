"""The collective's links prove a per-job secret: a connection from another process on the node
(another user, on a shared node) is refused and counted, never read as a node; a node whose
first node answers without the secret sends it nothing. Real processes of the collective script
on 127.0.0.x and real sockets as the intruder (no Slurm needed)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

from hpcrl.jobs.preflight_fabric import collective_summary
from helpers import collective_result, free_port, start_collective


def _wait_listening(addr: str, port: int) -> None:
    for _ in range(200):
        try:
            socket.create_connection((addr, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens at {addr}:{port}")


def _line(sock: socket.socket) -> dict:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return json.loads(data) if data else {}


def _until_closed(sock: socket.socket) -> None:
    """Handshake: read until the other end closes the connection (the first node refused it)."""
    sock.settimeout(60)
    while sock.recv(4096):
        pass


def test_intruders_on_the_rendezvous_port_are_refused_and_counted():
    port = free_port()
    first = start_collective(0, 3, port, 60)
    _wait_listening("127.0.0.11", port)  # this probe connection itself is refused too (it says nothing)
    # An intruder that answers the challenge with a made-up MAC, one that sends garbage, and one
    # that claims to be node 1 without answering the challenge at all.
    wrong = socket.create_connection(("127.0.0.11", port))
    challenge = _line(wrong)["challenge"]
    wrong.sendall((json.dumps({"nonce": "f" * 32, "mac": "0" * 64}) + "\n").encode())
    assert _line(wrong) == {}, "the first node answered a connection that did not prove the secret"
    garbage = socket.create_connection(("127.0.0.11", port))
    garbage.sendall(b"\x00\xff not json\n")
    posing = socket.create_connection(("127.0.0.11", port))
    posing.sendall(
        (
            json.dumps(
                {
                    "node_rank": 1,
                    "node": "n2",
                    "addr": "127.0.0.12",
                    "ring_port": 1,
                    "torch": None,
                    "gpus": 0,
                    "why": None,
                }
            )
            + "\n"
        ).encode()
    )
    for s in (garbage, posing):  # refused before the real nodes join: the first node stops accepting then
        _until_closed(s)
    others = [start_collective(r, 3, port, 60) for r in (1, 2)]
    res = collective_result(first)
    assert [collective_result(p)["error"] for p in others] == [None, None]
    assert challenge and res["error"] is None and res["verified"] is True
    assert res["nodes"] == ["n1", "n2", "n3"]
    counts = {r["node"]: r["connections"] for r in res["rejected"]}
    assert counts.get("n1", 0) >= 4, res["rejected"]  # the readiness probe, wrong MAC, garbage, the poser
    rows = [
        c for c in collective_summary(res, ["n1", "n2", "n3"])["checks"] if c["check"] == "unauthenticated connections"
    ]
    assert rows and rows[0]["status"] == "warn" and "at n1" in rows[0]["detail"]
    for s in (wrong, garbage, posing):
        s.close()


def test_a_node_refuses_a_first_node_without_the_secret_and_sends_it_nothing():
    """Another process holds the rendezvous port and plays the first node: it sends a challenge
    and answers with a MAC it cannot make. The joining node stops, naming it, before its hello."""
    port = free_port()
    srv = socket.create_server(("127.0.0.11", port))
    seen: list[bytes] = []

    def impostor():
        conn, _ = srv.accept()
        conn.sendall((json.dumps({"challenge": "a" * 32}) + "\n").encode())
        got = _line(conn)
        seen.append(json.dumps(got).encode())
        conn.sendall((json.dumps({"mac": "0" * 64}) + "\n").encode())
        conn.settimeout(3)
        try:
            while chunk := conn.recv(4096):
                seen.append(chunk)
        except OSError:
            pass
        conn.close()

    t = threading.Thread(target=impostor)
    t.start()
    res = collective_result(start_collective(1, 2, port, 20))
    t.join()
    srv.close()
    assert "without the job's secret" in res["error"]
    assert b"node_rank" not in b"".join(seen), "the node sent its hello to an impostor"
    assert set(json.loads(seen[0])) == {"nonce", "mac"}


def test_no_secret_no_collective():
    res = collective_result(start_collective(0, 2, free_port(), 5, secret=""))
    assert "HPCRL_COLLECTIVE_SECRET is not set" in res["error"]


def test_nodes_with_different_secrets_do_not_pair():
    port = free_port()
    first = start_collective(0, 2, port, 4)
    other = start_collective(1, 2, port, 4, secret="another-secret-of-another-job")
    res, res2 = collective_result(first), collective_result(other)
    assert res["missing"] == ["n2"] and res["rejected"][0]["node"] == "n1"
    assert "without the job's secret" in res2["error"] or "closed" in res2["error"]


def _ring_port(addr: str, pid: int) -> int:
    """The port pretend node `addr` listens on for its ring link (kernel-chosen): the listening socket on
    that address in /proc/net/tcp that process `pid` holds (other than the rendezvous port, which is
    node 0's). Other processes may listen on the same address: the dev cluster's nodes are 127.0.0.1x too,
    and a concurrent test's Ray listens there."""
    hexaddr = "".join(f"{int(x):02X}" for x in reversed(addr.split(".")))
    for _ in range(200):
        mine = set()
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                mine.add(target[8:-1])
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and local.startswith(hexaddr + ":") and inode in mine:
                return int(local.split(":")[1], 16)
        time.sleep(0.05)
    raise AssertionError(f"no listening socket at {addr} (pid {pid})")


def _slow_sender(sock: socket.socket, stop: threading.Event) -> None:
    """One byte of a never-ending line a second: each recv succeeds, the message never completes."""
    try:
        while not stop.wait(1.0):
            sock.sendall(b"{")
    except OSError:
        pass


def test_stalling_and_malformed_intruders_cannot_hold_or_crash_the_collective():
    """On the rendezvous port: a connection that trickles one byte a second, JSON nested deeper
    than Python's recursion limit, a MAC in non-ASCII characters. On a node's ring port: another
    trickler and a wrong MAC. The collective still verifies within its own timeout, and every
    intruder is refused and counted where it knocked."""
    port, stop = free_port(), threading.Event()
    first = start_collective(0, 3, port, 40)
    _wait_listening("127.0.0.11", port)
    trickle = socket.create_connection(("127.0.0.11", port))
    threading.Thread(target=_slow_sender, args=(trickle, stop), daemon=True).start()
    deep = socket.create_connection(("127.0.0.11", port))
    deep.sendall(b"[" * 5000 + b"\n")
    wide = socket.create_connection(("127.0.0.11", port))
    _line(wide)
    wide.sendall(json.dumps({"nonce": "f" * 32, "mac": "\u00e9" * 64}).encode() + b"\n")
    second = start_collective(1, 3, port, 40)
    ring = _ring_port("127.0.0.12", second.pid)  # n2's ring listener, open before the rendezvous ends
    ring_trickle = socket.create_connection(("127.0.0.12", ring))
    threading.Thread(target=_slow_sender, args=(ring_trickle, stop), daemon=True).start()
    ring_wrong = socket.create_connection(("127.0.0.12", ring))
    ring_wrong.sendall((json.dumps({"nonce": "e" * 32, "mac": "0" * 64}) + "\n").encode())
    third = start_collective(2, 3, port, 40)
    try:
        res, others = collective_result(first), [collective_result(p) for p in (second, third)]
    finally:
        stop.set()
    assert res["error"] is None and res["verified"] is True, res
    assert [o["error"] for o in others] == [None, None]
    counts = {r["node"]: r["connections"] for r in res["rejected"]}
    assert counts.get("n1", 0) >= 3 and counts.get("n2", 0) >= 1, res["rejected"]
    for s in (trickle, deep, wide, ring_trickle, ring_wrong):
        s.close()
