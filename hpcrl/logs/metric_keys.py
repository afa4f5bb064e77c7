"""Which of a step's metrics `hpcrl watch` and `hpcrl report --html` show, in the run's framework's own keys (pure).

The keys come from the run's backend (its MetricFacts, hpcrl/planning/backends/log_facts.py), named by
plan.json (`backend`; a plan without one is the default backend's run); the run's own hpcrl.reward_keys and
hpcrl.loss_keys (plan.json `reward_keys`, `loss_keys`) come first, the keys of the format its log is read in last
(hpcrl/logs/log_format.py: the backend plan.json names, else every backend's).
"""

from __future__ import annotations

from hpcrl.errors import HpcrlError
from hpcrl.logs.driver_log import Step
from hpcrl.logs.log_format import plan_format
from hpcrl.planning.backends import backend_names, get_backend
from hpcrl.planning.backends.log_facts import MetricFacts, default_backend

# The roles a metric can play, in the order the views list them.
ROLES = ("reward", "reward_std", "kl", "loss", "grad_norm")


def backend_name(plan: dict | None) -> str:
    """The run's backend as plan.json names it (none: the default backend's run)."""
    name = (plan or {}).get("backend")
    return str(name) if name else default_backend()


def metric_keys(plan: dict | None) -> dict[str, tuple[str, ...]]:
    """role -> the keys that play it, in order of preference."""
    plan = plan or {}
    try:
        facts = get_backend(backend_name(plan)).metric_facts
    except HpcrlError:  # a plan.json naming a backend this hpcrl does not have
        facts = MetricFacts()

    def own(key: str) -> tuple[str, ...]:  # the plan's own key list
        return tuple(str(k) for k in plan.get(key) or ())

    fmt = plan_format(plan)
    keys = {
        "reward": own("reward_keys") + facts.reward + fmt.reward,
        "reward_std": facts.reward_std + fmt.reward_std,
        "kl": facts.kl,
        "loss": own("loss_keys") + facts.loss + fmt.loss,
        "grad_norm": facts.grad_norm + fmt.grad_norm,
    }
    return {role: tuple(dict.fromkeys(v)) for role, v in keys.items()}


def summary_keys() -> tuple[str, ...]:
    """The further metrics `hpcrl report`'s summary shows, every backend's (MetricFacts.summary), in the registry's
    order: a step shows those it logged."""
    return tuple(dict.fromkeys(k for name in backend_names() for k in get_backend(name).metric_facts.summary))


def pick(step: Step, keys: tuple[str, ...]) -> str | None:
    """The first of `keys` the step logged."""
    return next((k for k in keys if k in step.values), None)


__all__ = ["ROLES", "backend_name", "metric_keys", "pick", "summary_keys"]
