"""What a driver's output says, line by line: training steps with their metrics, and the
lines that mean a Ray node, actor or vLLM engine died. Pure and standard-library only: the watchdog (in the job),
`hpcrl report`, `hpcrl watch` and `hpcrl diagnose` read logs with it.

Steps are read in the format the caller hands over (StepFormat): how the framework prints a step (its step lines,
the Rich panels of its metrics, the words of a line of pairs) and the keys its breakers read. A framework's format
is its backend's (LogFormat, hpcrl/planning/backends/log_facts.py, each key with its source); hpcrl/logs/log_format.py
picks a run's, or the union of all of them for a log whose framework is not known, and the in-job watchdog, which
cannot import a backend, reads that union from a file generated from them (hpcrl/runtime/watchdog.py).

What no backend owns is here. Lines holding a JSON object (one object per line after any prefix, nested objects'
keys joined with "/": any logger's) and lines ending in a Python dict literal (transformers' Trainer, OpenRLHF's step
line, forks that print their metrics) are read in every format. Only in the union (GENERIC): AReaL's StatsLogger
output (AReaL is not a backend of hpcrl; a user runs it as a custom script), a "Train step N/M done." line, then one
tabulate "fancy_grid" table per stats item of key/value cell pairs (floats as .4e, so an exact 0 is "0.0000e+00");
and metric names no one framework owns. docs/safety.md lists every key read and its source.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass, field, fields
from typing import Any

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# A value may be a numpy scalar's repr ("np.float64(0.5)": a framework that prints np.mean results; verl's
# backend says which): the number inside is read.
_PAIR = re.compile(
    r"['\"]?([A-Za-z_][\w/.\-]*)['\"]?\s*[:=]\s*(?:np\.\w+\()?(-?(?:nan|inf|\d+(?:\.\d*)?(?:e[-+]?\d+)?))", re.I
)
# The step's number in a JSON metric line, after the format's own step keys: Hugging Face's, a plain one, wandb's.
_JSON_STEP_KEYS = ("global_step", "step", "_step")
# AReaL StatsLogger.commit (4aef98d8 utils/stats_logger.py:141,150,162; 9af34d2b :134,140,150): the step line, then
# "Stats (i/n):" before each of the n tables (areal/utils/printing.py:6-21) that make up the step.
_TRAIN_STEP = re.compile(r"\bTrain step (\d+)/\d+ done\.")
_STATS_PART = re.compile(r"\bStats \((\d+)/(\d+)\):")


@dataclass(frozen=True)
class StepFormat:
    """How a log prints its training steps and which metric keys the breakers read, each in order of preference:
    the reader's copy of a backend's LogFormat (hpcrl/planning/backends/log_facts.py), field for field (a test holds
    them equal), and `stats_tables`, a format no backend owns."""

    step_lines: tuple[str, ...] = ()  # regexes before one step's `key: value` pairs; the first group is its number
    pair_words: tuple[str, ...] = ()  # a line with one of these words (and no step line) is one step's pairs
    panel_titles: tuple[str, ...] = ()  # Rich panels of a step's metrics, by title
    step_keys: tuple[str, ...] = ()  # metrics that carry the step's number
    reward: tuple[str, ...] = ()
    loss: tuple[str, ...] = ()
    grad_norm: tuple[str, ...] = ()
    reward_std: tuple[str, ...] = ()
    zero_std_fraction: tuple[str, ...] = ()
    advantage_ranges: tuple[tuple[str, str], ...] = ()
    stats_tables: bool = False  # AReaL's StatsLogger tables (GENERIC's alone)

    @classmethod
    def union(cls, *formats: StepFormat) -> StepFormat:
        """Every format's lines and keys, each once, in the order given (the first format's preferred)."""
        merged: dict[str, Any] = {
            f.name: tuple(dict.fromkeys(x for fmt in formats for x in getattr(fmt, f.name)))
            for f in fields(cls)
            if f.name != "stats_tables"
        }
        return cls(**merged, stats_tables=any(fmt.stats_tables for fmt in formats))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepFormat:
        """A format from its JSON object (to_json's)."""
        values: dict[str, Any] = {
            k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
            for k, v in data.items()
        }
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        return {
            f.name: [list(x) if isinstance(x, tuple) else x for x in v]
            if isinstance(v := getattr(self, f.name), tuple)
            else v
            for f in fields(self)
        }

    def step_line(self) -> re.Pattern[str] | None:
        """One regex of all the step lines (the leftmost match wins, as in one alternation)."""
        return re.compile("|".join(f"(?:{p})" for p in self.step_lines)) if self.step_lines else None


# What no backend owns, read where a log's framework is not known (hpcrl/logs/log_format.py's union).
# AReaL's GRPO examples log the reward under their actor's scope: "grpo_actor" until 274fab4b (9af34d2b
# examples/math/gsm8k_grpo.py:189, engine/ppo/actor.py:235), "ppo_actor" since (4aef98d8 trainer/ppo/actor.py:252,302);
# stats_tracker adds "/avg" (utils/stats_tracker.py:190-193). "rewards/mean", "train/loss" and "train/grad_norm" are
# names of no one framework (a logger that namespaces its metrics, a user's own).
GENERIC = StepFormat(
    reward=("rewards/mean", "ppo_actor/task_reward/avg", "grpo_actor/task_reward/avg"),
    loss=("train/loss",),
    grad_norm=("train/grad_norm",),
    stats_tables=True,
)


@dataclass
class Step:
    """One training step's metrics, with their printed text (to tell 0.00 from 0.00e+00)."""

    number: int
    values: dict[str, float]
    text: dict[str, str]
    fmt: StepFormat = field(default_factory=StepFormat)  # the format it was read in
    reward_keys: tuple[str, ...] = ()  # the keys of the reward, in order (default: the format's)
    std_keys: tuple[str, ...] = ()  # keys whose exact 0 means zero reward variance (besides the format's)
    loss_keys: tuple[str, ...] = ()  # the run's own loss keys (hpcrl.loss_keys), besides the format's

    @property
    def reward_key(self) -> str | None:
        return next((k for k in self.reward_keys or self.fmt.reward if k in self.values), None)

    @property
    def loss_key(self) -> str | None:
        return next((k for k in (*self.loss_keys, *self.fmt.loss) if k in self.values), None) or next(
            (k for k in self.values if k.startswith("loss/")), None
        )

    def exactly_zero(self, key: str) -> bool:
        return self.values[key] == 0.0 and not re.fullmatch(r"-?0\.00", self.text[key])

    def reward_is_exactly_zero(self) -> bool:
        k = self.reward_key
        return k is not None and self.exactly_zero(k)

    def bad_losses(self) -> dict[str, float]:
        return {
            k: v
            for k, v in self.values.items()
            if (k in self.fmt.loss or k in self.loss_keys or k.startswith("loss/")) and not math.isfinite(v)
        }

    def grad_norm(self) -> tuple[str, float] | None:
        """The step's gradient norm (key, value), if it logs one."""
        key = next((k for k in self.fmt.grad_norm if k in self.values), None) or next(
            (k for k in self.values if k.endswith("/grad_norm")), None
        )
        return (key, self.values[key]) if key else None

    def zero_variance(self) -> tuple[bool, str] | None:
        """(every group had zero reward variance, the evidence), or None when the step does not say."""
        for k in self.fmt.zero_std_fraction:
            if k in self.values:
                return self.values[k] == 1.0, f"{k}={self.text[k]}"
        for k in (*self.std_keys, *self.fmt.reward_std):
            if k in self.values:
                return self.exactly_zero(k), f"{k}={self.text[k]}"
        for lo, hi in self.fmt.advantage_ranges:
            if lo in self.values and hi in self.values:
                return self.exactly_zero(lo) and self.exactly_zero(hi), f"{lo}={self.text[lo]}, {hi}={self.text[hi]}"
        reward = self.reward_key
        base = reward.rsplit("/", 1)[0] if reward and reward.endswith(("/mean", "/avg")) else None
        if base and f"{base}/min" in self.values and f"{base}/max" in self.values:
            # One reward for the whole batch: every group's variance is zero.
            low, high = self.values[f"{base}/min"], self.values[f"{base}/max"]
            return low == high, f"{base}/min={self.text[f'{base}/min']}, {base}/max={self.text[f'{base}/max']}"
        return None


def _flatten(obj: dict, prefix: str = "") -> dict:
    out: dict = {}
    for k, v in obj.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, name + "/"))
        else:
            out[name] = v
    return out


