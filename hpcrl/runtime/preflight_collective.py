"""Preflight's collective check, run by the training Python on every node of the job.

Standalone: standard library only, torch when it imports. hpcrl preflight sends this file and
preflight_link.py (its links and their secret) in the job's spec; the probe writes both to a
temporary directory and runs `PYTHON preflight_collective.py ARGS_JSON`, one process per node.
It prints one line `HPCRL-COLLECTIVE <json>`.

1. Rendezvous over plain TCP: the job's first node listens at its Slurm NodeAddr on the
   job's port. Every link (to the first node, and each ring link) opens with a mutual
   HMAC-SHA256 challenge over a per-job secret that `hpcrl preflight` draws and hands to the
   nodes in the environment (HPCRL_COLLECTIVE_SECRET, never on a command line): a connection
   from anyone else on a shared node is dropped and counted, never read as a node. Every node
   says what it can run (torch? how many GPUs?) and the first node picks one method for all:
   `torch-nccl` when every node has torch and a GPU, `torch-gloo` when every node has torch,
   else `tcp-ring` (a ring over sockets, which measures the host network, not NCCL). A node
   that never joins is named.
2. All-reduce and all-gather per message size; the first node reports times and nccl-tests'
   bus bandwidth (algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather), and each node a
   ring send/receive rate from its neighbour (the slowest node is the lowest), and with torch
   on GPUs a bf16 GEMM's TFLOP/s per GPU.
"""

from __future__ import annotations

import json
import os
import random
import socket
import statistics
import sys
import threading
import time

if __package__:  # imported as hpcrl.runtime.preflight_collective
    from hpcrl.runtime.preflight_link import Gate, join, job_secret, recv_msg, send_msg
else:  # run as a script beside its copy of preflight_link.py (never an installed hpcrl's)
    from preflight_link import Gate, join, job_secret, recv_msg, send_msg  # type: ignore[no-redef]


def capabilities() -> dict:
    """What this node can run: torch's version and how many GPUs torch sees."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # ask NVML, leave CUDA uninitialised
    try:
        import torch
    except BaseException as exc:
        return {"torch": None, "gpus": 0, "why": (type(exc).__name__ + ": " + str(exc))[:160]}
    try:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        gpus = 0
    return {"torch": torch.__version__, "gpus": gpus, "why": None}


def choose_method(caps: list[dict]) -> str:
    if all(c["torch"] and c["gpus"] > 0 for c in caps):
        return "torch-nccl"
    if all(c["torch"] for c in caps):
        return "torch-gloo"
    return "tcp-ring"


class Control:
    """The star of control links: node 0 (master) to every other node."""

    def __init__(self, a: dict, me: dict, key: bytes, rejected: list):
        self.a, self.node_rank, self.n = a, a["node_rank"], a["nnodes"]
        self.peers: dict[int, tuple[socket.socket, bytearray]] = {}
        self.table: list = []
        self.missing: list[str] = []
        deadline = time.monotonic() + a["timeout_s"]
        if self.node_rank == 0:
            srv = socket.create_server((a["my_addr"], a["port"]), reuse_port=False)
            gate = Gate(srv, key, rejected)
            joined = {0: me}
            while len(joined) < self.n:
                got = gate.next(deadline)
                if got is None:
                    break
                conn, buf = got
                conn.settimeout(a["timeout_s"])
                try:
                    hello = recv_msg(conn, buf)
                    rank = int(hello["node_rank"])
                except (OSError, ValueError, KeyError, TypeError):
                    conn.close()
                    continue
                joined[rank] = hello
                self.peers[rank] = (conn, buf)
            gate.close()
            srv.close()
            missing = [a["nodes"][r] for r in range(self.n) if r not in joined]
            self.table = [joined.get(r) for r in range(self.n)]
            self.missing = missing
        else:
            sock, last = None, None
            while sock is None and time.monotonic() < deadline:
                try:
                    sock = socket.create_connection((a["master_addr"], a["port"]), timeout=5)
                except OSError as exc:
                    last = exc
                    time.sleep(0.5)
            if sock is None:
                raise RuntimeError(
                    f"could not reach the first node {a['nodes'][0]} at {a['master_addr']}:{a['port']} "
                    f"within {a['timeout_s']:.0f} s ({last})"
                )
            buf = join(sock, key, a["timeout_s"])
            sock.settimeout(2 * a["timeout_s"] + 30)  # the master may wait the whole timeout for the others
            self.peers[0] = (sock, buf)
            send_msg(sock, me)

    def broadcast(self, obj) -> dict:
        """Master sends obj to every node; others receive it."""
        if self.node_rank == 0:
            for sock, _ in self.peers.values():
                send_msg(sock, obj)
            return obj
        sock, buf = self.peers[0]
        return recv_msg(sock, buf)

    def gather(self, obj) -> list | None:
        """Every node's obj at the master (in node order); None elsewhere."""
        if self.node_rank != 0:
            send_msg(self.peers[0][0], obj)
            return None
        out = [obj] + [None] * (self.n - 1)
        for r, (sock, buf) in self.peers.items():
            out[r] = recv_msg(sock, buf)
        return out

    def barrier(self) -> None:
        self.gather({"ready": True})
        self.broadcast({"go": True})


