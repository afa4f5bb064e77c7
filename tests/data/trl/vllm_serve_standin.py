"""STAND-IN for `trl vllm-serve` (no GPU, no vLLM here): takes the command's own keys, answers what TRL's
trainer asks of the server (TRL 1.16.0): GET /health (trl/generation/vllm_client.py:278), GET /v1/models (:253),
GET /get_world_size (:324), POST /v1/completions (:455, a fixed completion per prompt).

    python vllm_serve_standin.py --model M --port P [--startup-s S] [--die-after-s S] [--tensor_parallel_size N] ...

--startup-s: seconds before it listens (a model load); --die-after-s: it exits 1 that long after listening,
printing vLLM's engine-death line first (the job must end with this reason); --linger-s: after that line it stops
answering (its socket closed) and exits only that much later, as an API server does while it shuts down: the
trainer fails first. Every other `trl vllm-serve` key
(data/trl/1.16.0/vllm_serve_args.json) is accepted and ignored.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TABLE = Path(__file__).resolve().parents[3] / "hpcrl/planning/backends/data/trl/1.16.0/vllm_serve_args.json"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    for key in (k for k in json.loads(TABLE.read_text()) if not k.startswith("_")):
        p.add_argument(f"--{key}", default=None)
    p.add_argument("--startup-s", type=float, default=0.0)
    p.add_argument("--die-after-s", type=float, default=None)
    p.add_argument("--linger-s", type=float, default=0.0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    time.sleep(a.startup_s)
    world = int(a.tensor_parallel_size or 1) * int(a.data_parallel_size or 1)

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # http.server's method name
            routes = {"/health": {}, "/v1/models": {"data": [{"id": a.model}]},
                      "/get_world_size": {"world_size": world}}
            self._send(200, routes[self.path]) if self.path in routes else self._send(404, {"error": self.path})

        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n) or b"{}")
            prompts = body.get("prompt") or [""]
            self._send(200, {"choices": [{"text": " 42", "index": i} for i in range(len(prompts))]})

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer((a.host or "0.0.0.0", int(a.port or 8000)), Handler)
    print(f"vllm-serve stand-in: {a.model} on port {server.server_port} (TP {a.tensor_parallel_size or 1})", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    if a.die_after_s is None:
        threading.Event().wait()
    time.sleep(a.die_after_s)
    print("ERROR [core.py] EngineCore encountered an issue. See stack trace (above) for the root cause.", flush=True)
    server.shutdown()
    server.server_close()
    time.sleep(a.linger_s)
    return 1


if __name__ == "__main__":
    sys.exit(main())