def dict_metrics(line: str) -> list[tuple[str, str]] | None:
    """The (key, printed value) pairs of a Python dict literal ending a line (transformers' Trainer log), or None.
    A progress bar redrawn with carriage returns may share the line: the dict is read from its opening brace."""
    text = line.strip()
    start = text.find("{'")
    if start < 0 or not text.endswith("}"):
        return None
    text = text[start:]
    try:
        obj = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    return [
        (str(k), v if isinstance(v, str) else repr(v))
        for k, v in obj.items()
        if isinstance(v, (str, int, float)) and not isinstance(v, bool)
    ]


def json_metrics(line: str) -> dict[str, float] | None:
    """The numbers of a JSON object on one line (after any prefix such as a Ray actor's), or None."""
    start, text = line.find("{"), line.rstrip()
    if start < 0 or not text.endswith("}") or '"' not in text[start : start + 3]:
        return None
    try:
        obj = json.loads(text[start:])
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    return {k: float(v) for k, v in _flatten(obj).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class StepParser:
    """Feed log lines one at a time; `feed` returns a Step when a step's metrics are complete.

    `fmt` is the log's format (the run's backend's, or the union of all); `reward_keys` replace its reward keys when
    given, in order of preference; `std_keys` are added to the keys whose exact 0 means zero reward variance in every
    group; `loss_keys` to the losses whose NaN or infinity trips the NaN breaker."""

    def __init__(
        self,
        fmt: StepFormat,
        reward_keys: tuple[str, ...] | list[str] = (),
        std_keys: tuple[str, ...] | list[str] = (),
        loss_keys: tuple[str, ...] | list[str] = (),
    ) -> None:
        self.fmt = fmt
        self._step_line = fmt.step_line()
        self._panel: list[str] | None = None
        self._grid: list[tuple[str, str]] | None = None  # a stats table's (key, value) cells so far
        self._parts: list[tuple[str, str]] = []  # the cells of this step's earlier tables
        self._part, self._grid_step = (1, 1), None  # type: tuple[int, int], int | None
        self._count = 0
        self.reward_seen = False  # a step so far logged one of the reward keys
        self.reward_given = bool(reward_keys)  # the run named its reward keys (else the format's are read)
        self.reward_keys = tuple(reward_keys) or fmt.reward
        self.std_keys = tuple(std_keys)
        self.loss_keys = tuple(loss_keys)

    def feed(self, raw: str) -> Step | None:
        line = ANSI.sub("", raw.rstrip("\r\n"))
        if self._grid is not None:
            return self._grid_line(line)
        if self._panel is None:
            fmt, top = self.fmt, line.find("╭")
            if top >= 0 and any(title in line[top:] for title in fmt.panel_titles):
                self._panel = []
            elif fmt.stats_tables and line.lstrip().startswith("╒"):
                self._grid = []
            elif fmt.stats_tables and ((m := _TRAIN_STEP.search(line)) or (m := _STATS_PART.search(line))):
                if m.re is _TRAIN_STEP:
                    self._grid_step, self._parts, self._part = int(m.group(1)), [], (1, 1)
                else:
                    self._part = (int(m.group(1)), int(m.group(2)))
            elif (pairs := dict_metrics(line)) is not None:
                return self._make(pairs)
            elif (values := json_metrics(line)) is not None:
                number = next((int(values[k]) for k in (*fmt.step_keys, *_JSON_STEP_KEYS) if k in values), None)
                return self._make([(k, repr(v)) for k, v in values.items()], number)
            elif (m := self._step_line.search(line) if self._step_line else None) or any(
                w in line for w in fmt.pair_words
            ):
                number = int(next(g for g in m.groups() if g is not None)) if m else None
                return self._make(_PAIR.findall(line[m.end() :] if m else line), number)
            return None
        if "╰" in line:
            rows, self._panel = self._panel, None
            return self._from_panel(rows)
        side = line.find("│")
        if side >= 0:  # lines interleaved from other processes have no border: skip them
            self._panel.append(line[side + 1 :].rstrip().removesuffix("│"))
        return None

    def _make(self, pairs: list[tuple[str, str]], number: int | None = None) -> Step | None:
        values, text = {}, {}
        for key, val in pairs:
            try:
                values[key], text[key] = float(val), val
            except ValueError:
                continue
        fmt = self.fmt
        known = (
            *self.reward_keys,
            *fmt.loss,
            *self.loss_keys,
            *fmt.grad_norm,
            *self.std_keys,
            *fmt.reward_std,
            *fmt.zero_std_fraction,
        )
        if not any(k in known or k.startswith("loss/") or k.endswith("/grad_norm") for k in values):
            return None
        self._count += 1
        if number is None:
            number = next((int(values[k]) for k in fmt.step_keys if k in values), self._count)
        step = Step(number, values, text, fmt, self.reward_keys, self.std_keys, self.loss_keys)
        self.reward_seen = self.reward_seen or step.reward_key is not None
        return step

    def _grid_line(self, line: str) -> Step | None:
        """A line inside a stats table: `│ key │ value │ key │ value │` rows between ╞/├ rules, ╘ ends it."""
        assert self._grid is not None  # called only inside a table
        text = line.strip()
        if text.startswith("│"):
            cells = [c.strip() for c in text.strip("│").split("│")]
            self._grid += [(k, v) for k, v in zip(cells[::2], cells[1::2]) if k]
        elif text.startswith("╘"):
            self._parts, self._grid = self._parts + self._grid, None
            if self._part[0] >= self._part[1]:  # the step's last table: one step of all its tables' cells
                pairs, self._parts = self._parts, []
                return self._make(pairs, self._grid_step)
        return None  # a rule, or a line from another process

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


def reward_unseen(parser: StepParser, steps: int, within: int) -> str | None:
    """The warning once `steps` (at least `within`) steps were read and none logged a reward key, else None:
    the zero-reward breaker cannot see a reward it cannot find."""
    if parser.reward_seen or steps < within:
        return None
    keys = "the reward key " + ", ".join(parser.reward_keys) if parser.reward_given else "none of the known reward keys"
    return (
        f"{steps} training steps and {keys} in none of them: the zero-reward breaker cannot see the reward; "
        "name the key the run logs in hpcrl.reward_keys (the watchdog's --reward-key)"
    )


def parse_steps(lines: list[str], fmt: StepFormat, reward_keys: tuple[str, ...] | list[str] = ()) -> list[Step]:
    """Every training step found in `lines`, read in `fmt`."""
    parser = StepParser(fmt, reward_keys)
    return [s for s in map(parser.feed, lines) if s is not None]


# vLLM v1 engine/exceptions.py and core_client.py; Ray exceptions, GCS and raylet messages.
DEATH_PATTERNS = (
    ("vllm_engine_dead", re.compile(r"EngineDeadError|EngineCore encountered an issue|Engine core proc \S+ died")),
    (
        "ray_node_dead",
        re.compile(
            r"marked dead because the detector has missed too many heartbeats"
            r"|Raylet is terminated|raylet has died|local Raylet died",
            re.I,
        ),
    ),
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
LIBFABRIC = re.compile(
    r"VNI_NOT_FOUND|NET/OFI.*(?:RC:?\s*-?\d+|error|failed)|cxi.*(?:error|failed)|fi_\w+ failed", re.I
)
NCCL_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout: WorkNCCL\((.*?)\) ran for (\d+) milliseconds")
NCCL_SYSTEM = re.compile(
    r"ncclSystemError|ncclRemoteError|NCCL error.*(?:unhandled system error|remote process exited|"
    r"Connection (?:reset|closed|refused))"
)


def network_failure(text: str) -> str | None:
    """The network failure a crashed driver's log shows, or None (none, or a CUDA OOM: the run's own)."""
    if CUDA_OOM.search(text):
        return None
    for kind, pattern in (("libfabric", LIBFABRIC), ("nccl-system", NCCL_SYSTEM), ("nccl-timeout", NCCL_TIMEOUT)):
        if m := pattern.search(text):
            return f"{kind}: {m.group(0)[:160]}"
    return None
