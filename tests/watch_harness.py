"""Stand-ins and checks shared by the `hpcrl watch` and `report --html` tests (tests/test_watch.py,
tests/test_watch_terminal.py, tests/test_report_html.py).

FAKE_GRPO is a stand-in for open-instruct's grpo_fast.py run by the rendered script on the local Slurm (no
GPU, no vLLM here): it prints each step's metrics as grpo_fast does, a Rich panel titled "Metrics" of one
row per key prefix ("other" for keys without "/"), `name: value` items joined by " | ", the display name
everything after the first "/", floats as .2e below 1e-5 else .2f (open-instruct e6c3044a,
model_utils.print_rich_single_line_metrics), written here from that description; and the line its
checkpoint-state timer logs, with DeepSpeed's `latest` marker. What it does is read from the file
`fake_behaviour` beside open_instruct/ (the rendered script passes only open-instruct's own flags).
"""

from __future__ import annotations

import os
import re
import sqlite3
from html.parser import HTMLParser
from pathlib import Path

FAKE_GRPO = r"""
import json, os, sys, time
from collections import defaultdict
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

argv = sys.argv[1:]
def opt(name):
    return argv[argv.index(name) + 1]
conf = dict(w.split("=", 1) for w in open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                       "fake_behaviour")).read().split())
ckpt, job = opt("--checkpoint_state_dir"), os.environ["SLURM_JOB_ID"]
run_dir = os.path.dirname(ckpt)
os.makedirs(ckpt, exist_ok=True)
latest = os.path.join(ckpt, "latest")
start = int(open(latest).read().strip().removeprefix("global_step")) + 1 if os.path.exists(latest) else 1
first_job = start == 1
plan = json.load(open(os.path.join(run_dir, "hpcrl", "plan.json")))
step_s = float(conf["slower"]) * plan["layout"]["step_time_s"]
console = Console(width=80, force_terminal=False, color_system=None)

def shown(v):
    return f"{v:.2e}" if isinstance(v, float) and abs(v) < 1e-5 else f"{v:.2f}" if isinstance(v, float) else str(v)

def panel(metrics):
    rows = defaultdict(list)
    for key, value in metrics.items():
        cat, _, name = key.partition("/") if "/" in key else ("other", "", key)
        rows[cat].append(f"{name}: {shown(value)}")
    table = Table(show_header=False, box=None)
    table.add_column("Category")
    table.add_column("Values")
    for cat in sorted(rows):
        table.add_row(cat, " | ".join(rows[cat]))
    console.print(Panel(table, title="Metrics", expand=False))
    sys.stdout.flush()

steps = int(conf["steps"])
for step in range(start, start + steps):
    time.sleep(float(conf["pause"]))
    reward = round(0.1 + 0.01 * step, 2)
    panel({"training_step": step, "scores": reward, "objective/verifiable_reward": reward,
           "loss/policy_avg": -0.01, "loss/total_avg": round(-0.001 * step, 3), "loss/kl_avg": 0.0,
           "time/total": step_s, "time/training": 0.6 * step_s, "time/group_generation_max": 0.4 * step_s,
           "val/stop_rate": 0.5})
    if step == int(conf.get("ckpt_at", 0)):
        print(f"[Main Thread] Saving checkpoint state: 2.500 seconds", flush=True)
        open(latest, "w").write(f"global_step{step}")
if first_job:
    time.sleep(float(conf.get("hold", 0)))  # a job the test preempts while it waits here
print(f"fake grpo_fast: job {job} done after step {start + steps - 1}", flush=True)
"""


def fake_open_instruct(
    env: dict, *, steps: int, pause: float, slower: float = 1.5, hold: float = 0, ckpt_at: int = 0
) -> None:
    """Install FAKE_GRPO as the harness's open-instruct checkout (tests/lifecycle_harness.py `env`)."""
    (env["workdir"] / "open_instruct" / "grpo_fast.py").write_text(FAKE_GRPO)
    (env["workdir"] / "fake_behaviour").write_text(
        f"steps={steps} pause={pause} slower={slower} hold={hold} ckpt_at={ckpt_at}\n"
    )


