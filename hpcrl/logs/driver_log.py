"""What a driver's output says, line by line: training steps with their metrics, and the
lines that mean a Ray node, actor or vLLM engine died. Pure; the watchdog (in the job),
`hpcrl report` and `hpcrl diagnose` read logs with it.

grpo_fast prints each step as a Rich panel titled "Metrics" (open-instruct e6c3044a, model_utils
.print_rich_single_line_metrics): a row per key prefix ("other" without "/"), "name: value"
items joined by " | ", wrapped; floats as .2e when |v| < 1e-5 else .2f, so an exact 0.0 is
"0.00e+00" and a tiny non-zero mean "0.00". verl and OpenRLHF print one line per step. AReaL's
StatsLogger prints a "Train step N/M done." line, then one tabulate "fancy_grid" table per stats
item of key/value cell pairs (floats as .4e, so an exact 0 is "0.0000e+00"). Other loggers are
read from JSON metric lines: one object per line, nested objects joined with "/". transformers' Trainer
prints each logged step as a Python dict on a line of its own, every float formatted ".4g" as a string
(5.17.0 trainer_callback.py:673-690 ProgressCallback, :703-708 PrinterCallback): `{'loss': '0.01', 'reward':
'0', ...}`; ".4g" prints an exact 0.0 as "0" and any other value with its digits ("1e-09"), so "0" is an
exact zero. docs/safety.md lists every key read and its source.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# A value may be a numpy scalar's repr: verl 1dda039b needs numpy>=2 (setup.py:32), whose repr is
# "np.float64(0.5)", and prints np.mean results through pprint.pformat (utils/logger/aggregate_logger.py:26-31).
_PAIR = re.compile(r"['\"]?([A-Za-z_][\w/.\-]*)['\"]?\s*[:=]\s*(?:np\.\w+\()?(-?(?:nan|inf|\d+(?:\.\d*)?(?:e[-+]?\d+)?))",
                   re.I)
# "scores": grpo_fast (data_loader.py:1547); "objective/scores": the older *_vllm_thread_ray_gtrl.py;
# "critic/score/mean": verl (trainer/ppo/metric_utils.py:162); "reward", "rollout/reward_mean": OpenRLHF
# (trainer/ray/ppo_actor.py:384-388, trainer/ppo_trainer.py:421).
# AReaL's GRPO examples log the reward under their actor's scope: "grpo_actor" until 274fab4b
# (9af34d2b examples/math/gsm8k_grpo.py:189, engine/ppo/actor.py:235), "ppo_actor" since (4aef98d8
# trainer/ppo/actor.py:252,302); stats_tracker adds "/avg" (utils/stats_tracker.py:190-193).
REWARD_KEYS = ("scores", "objective/scores", "objective/verifiable_reward", "reward", "rewards/mean", "critic/score/mean",
               "rollout/reward_mean", "ppo_actor/task_reward/avg", "grpo_actor/task_reward/avg")
LOSS_KEYS = ("loss/total_avg", "loss/policy_avg", "train/loss", "loss", "actor/pg_loss", "policy_loss")
# verl actor/dp_actor.py:666; open-instruct grpo_fast.py:754; OpenRLHF trainer/ray/ppo_actor.py:380. Any other
# key ending in "/grad_norm" (a namespaced logger's) counts too.
GRAD_NORM_KEYS = ("actor/grad_norm", "optim/grad_norm", "actor_grad_norm", "grad_norm", "train/grad_norm")
# Exactly 0 when every prompt's group of samples got the same reward: OpenRLHF's mean of the per-group
# std (trainer/ppo_utils/experience_maker.py:255-262).
REWARD_STD_KEYS = ("group_reward_std",)
# The fraction of prompt groups whose rewards all agree: exactly 1 when every group has zero variance (TRL 1.16
# grpo_trainer.py:2830 `frac_reward_zero_std`).
ZERO_STD_FRACTION_KEYS = ("frac_reward_zero_std",)
# GRPO advantages are the reward minus its group mean: all exactly 0 when every group has zero variance.
# verl trainer/ppo/metric_utils.py:170-172; open-instruct data_loader.py:1566-1567.
ADVANTAGE_RANGES = (("critic/advantages/min", "critic/advantages/max"), ("val/advantages_min", "val/advantages_max"))
_STEP_LINE = re.compile(r"(?:^|\s)step:(\d+) - |Global step (\d+): \{")  # verl b178a3cd; OpenRLHF 3c3be623
_JSON_STEP_KEYS = ("training_step", "global_step", "step", "_step")
# AReaL StatsLogger.commit (4aef98d8 utils/stats_logger.py:141,150,162; 9af34d2b :134,140,150): the step line, then
# "Stats (i/n):" before each of the n tables (areal/utils/printing.py:6-21) that make up the step.
_TRAIN_STEP = re.compile(r"\bTrain step (\d+)/\d+ done\.")
_STATS_PART = re.compile(r"\bStats \((\d+)/(\d+)\):")


@dataclass
class Step:
    """One training step's metrics, with their printed text (to tell 0.00 from 0.00e+00)."""

    number: int
    values: dict[str, float]
    text: dict[str, str]
    reward_keys: tuple[str, ...] = REWARD_KEYS
    std_keys: tuple[str, ...] = REWARD_STD_KEYS
    loss_keys: tuple[str, ...] = ()  # the run's own loss keys (hpcrl.loss_keys), besides LOSS_KEYS

    @property
    def reward_key(self) -> str | None:
        return next((k for k in self.reward_keys if k in self.values), None)

    @property
    def loss_key(self) -> str | None:
        return next((k for k in (*self.loss_keys, *LOSS_KEYS) if k in self.values), None) or next(
            (k for k in self.values if k.startswith("loss/")), None)

    def exactly_zero(self, key: str) -> bool:
        return self.values[key] == 0.0 and not re.fullmatch(r"-?0\.00", self.text[key])

    def reward_is_exactly_zero(self) -> bool:
        k = self.reward_key
        return k is not None and self.exactly_zero(k)

    def bad_losses(self) -> dict[str, float]:
        return {k: v for k, v in self.values.items()
                if (k in LOSS_KEYS or k in self.loss_keys or k.startswith("loss/")) and not math.isfinite(v)}

    def grad_norm(self) -> tuple[str, float] | None:
        """The step's gradient norm (key, value), if it logs one."""
        key = next((k for k in GRAD_NORM_KEYS if k in self.values), None) or next(
            (k for k in self.values if k.endswith("/grad_norm")), None)
        return (key, self.values[key]) if key else None

    def zero_variance(self) -> tuple[bool, str] | None:
        """(every group had zero reward variance, the evidence), or None when the step does not say."""
        for k in ZERO_STD_FRACTION_KEYS:
            if k in self.values:
                return self.values[k] == 1.0, f"{k}={self.text[k]}"
        for k in self.std_keys:
            if k in self.values:
                return self.exactly_zero(k), f"{k}={self.text[k]}"
        for lo, hi in ADVANTAGE_RANGES:
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
    return [(str(k), v if isinstance(v, str) else repr(v)) for k, v in obj.items()
            if isinstance(v, (str, int, float)) and not isinstance(v, bool)]