# ---------------------------------------------------------------- tcp-ring: sockets, XOR as the reduction


def _exchange(send_sock, recv_sock, out: memoryview, into: memoryview) -> None:
    """Send `out` to the next node while receiving `into` from the previous one."""
    t = threading.Thread(target=send_sock.sendall, args=(out,))
    t.start()
    got = 0
    while got < len(into):
        n = recv_sock.recv_into(into[got:])
        if n == 0:
            raise ConnectionError("ring peer closed")
        got += n
    t.join()


def _xor(a: bytes | bytearray | memoryview, b: bytes | bytearray | memoryview) -> bytes:
    # Bitwise XOR is an exact, associative reduction that CPython does at C speed on big ints,
    # so the ring's time is the network's, not Python arithmetic's.
    n = len(a)
    return (int.from_bytes(a, "little") ^ int.from_bytes(b, "little")).to_bytes(n, "little")


def ring_all_reduce(ring, data: bytearray) -> bytearray:
    n, r = ring["n"], ring["rank"]
    c = len(data) // n
    chunks = [bytearray(data[i * c : (i + 1) * c]) for i in range(n)]
    tmp = bytearray(c)
    for s in range(n - 1):  # reduce-scatter
        _exchange(ring["next"], ring["prev"], memoryview(chunks[(r - s) % n]), memoryview(tmp))
        k = (r - s - 1) % n
        chunks[k] = bytearray(_xor(chunks[k], tmp))
    for s in range(n - 1):  # all-gather of the reduced chunks
        _exchange(ring["next"], ring["prev"], memoryview(chunks[(r - s + 1) % n]), memoryview(tmp))
        chunks[(r - s) % n] = bytearray(tmp)
    return bytearray(b"".join(chunks))


def ring_all_gather(ring, mine: bytes) -> bytearray:
    n, r = ring["n"], ring["rank"]
    parts = [b""] * n
    parts[r] = mine
    tmp = bytearray(len(mine))
    for s in range(n - 1):
        _exchange(ring["next"], ring["prev"], memoryview(parts[(r - s) % n]), memoryview(tmp))
        parts[(r - s - 1) % n] = bytes(tmp)
    return bytearray(b"".join(parts))


def connect_ring(
    a: dict, n: int, r: int, table: list[dict], listener: socket.socket, key: bytes, rejected: list
) -> dict:
    """This node's two ring links, each proved both ways: out to the next node, in from the previous.
    The accepting side runs in a thread: every node connects first, so the challenges cross."""
    inbound: dict = {}
    deadline = time.monotonic() + a["timeout_s"]
    gate = Gate(listener, key, rejected)
    taker = threading.Thread(target=lambda: inbound.update(got=gate.next(deadline)), daemon=True)
    taker.start()
    nxt = table[(r + 1) % n]
    out = socket.create_connection((nxt["addr"], nxt["ring_port"]), timeout=a["timeout_s"])
    try:
        join(out, key, a["timeout_s"])  # nothing else is sent on the ring before both links stand
        taker.join(max(0.0, deadline - time.monotonic()) + 1.0)
        if not inbound.get("got"):
            raise RuntimeError(
                f"the previous node {table[(r - 1) % n]['node']} did not open its ring link "
                f"within {a['timeout_s']:.0f} s"
            )
    except BaseException:
        out.close()
        raise
    gate.close()
    prev = inbound["got"][0]
    out.settimeout(a["timeout_s"])
    prev.settimeout(a["timeout_s"])
    return {"n": n, "rank": r, "next": out, "prev": prev}