def reward_text(step: int) -> str:
    """The reward FAKE_GRPO prints for a step, as the panel shows it."""
    return f"{round(0.1 + 0.01 * step, 2):.2f}"


def tree(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under root with its size, mode and mtime (ns): what a reader must leave as it was."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_size if not p.is_dir() else 0, st.st_mode, st.st_mtime_ns)
    return out


def registry_rows(path: str | Path) -> list[tuple]:
    """Every row of the registry's tables, in order."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [tuple(r) for t in ("runs", "jobs") for r in conn.execute(f"SELECT * FROM {t} ORDER BY rowid")]
    finally:
        conn.close()


STEP_LINE = re.compile(r"^step (\d+)\b", re.M)


def frame_step(text: str) -> int | None:
    """The step number a `watch` frame shows."""
    m = STEP_LINE.search(text)
    return int(m.group(1)) if m else None


def dead_slurm(tmp: Path) -> str:
    """A PATH whose squeue, sacct and scontrol fail as they do when no slurmctld answers."""
    bindir = tmp / "dead-slurm-bin"
    bindir.mkdir(exist_ok=True)
    for name in ("squeue", "scontrol", "sacct", "sinfo"):
        p = bindir / name
        p.write_text(
            "#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' "
            ">&2\nexit 1\n"
        )
        p.chmod(0o755)
    return f"{bindir}:{os.environ['PATH']}"


def counting_slurm(tmp: Path) -> tuple[str, Path]:
    """A PATH whose Slurm commands log each call (one line: the command's name) and run the real ones."""
    import shutil

    bindir, log = tmp / "count-slurm-bin", tmp / "slurm-calls.log"
    bindir.mkdir(exist_ok=True)
    for name in ("squeue", "scontrol", "sacct"):
        real = shutil.which(name)
        if real is None:
            continue
        p = bindir / name
        p.write_text(f'#!/bin/sh\necho {name} >>"{log}"\nexec "{real}" "$@"\n')
        p.chmod(0o755)
    return f"{bindir}:{os.environ['PATH']}", log


# Anything that makes a browser fetch: a URL, or an element or attribute that loads one.
FETCHES = re.compile(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/|<script|<link|<iframe|<img|\bsrc\s*=|url\(", re.I)


class Page(HTMLParser):
    """The page's tags, and each chart (svg) with the marks of each named line: path vertices and dots."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.charts: list[dict] = []
        self._title: list[str] | None = None
        self._path: str | None = None
        self._stroke = ""
        self.cells: list[str] = []
        self._cell = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "svg":
            self.charts.append({"title": None, "lines": {}, "dots": []})
        elif tag == "title" and self.charts:
            self._title = []
        elif tag == "path" and self.charts:
            self._path, self._stroke = a["d"], a["stroke"]
        elif tag == "circle" and self.charts:
            self.charts[-1]["dots"].append(a["fill"])
        elif tag == "td":
            self._cell = True
            self.cells.append("")

    def handle_endtag(self, tag):
        if tag == "title" and self._title is not None and self.charts:
            text = "".join(self._title)
            if self._path is not None:  # a line: the points of each of its segments, and its colour
                segs = [seg.count("L") + 1 for seg in self._path.split("M") if seg.strip()]
                self.charts[-1]["lines"][text] = (segs, self._stroke)
            elif self.charts[-1]["title"] is None:
                self.charts[-1]["title"] = text
            self._title = None
        elif tag == "path":
            self._path = None
        elif tag == "td":
            self._cell = False

    def handle_data(self, data):
        if self._title is not None:
            self._title.append(data)
        if self._cell:
            self.cells[-1] += data

    @staticmethod
    def drawn(chart: dict) -> dict[str, int]:
        """Per line, the points a reader sees: those on segments of two or more, and its dots (lone samples)."""
        return {
            name: sum(n for n in segs if n >= 2) + chart["dots"].count(stroke)
            for name, (segs, stroke) in chart["lines"].items()
        }

    def chart(self, prefix: str) -> dict:
        found = [c for c in self.charts if (c["title"] or "").startswith(prefix)]
        assert len(found) == 1, [c["title"] for c in self.charts]
        return found[0]