def json_metrics(line: str) -> dict[str, float] | None:
    """The numbers of a JSON object on one line (after any prefix such as a Ray actor's), or None."""
    start, text = line.find("{"), line.rstrip()
    if start < 0 or not text.endswith("}") or '"' not in text[start:start + 3]:
        return None
    try:
        obj = json.loads(text[start:])
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    return {k: float(v) for k, v in _flatten(obj).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


class StepParser:
    """Feed log lines one at a time; `feed` returns a Step when a step's metrics are complete.

    `reward_keys` replace the known reward keys (REWARD_KEYS) when given, in order of preference;
    `std_keys` are added to the keys whose exact 0 means zero reward variance in every group; `loss_keys` to the
    losses whose NaN or infinity trips the NaN breaker."""

    def __init__(self, reward_keys: tuple[str, ...] | list[str] = (), std_keys: tuple[str, ...] | list[str] = (),
                 loss_keys: tuple[str, ...] | list[str] = ()) -> None:
        self._panel: list[str] | None = None
        self._grid: list[tuple[str, str]] | None = None  # a stats table's (key, value) cells so far
        self._parts: list[tuple[str, str]] = []  # the cells of this step's earlier tables
        self._part, self._grid_step = (1, 1), None  # type: tuple[int, int], int | None
        self._count = 0
        self.reward_seen = False  # a step so far logged one of the reward keys
        self.reward_keys = tuple(reward_keys) or REWARD_KEYS
        self.std_keys = tuple(std_keys) + REWARD_STD_KEYS
        self.loss_keys = tuple(loss_keys)

    def feed(self, raw: str) -> Step | None:
        line = ANSI.sub("", raw.rstrip("\r\n"))
        if self._grid is not None:
            return self._grid_line(line)
        if self._panel is None:
            top = line.find("╭")
            if top >= 0 and "Metrics" in line[top:]:
                self._panel = []
            elif line.lstrip().startswith("╒"):
                self._grid = []
            elif (m := _TRAIN_STEP.search(line)) or (m := _STATS_PART.search(line)):
                if m.re is _TRAIN_STEP:
                    self._grid_step, self._parts, self._part = int(m.group(1)), [], (1, 1)
                else:
                    self._part = (int(m.group(1)), int(m.group(2)))
            elif (pairs := dict_metrics(line)) is not None:
                return self._make(pairs)
            elif (values := json_metrics(line)) is not None:
                number = next((int(values[k]) for k in _JSON_STEP_KEYS if k in values), None)
                return self._make([(k, repr(v)) for k, v in values.items()], number)
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
        known = (*self.reward_keys, *LOSS_KEYS, *self.loss_keys, *GRAD_NORM_KEYS, *self.std_keys, *ZERO_STD_FRACTION_KEYS)
        if not any(k in known or k.startswith("loss/") or k.endswith("/grad_norm") for k in values):
            return None
        self._count += 1
        number = number if number is not None else int(values.get("training_step", self._count))
        step = Step(number, values, text, self.reward_keys, self.std_keys, self.loss_keys)
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
    keys = "the reward key " + ", ".join(parser.reward_keys) if parser.reward_keys != REWARD_KEYS else \
        "none of the known reward keys"
    return (f"{steps} training steps and {keys} in none of them: the zero-reward breaker cannot see the reward; "
            "name the key the run logs in hpcrl.reward_keys (the watchdog's --reward-key)")


def parse_steps(lines: list[str], reward_keys: tuple[str, ...] | list[str] = ()) -> list[Step]:
    """Every training step found in `lines`."""
    parser = StepParser(reward_keys)
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
