"""Errors a user can cause. The CLI prints their one-line message and exits 2."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class HpcrlError(Exception):
    """Base of every user-caused error: one line naming the bad value and what is valid."""

    exit_code = 2


class UnknownNameError(HpcrlError):
    """A name (cluster, model, run id, ...) that is not known."""

    def __init__(self, kind: str, name: str, valid: Iterable[str], detail: str = ""):
        valid = sorted(set(valid))
        close = closest(name, valid)
        hint = (
            f"closest: {', '.join(close)}"
            if close
            else f"valid: {', '.join(valid)}"
            if len(valid) <= 12
            else f"valid ({len(valid)}), most alike first: {', '.join(closest(name, valid, n=8, cutoff=0.0))}, ..."
        )
        super().__init__(f"unknown {kind} {name!r}{f' ({detail})' if detail else ''}; {hint}")
        self.name = name
        self.valid = valid


def closest(name: str, valid: Iterable[str], n: int = 3, cutoff: float = 0.5) -> list[str]:
    """The n valid names most like `name` (difflib), ignoring case and, for `org/name` ids, the org."""

    def alike(v: str) -> float:
        a, b = name.lower(), v.lower()
        tail = difflib.SequenceMatcher(None, a.rsplit("/", 1)[-1], b.rsplit("/", 1)[-1]).ratio()
        return max(difflib.SequenceMatcher(None, a, b).ratio(), tail)

    scored = sorted(((alike(v), v) for v in set(valid)), key=lambda sv: (-sv[0], sv[1]))
    # A clear winner stands alone: a typo's fix is not listed beside names that merely share letters.
    floor = max(cutoff, scored[0][0] - 0.15) if scored and cutoff > 0 else cutoff
    return [v for score, v in scored[:n] if score >= floor]


class ProfileError(HpcrlError):
    """A cluster profile file that does not validate (`file: field: problem`)."""


class ConfigError(HpcrlError):
    """A run config or override that does not validate."""


class ModelSpecError(HpcrlError):
    """A model config.json that lacks a needed field or has an impossible value."""


class PlanError(HpcrlError):
    """A layout or memory plan that cannot work, with what would make it work. Raised through `would_fit`,
    it carries its fixes apart from its words, so each can be tried as typed before it is printed
    (hpcrl/planning/request.py)."""

    def __init__(
        self, message: str, *, head: str | None = None, fixes: tuple[str, ...] = (), tail: str = "", none: str = ""
    ) -> None:
        super().__init__(message)
        self.head, self.fixes, self.tail, self.none = head, tuple(fixes), tail, none

    def with_fixes(self, fixes: Iterable[str]) -> PlanError:
        """The same refusal naming only `fixes` (the ones that planned when typed)."""
        return would_fit(self.head or str(self), tuple(fixes), self.tail, self.none)


def would_fit(head: str, fixes: tuple[str, ...], tail: str = "", none: str = "") -> PlanError:
    """`head; would fit: a | b` + tail, or `head; none` + tail where no fix is left."""
    said = f"; would fit: {' | '.join(fixes)}" if fixes else f"; {none}" if none else ""
    return PlanError(f"{head}{said}{tail}", head=head, fixes=fixes, tail=tail, none=none)


class RunDirUnreadable(HpcrlError):
    """A run directory whose file system fails under a reader (EIO, ...): the run's reason, in one line."""

    def __init__(self, path: object, exc: OSError):
        super().__init__(
            f"cannot read {path}: {exc.strerror or exc} (run-dir-unwritable: the run directory's file "
            "system failed; see docs/safety.md)"
        )


class SlurmError(HpcrlError):
    """Slurm refused or is missing; the message is Slurm's own where it has one."""


class RegistryError(HpcrlError):
    """An unknown run or a registry problem."""


def positive(name: str, value: float) -> float:
    """Return value if it is > 0, else raise an HpcrlError naming it."""
    if value is None or value <= 0:
        raise HpcrlError(f"{name} must be a positive number, got {value!r}")
    return value