def tcp_ring(a: dict, ctl: Control, table: list[dict], listener: socket.socket, key: bytes, rejected: list) -> dict:
    n, r = ctl.n, ctl.node_rank
    ring = connect_ring(a, n, r, table, listener, key, rejected)
    results, verified = [], True
    for size in a["sizes"]["tcp"]:
        size -= size % n
        data = bytearray(random.Random(r * 7919 + size).randbytes(size))
        times: dict[str, list[float]] = {"all_reduce": [], "all_gather": []}
        for it in range(a["iters"] + 1):  # the first round warms up
            ctl.barrier()
            t0 = time.perf_counter()
            out = ring_all_reduce(ring, data)
            t1 = time.perf_counter()
            got = ring_all_gather(ring, bytes(data[: size // n]))
            t2 = time.perf_counter()
            if it:
                times["all_reduce"].append(t1 - t0)
                times["all_gather"].append(t2 - t1)
            elif size == a["sizes"]["tcp"][0]:  # check the data once: every node's input XORed / concatenated
                inputs = [random.Random(k * 7919 + size).randbytes(size) for k in range(n)]
                want = bytes(size)
                for x in inputs:
                    want = _xor(want, x)
                verified &= bytes(out) == want and bytes(got) == b"".join(x[: size // n] for x in inputs)
        results += [{"op": op, "bytes": size, "time_s": statistics.median(ts)} for op, ts in times.items()]
    size = a["sizes"]["tcp"][-1] - a["sizes"]["tcp"][-1] % n
    buf = bytearray(size)
    ctl.barrier()
    t0 = time.perf_counter()
    _exchange(ring["next"], ring["prev"], memoryview(bytes(size)), memoryview(buf))
    p2p = [
        {
            "rank": r,
            "from_node": table[(r - 1) % n]["node"],
            "bytes": size,
            "gbs": size / (time.perf_counter() - t0) / 1e9,
        }
    ]
    for s in (ring["next"], ring["prev"]):
        s.close()
    return {"results": results, "p2p": p2p, "gemm": [], "verified": verified, "world": n}


# ---------------------------------------------------------------- torch.distributed (NCCL on GPUs, gloo on CPUs)


def torch_worker(
    local: int, a: dict, method: str, base: int, world: int, out_dir: str, node_of: list, per: int
) -> None:
    import torch
    import torch.distributed as dist

    rank = base + local
    res: dict = {"rank": rank, "gemm": [], "p2p": [], "results": [], "error": None}
    try:
        gpu = method == "torch-nccl"
        dev = torch.device("cuda", local) if gpu else torch.device("cpu")
        if gpu:
            torch.cuda.set_device(dev)
        from datetime import timedelta

        dist.init_process_group(
            "nccl" if gpu else "gloo",
            init_method=f"tcp://{a['master_addr']}:{a['port'] + 1}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=a["timeout_s"]),
        )
        sync = torch.cuda.synchronize if gpu else (lambda: None)
        if gpu:  # GEMM: bf16 N x N x N, 2N^3 flops a product
            nn = a["gemm_n"]
            x = torch.randn(nn, nn, device=dev, dtype=torch.bfloat16)
            y = torch.randn(nn, nn, device=dev, dtype=torch.bfloat16)
            for _ in range(3):
                x @ y
            sync()
            t0 = time.perf_counter()
            for _ in range(a["gemm_iters"]):
                x @ y
            sync()
            res["gemm"].append(
                {
                    "gpu": local,
                    "name": torch.cuda.get_device_name(dev),
                    "tflops": 2 * nn**3 * a["gemm_iters"] / (time.perf_counter() - t0) / 1e12,
                }
            )
            del x, y
        ones = torch.ones(1024, device=dev)
        dist.all_reduce(ones)
        verified = bool(torch.all(ones == world).item())
        for size in a["sizes"]["torch-nccl" if gpu else "tcp"]:
            numel = size // 4 // world * world
            t = torch.ones(numel, device=dev)
            part = torch.ones(numel // world, device=dev)
            for op in ("all_reduce", "all_gather"):
                times = []
                for it in range(a["iters"] + 1):
                    dist.barrier()
                    sync()
                    t0 = time.perf_counter()
                    if op == "all_reduce":
                        dist.all_reduce(t)
                    elif gpu:
                        dist.all_gather_into_tensor(t, part)
                    else:  # gloo: the list form
                        dist.all_gather(list(t.chunk(world)), part)
                    sync()
                    if it:
                        times.append(time.perf_counter() - t0)
                res["results"].append({"op": op, "bytes": numel * 4, "time_s": statistics.median(times)})
            del t, part
        peer_out, peer_in = (rank + per) % world, (rank - per) % world  # a neighbour on another node
        size = a["sizes"]["torch-nccl" if gpu else "tcp"][-1] // 4
        send, recv = torch.ones(size, device=dev), torch.empty(size, device=dev)
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        for w in dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, send, peer_out), dist.P2POp(dist.irecv, recv, peer_in)]
        ):
            w.wait()
        sync()
        res["p2p"].append(
            {
                "rank": rank,
                "from_node": node_of[peer_in],
                "bytes": size * 4,
                "gbs": size * 4 / (time.perf_counter() - t0) / 1e9,
            }
        )
        res["verified"] = verified
        dist.destroy_process_group()
    except Exception as exc:
        res["error"] = (type(exc).__name__ + ": " + str(exc)).splitlines()[0][:300]
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as fh:
        json.dump(res, fh)


def torch_node(a: dict, method: str, table: list[dict]) -> dict:
    import tempfile

    import torch.multiprocessing as mp

    r = a["node_rank"]
    counts = [t["gpus"] if method == "torch-nccl" else 1 for t in table]
    base, world = sum(counts[:r]), sum(counts)
    nodes = [t["node"] for t in table]
    node_of = [nodes[i] for i, c in enumerate(counts) for _ in range(c)]
    with tempfile.TemporaryDirectory(prefix="hpcrl-collective-") as out_dir:
        mp.start_processes(
            torch_worker,
            args=(a, method, base, world, out_dir, node_of, counts[r]),
            nprocs=counts[r],
            join=True,
            start_method="spawn",
        )
        ranks = []
        for name in sorted(os.listdir(out_dir)):
            with open(os.path.join(out_dir, name)) as fh:
                ranks.append(json.load(fh))
    errors = [f"rank {x['rank']}: {x['error']}" for x in ranks if x["error"]]
    first = ranks[0] if ranks else {"results": []}
    return {
        "results": first["results"] if r == 0 else [],
        "p2p": [p for x in ranks for p in x["p2p"]],
        "gemm": [g for x in ranks for g in x["gemm"]],
        "verified": all(x.get("verified") for x in ranks),
        "world": world,
        "error": "; ".join(errors) or None,
    }


def run(a: dict) -> dict:
    key = job_secret()
    rejected: list[str] = []  # addresses that connected without the secret
    caps = capabilities() if not a.get("force_tcp") else {"torch": None, "gpus": 0, "why": "forced"}
    listener = socket.create_server((a["my_addr"], 0))  # the ring's inbound link; the kernel picks the port
    me = {
        "node_rank": a["node_rank"],
        "node": a["node"],
        "addr": a["my_addr"],
        "ring_port": listener.getsockname()[1],
        **caps,
    }
    ctl = Control(a, me, key, rejected)
    plan = ctl.broadcast(
        {"missing": ctl.missing}
        if a["node_rank"] == 0 and ctl.missing
        else {"method": choose_method(ctl.table), "table": ctl.table}
        if a["node_rank"] == 0
        else None
    )
    if plan.get("missing"):
        return {
            "role": "first" if a["node_rank"] == 0 else "node",
            "method": None,
            "node": a["node"],
            "error": f"node(s) {', '.join(plan['missing'])} did not join the rendezvous at "
            f"{a['master_addr']}:{a['port']} within {a['timeout_s']:.0f} s",
            "missing": plan["missing"],
            "rejected": [{"node": a["node"], "connections": len(rejected)}] if rejected else [],
        }
    method, table = plan["method"], plan["table"]
    try:
        mine = (
            tcp_ring(a, ctl, table, listener, key, rejected) if method == "tcp-ring" else torch_node(a, method, table)
        )
        mine.setdefault("error", None)
    except Exception as exc:
        mine = {
            "error": (type(exc).__name__ + ": " + str(exc)).splitlines()[0][:300],
            "results": [],
            "p2p": [],
            "gemm": [],
            "verified": False,
        }
    mine.update(node=a["node"], method=method, rejected=len(rejected))
    everyone = ctl.gather(mine)
    listener.close()
    if everyone is None:
        return {"method": method, "node": a["node"], "gemm": mine["gemm"], "error": mine["error"], "role": "node"}
    return {
        "method": method,
        "role": "first",
        "node": a["node"],
        "nodes": [t["node"] for t in table],
        "world": mine.get("world"),
        "results": mine["results"],
        "torch": [t["torch"] for t in table],
        "why_not_torch": sorted({t["why"] for t in table if t.get("why")}),
        "p2p": [dict(p, node=e["node"]) for e in everyone for p in e["p2p"]],
        "gemm": [dict(g, node=e["node"]) for e in everyone for g in e["gemm"]],
        "verified": all(e["verified"] for e in everyone),
        "rejected": [{"node": e["node"], "connections": e.get("rejected", 0)} for e in everyone if e.get("rejected")],
        "error": "; ".join(f"{e['node']}: {e['error']}" for e in everyone if e["error"]) or None,
    }


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(
            "usage: python -m hpcrl.runtime.preflight_collective ARGS_JSON\n\n"
            "Preflight's collective check on one node of a job (hpcrl preflight runs it on every node;\n"
            "by hand, see benchmarks/preflight_device.py for the arguments). Prints one line\n"
            "`HPCRL-COLLECTIVE <json>`."
        )
        sys.exit(0 if len(sys.argv) == 2 else 2)
    args = json.loads(sys.argv[1])
    try:
        out = run(args)
    except Exception as exc:  # reported, not raised: the probe reads this line
        out = {"error": (type(exc).__name__ + ": " + str(exc)).splitlines()[0][:300], "node": args.get("node")}
    print("HPCRL-COLLECTIVE " + json.dumps(out), flush=True)
