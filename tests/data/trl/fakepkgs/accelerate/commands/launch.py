"""STAND-IN for `python -m accelerate.commands.launch` (README.md beside the package): the options hpcrl passes,
the config file they name, and the ranks' rendezvous on --main_process_ip:--main_process_port."""

import argparse
import runpy
import socket
import sys
import threading
import time

import yaml

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    for opt in ("--config_file", "--main_process_ip", "--module"):
        p.add_argument(opt, required=True)
    for opt in ("--num_machines", "--num_processes", "--machine_rank", "--main_process_port"):
        p.add_argument(opt, type=int, required=True)
    a, rest = p.parse_known_args()
    cfg = yaml.safe_load(open(a.config_file))
    if (cfg["num_machines"], cfg["num_processes"]) != (a.num_machines, a.num_processes):
        sys.exit(f"accelerate stand-in: {a.config_file} says {cfg['num_machines']} machines, {cfg['num_processes']} "
                 f"processes; the command line {a.num_machines}, {a.num_processes}")
    open(cfg["deepspeed_config"]["deepspeed_config_file"]).read()  # the DeepSpeed JSON it names is there
    if a.machine_rank == 0:
        server = socket.create_server(("0.0.0.0", a.main_process_port))
        peers = []
        threading.Thread(target=lambda: [peers.append(server.accept()[0]) for _ in range(a.num_machines - 1)],
                         daemon=True).start()
        print(f"accelerate stand-in: rank 0 of {a.num_machines} listening on {a.main_process_port}", flush=True)
        sys.argv = [a.module, *rest]
        try:
            runpy.run_module(a.module, run_name="__main__")
        finally:
            print(f"accelerate stand-in: {len(peers)} other rank(s) joined", flush=True)
    else:
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = socket.create_connection((a.main_process_ip, a.main_process_port), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    sys.exit(f"accelerate stand-in: rank {a.machine_rank} cannot reach {a.main_process_ip}:"
                             f"{a.main_process_port}")
                time.sleep(0.5)
        print(f"accelerate stand-in: rank {a.machine_rank} joined {a.main_process_ip}:{a.main_process_port}",
              flush=True)
        conn.settimeout(None)
        conn.recv(1)  # until rank 0 ends
