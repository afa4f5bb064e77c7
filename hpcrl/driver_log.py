"""What a driver's output says, line by line: training steps with their metrics, and the
lines that mean a Ray node, actor or vLLM engine died. Pure; the watchdog (in the job),
`hpcrl report` and `hpcrl diagnose` read logs with it.

grpo_fast prints each step as a Rich panel titled "Metrics" (open-instruct e6c3044a, model_utils
.print_rich_single_line_metrics): a row per key prefix ("other" without "/"), "name: value"
items joined by " | ", wrapped; floats as .2e when |v| < 1e-5 else .2f, so an exact 0.0 is
"0.00e+00" and a tiny non-zero mean "0.00". verl and OpenRLHF print one line per step.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_PAIR = re.compile(r"['\"]?([A-Za-z_][\w/.\-]*)['\"]?\s*[:=]\s*(-?(?:nan|inf|\d+(?:\.\d*)?(?:e[-+]?\d+)?))", re.I)
# "scores": grpo_fast (data_loader.py); "objective/scores": the older *_vllm_thread_ray_gtrl.py; "critic/score/mean": verl.
REWARD_KEYS = ("scores", "objective/scores", "objective/verifiable_reward", "reward", "rewards/mean", "critic/score/mean")
LOSS_KEYS = ("loss/total_avg", "loss/policy_avg", "train/loss", "loss", "actor/pg_loss", "policy_loss")
_STEP_LINE = re.compile(r"(?:^|\s)step:(\d+) - |Global step (\d+): \{")  # verl b178a3cd; OpenRLHF 3c3be623


@dataclass
class Step:
    """One training step's metrics, with their printed text (to tell 0.00 from 0.00e+00)."""

    number: int
    values: dict[str, float]
    text: dict[str, str]

    @property
    def reward_key(self) -> str | None:
        return next((k for k in REWARD_KEYS if k in self.values), None)

    def reward_is_exactly_zero(self) -> bool:
        k = self.reward_key
        return k is not None and self.values[k] == 0.0 and not re.fullmatch(r"-?0\.00", self.text[k])

    def bad_losses(self) -> dict[str, float]:
        return {k: v for k, v in self.values.items() if (k in LOSS_KEYS or k.startswith("loss/")) and not math.isfinite(v)}


class StepParser:
    """Feed log lines one at a time; `feed` returns a Step when a step's metrics are complete."""

    def __init__(self) -> None:
        self._panel: list[str] | None = None
        self._count = 0

    def feed(self, raw: str) -> Step | None:
        line = ANSI.sub("", raw.rstrip("\r\n"))
        if self._panel is None:
            top = line.find("╭")
            if top >= 0 and "Metrics" in line[top:]:
                self._panel = []
            elif (m := _STEP_LINE.search(line)) or "training_step" in line:
                return self._make(_PAIR.findall(line[m.end():] if m else line), int(m.group(1) or m.group(2)) if m else None)
            return None
        if "╰" in line:
            rows, self._panel = self._panel, None
            return self._from_panel(rows)
        side = line.find("│")
        if side >= 0:  # lines interleaved from other processes have no border: skip them
            self._panel.append(line[side + 1:].rstrip().removesuffix("│"))
        return None

    def _make(self, pairs: list[tuple[str, str]], number: int | None = None) -> Step | None:
        values, text = {}, {}
        for key, val in pairs:
            try:
                values[key], text[key] = float(val), val
            except ValueError:
                continue
        if not any(k in REWARD_KEYS or k in LOSS_KEYS or k.startswith("loss/") for k in values):
            return None
        self._count += 1
        return Step(number if number is not None else int(values.get("training_step", self._count)), values, text)

    def _from_panel(self, rows: list[str]) -> Step | None:
        rows = [r for r in rows if r.strip()]
        indent = min((len(r) - len(r.lstrip()) for r in rows), default=0)
        cats: list[list[str]] = []  # [category, text, text, ...]; wrapped text is indented further
        for r in rows:
            if len(r) - len(r.lstrip()) == indent:
                cats.append(r.strip().split(None, 1) + [""])
            elif cats:
                cats[-1].append(r.strip())
        pairs = []
        for cat, *parts in cats:
            for name, sep, val in (i.strip(" |").rpartition(":") for i in " ".join(parts).split(" | ")):
                if sep and name.strip():
                    pairs.append((name.strip() if cat == "other" else f"{cat}/{name.strip()}", val.strip()))
        return self._make(pairs)


def parse_steps(lines: list[str]) -> list[Step]:
    """Every training step found in `lines`."""
    parser = StepParser()
    return [s for s in map(parser.feed, lines) if s is not None]


# vLLM v1 engine/exceptions.py and core_client.py; Ray exceptions, GCS and raylet messages.
DEATH_PATTERNS = (
    ("vllm_engine_dead", re.compile(r"EngineDeadError|EngineCore encountered an issue|Engine core proc \S+ died")),
    ("ray_node_dead", re.compile(r"marked dead because the detector has missed too many heartbeats"
                                 r"|Raylet is terminated|raylet has died|local Raylet died", re.I)),
    ("ray_actor_died", re.compile(r"ActorDiedError|RayActorError|The actor died unexpectedly")),
)
_INTENTIONAL = re.compile(r"ray\.kill|intentionally killed", re.I)


def death_line(line: str) -> str | None:
    """Which death pattern `line` shows (None: none, or an intentional `ray.kill`)."""
    return None if _INTENTIONAL.search(line) else next((n for n, p in DEATH_PATTERNS if p.search(line)), None)


# Failures of the machines, not of the run (a continuation on other nodes may well succeed):
# the Slingshot/libfabric layer and NCCL's system/remote errors, and a collective that timed
# out with no CUDA OOM before it (diagnose.py explains each).
CUDA_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError: CUDA|CUDA error: out of memory")
LIBFABRIC = re.compile(r"VNI_NOT_FOUND|NET/OFI.*(?:RC:?\s*-?\d+|error|failed)|cxi.*(?:error|failed)|fi_\w+ failed", re.I)
NCCL_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout: WorkNCCL\((.*?)\) ran for (\d+) milliseconds")
NCCL_SYSTEM = re.compile(r"ncclSystemError|ncclRemoteError|NCCL error.*(?:unhandled system error|remote process exited|"
                         r"Connection (?:reset|closed|refused))")


def network_failure(text: str) -> str | None:
    """The network failure a crashed driver's log shows, or None (none, or a CUDA OOM: the run's own)."""
    if CUDA_OOM.search(text):
        return None
    for kind, pattern in (("libfabric", LIBFABRIC), ("nccl-system", NCCL_SYSTEM), ("nccl-timeout", NCCL_TIMEOUT)):
        if (m := pattern.search(text)):
            return f"{kind}: {m.group(0)[:160]}"
    return None
