"""Cluster profiles: Pydantic models of `clusters/*.yaml`, their discovery and loading.

A profile is data: hardware, Slurm conventions, environment and storage of one cluster.
Facts carry their source in `sources` (fact path -> where it was read) and facts nobody
confirmed are listed in `unconfirmed`, so `hpcrl clusters show` can say so.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any, Literal

from platformdirs import user_config_dir
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from hpcrl import contract
from hpcrl.errors import ProfileError, UnknownNameError
from hpcrl.resources import data_dir
from hpcrl.shell import path_problem, regex, sbatch_words, slurm_time
from hpcrl.yamlfile import read_mapping

GIB = 1024**3
# What bash's `export NAME=...` accepts: ASCII only (str.isalnum would pass "FOOÄ").
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GPU(_Strict):
    model: str = Field(description="Marketing name, e.g. GH200, A100-SXM4-80GB")
    count_per_node: int = Field(gt=0)
    memory_gib: float = Field(gt=0, description="Memory the CUDA runtime reports as total, GiB")
    hbm_bandwidth_tbs: float = Field(gt=0, description="Peak HBM bandwidth, TB/s")
    bf16_tflops: float = Field(gt=0, description="Dense bf16 peak, TFLOP/s")
    compute_capability: str = "9.0"
    # None: the GPU model's default (hpcrl/memory/gpu_rates.py LINK_DEFAULTS), so older profiles still plan.
    intra_node_gbs: float | None = Field(default=None, gt=0, description="GPU-GPU link in a node, GB/s per direction")
    host_link_gbs: float | None = Field(default=None, gt=0, description="GPU-host link (PCIe, C2C), GB/s per direction")


class Node(_Strict):
    cpu_cores: int = Field(gt=0)
    ram_gib: float = Field(gt=0, description="Host RAM a job can allocate on one node, GiB")
    arch: Literal["x86_64", "aarch64"]
    interconnect: str = ""
    inter_node_gbs: float | None = Field(
        default=None, gt=0, description="Network of one node, all NICs, GB/s per direction (None: 25 per GPU)"
    )


class Partition(_Strict):
    max_nodes: int | None = Field(default=None, gt=0)
    max_gpus: int | None = Field(default=None, gt=0)
    max_time: str = Field(description="Wall-time limit, Slurm's D-HH:MM:SS or HH:MM:SS")
    description: str = ""
    _time = field_validator("max_time", mode="before")(slurm_time)  # as render checks it (else blamed on hpcrl.time)


class QOS(_Strict):
    name: str
    max_gpus: int | None = Field(default=None, gt=0, description="Per project/account")
    description: str = ""


class NodeSharing(_Strict):
    """How the site shares a node among jobs that ask for some of its GPUs (`--gpus N`)."""

    mode: Literal["proportional", "per-gpu", "whole-nodes"] = Field(
        description="proportional: the site gives each GPU its share of cores and memory itself; per-gpu: "
        "the script asks --cpus-per-gpu and --mem-per-gpu; whole-nodes: partial jobs are refused"
    )
    cpus_per_gpu: int | None = Field(default=None, gt=0, description="Cores a job gets per GPU")
    mem_per_gpu_gib: float | None = Field(default=None, gt=0, description="Host RAM a job gets per GPU, GiB")


class Slurm(_Strict):
    gpu_request: Literal["gpus-per-node", "gpus", "gres"] = Field(
        description="How the script asks for GPUs: --gpus-per-node=G, --gpus=N*G or --gres=gpu:G"
    )
    exclusive: bool = True
    default_partition: str | None = None
    system_nodes: int | None = Field(
        default=None,
        gt=0,
        description="Nodes of this type in the whole machine: no job can hold more, --allow-over-limit or not",
    )
    partitions: dict[str, Partition] = Field(default_factory=dict)
    qos: QOS | None = None
    account_pattern: str | None = Field(default=None, description="Regex an account must match")
    account_example: str | None = None
    account_required: bool = False
    constraint: str | None = Field(default=None, description="-C value used by this profile")
    exclude_nodes: list[str] = Field(default_factory=list)
    mem: str | None = Field(default=None, description="--mem value, e.g. 0 for the whole node")
    node_sharing: NodeSharing | None = Field(
        default=None, description="How a job with part of a node's GPUs gets cores and memory (hpcrl --gpus N)"
    )
    cpus_per_gpu: int | None = Field(default=None, gt=0)
    signal_before_end_s: int = Field(default=600, gt=0)
    kill_wait_s: int = Field(
        default=30,
        gt=0,
        description="Slurm's KillWait (TERM to KILL); the script reads scontrol's value and falls back to this",
    )
    min_poll_interval_s: int = Field(default=30, gt=0)
    _words = field_validator("default_partition", "mem", "exclude_nodes")(sbatch_words)  # what render checks
    _regex = field_validator("account_pattern")(regex)

    @model_validator(mode="after")
    def _default_partition_known(self) -> Slurm:
        sbatch_words(list(self.partitions))
        if self.default_partition and self.partitions and self.default_partition not in self.partitions:
            raise ValueError(f"default_partition {self.default_partition!r} is not one of {sorted(self.partitions)}")
        return self


def _path_ok(value: str) -> str:
    if problem := path_problem(value):
        raise ValueError(f"{value!r}: {problem}")
    return value


class StorageArea(_Strict):
    path: str = Field(description="May use environment variables expanded on the compute node")
    quota_gib: float | None = Field(default=None, gt=0)
    write_gib_s: float | None = Field(
        default=None, gt=0, description="Write bandwidth one job gets here, GiB/s (checkpoint write time)"
    )
    description: str = ""

    _path = field_validator("path")(_path_ok)


class Storage(_Strict):
    node_local: StorageArea
    run_root: StorageArea = Field(description="Shared filesystem where run directories go")
    hf_home: str = Field(description="HF cache on shared storage, never $HOME")
    _hf_home = field_validator("hf_home")(_path_ok)
    share_runs_with_group: bool = Field(
        default=False,
        description="Run directories readable by the user's group (umask 027) instead of the owner only (077)",
    )
    run_root_shared: bool = Field(
        default=False,
        description="The run root sits in a project directory its group may write, or another member owns (the "
        "site's norm): such a level is warned about, not refused; a world-writable one still is",
    )


class IdleGPUPolicy(_Strict):
    min_mean_power_w: float = Field(gt=0)
    grace_minutes: float = Field(ge=0)
    action: str = "cancel"
    description: str = ""


class Container(_Strict):
    runtime: Literal["none", "apptainer", "singularity", "podman-hpc", "enroot"] = "none"
    flags: list[str] = Field(default_factory=list)
    multi_node_note: str = Field(default="", description="What a container run across nodes needs here (a warning)")


class Ray(_Strict):
    num_cpus_per_node: int | None = Field(default=None, gt=0, description="Declared to Ray")
    object_store_gib: float | None = Field(default=None, gt=0)
    memory_kill_threshold: float = Field(default=0.95, gt=0, le=1)
    join_timeout_s: int = Field(default=600, gt=0)
    start_stagger_s: int = Field(
        default=0,
        ge=0,
        description="Seconds between the `ray start`s of nodes that share one host (slot k waits k times this)",
    )
    log_keep_mib: int = Field(default=64, gt=0, description="Ray session logs kept per node in the run dir (MiB)")
    metrics: bool = Field(
        default=False,
        description="Keep Ray's Prometheus metrics ports (they answer anyone on the network, without the token)",
    )
    ports: tuple[int, int] = Field(
        default=contract.RAY_PORTS,
        description="Ray's ports are drawn from this range (inclusive), per job and node; a firewall may allow fewer",
    )

    @field_validator("ports")
    @classmethod
    def _ports_ok(cls, v: tuple[int, int]) -> tuple[int, int]:
        low, high = v
        need = contract.NODE_SLOTS * (
            len(contract.HEAD_PORT_FLAGS) + len(contract.NODE_PORT_FLAGS) + len(contract.METRIC_PORT_VARS)
        )
        if not 1024 <= low <= high <= 65535 or high - low + 1 < need:
            raise ValueError(f"[{low}, {high}]: need 1024 <= low <= high <= 65535 and at least {need} ports")
        return v


class Planning(_Strict):
    max_learners_per_node: int | None = Field(
        default=None,
        gt=0,
        description="Learners the planner puts on one node; more only when pinned, with a warning",
    )
    why: str = Field(default="", description="Why, in words, for the warning")


class Variant(_Strict):
    """A node type selected by a Slurm constraint (Berzelius thin/fat)."""

    description: str = ""
    overrides: dict[str, Any]


class ClusterProfile(_Strict):
    name: str
    description: str = ""
    extends: str | None = None
    gpu: GPU
    node: Node
    slurm: Slurm
    modules: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    setup: list[str] = Field(default_factory=list, description="Extra shell lines run before anything")
    storage: Storage
    idle_gpu_policy: IdleGPUPolicy | None = None
    container: Container = Container()
    ray: Ray = Ray()
    planning: Planning = Planning()
    variants: dict[str, Variant] = Field(default_factory=dict)
    default_variant: str | None = None
    variant: str | None = Field(default=None, description="Set when a variant was applied")
    job_gpus: int | None = Field(default=None, description="Set on the view of one job with part of a node (for_gpus)")
    unconfirmed: list[str] = Field(default_factory=list)
    sources: dict[str, str] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for key in env:
            if not ENV_NAME.match(key):
                raise ValueError(
                    f"{key!r} is not a valid environment variable name (ASCII letters, digits and _, "
                    "not starting with a digit)"
                )
        return env

    @field_validator("unconfirmed", "sources")
    @classmethod
    def _paths_exist(cls, value: list[str] | dict[str, str], info: ValidationInfo) -> Any:
        # A typo here would silently drop a fact's source or its "unconfirmed" mark.
        for path in value:
            head = path.split(".")[0]
            if head not in info.data and head in cls.model_fields:
                continue  # that field failed validation itself; its error is reported instead
            if not _has_path(info.data, path.split(".")):
                raise ValueError(f"{path!r} names no field of the profile")
        return value

    @property
    def gpu_bytes(self) -> float:
        return self.gpu.memory_gib * GIB

    @property
    def max_nodes(self) -> int | None:
        """Most nodes one job may hold: the tightest of the default partition's and the QOS's limits."""
        per_node = self.gpu.count_per_node
        part, qos = self.default_partition, self.slurm.qos
        limits = [
            part and part.max_nodes,
            part and part.max_gpus and part.max_gpus // per_node,
            qos and qos.max_gpus and qos.max_gpus // per_node,
        ]
        found = [n for n in limits if n]
        return min(found) if found else None

    def source_of(self, path: str) -> str | None:
        """Source of the fact at dotted `path`: its own entry or that of the nearest enclosing path."""
        parts = path.split(".")
        for end in range(len(parts), 0, -1):
            found = self.sources.get(".".join(parts[:end]))
            if found:
                return found
        return None

    def is_unconfirmed(self, path: str) -> bool:
        """Whether the fact at `path`, or a path enclosing it, is listed in `unconfirmed`."""
        return any(path == p or path.startswith(p + ".") for p in self.unconfirmed)

    @property
    def default_partition(self) -> Partition | None:
        part = self.slurm.default_partition
        return self.slurm.partitions.get(part) if part else None


def _has_path(obj: Any, parts: list[str]) -> bool:
    for part in parts:
        if isinstance(obj, BaseModel):
            if part not in type(obj).model_fields:
                return False
            obj = getattr(obj, part)
        elif isinstance(obj, dict) and part in obj:
            obj = obj[part]
        else:
            return False
    return True


# --------------------------------------------------------------------------- loading


def _deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def flat_items(data: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted path, value) of every leaf of nested mappings; an empty mapping is a leaf."""
    out: list[tuple[str, Any]] = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out += flat_items(value, path + ".")
        else:
            out.append((path, value))
    return out


def _inherit(base: dict, over: dict) -> dict:
    """`over` (a child profile or variant overrides) merged onto `base`.

    A fact the child sets no longer carries the parent's source or "unconfirmed" mark; it
    carries the child's, and the child's marks add to the parent's instead of replacing them.
    """
    set_here = [p for p, _ in flat_items(over) if p.split(".")[0] not in ("sources", "unconfirmed")]

    def kept(path: str) -> bool:
        return not any(path == p or path.startswith(p + ".") for p in set_here)

    merged = _deep_merge(base, over)
    sources = {k: v for k, v in base.get("sources", {}).items() if kept(k)}
    merged["sources"] = {**sources, **over.get("sources", {})}
    marks = [p for p in base.get("unconfirmed", []) if kept(p)]
    merged["unconfirmed"] = marks + [p for p in over.get("unconfirmed", []) if p not in marks]
    return merged


def _first_error(path: str | Path, exc: ValidationError) -> str:
    # A typo'd key also makes the key it was meant to be "missing": name the typo first.
    err = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        problem = "unknown key"
    elif err["type"] == "missing":
        problem = "required field is missing"
    else:
        problem = err["msg"].removeprefix("Value error, ")
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"{path}: {where}: {problem}{more}"


def _read_yaml(path: Path) -> dict:
    return read_mapping(path, ProfileError, "profile fields")


def search_dirs() -> list[Path]:
    """Profile directories, later ones overriding earlier: shipped, user config dir, ./clusters."""
    dirs = [data_dir("clusters"), Path(user_config_dir("hpcrl")) / "clusters", Path.cwd() / "clusters"]
    extra = os.environ.get("HPCRL_CLUSTERS_DIR")
    if extra:
        dirs.append(Path(extra))
    seen: list[Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in [s.resolve() for s in seen]:
            seen.append(d)
    return seen


def profile_files() -> dict[str, Path]:
    """Name -> file of every profile found (a later directory wins)."""
    found: dict[str, Path] = {}
    for d in search_dirs():
        for f in sorted(d.glob("*.yaml")):
            found[f.stem] = f
    return found


def _raw(name: str, files: dict[str, Path], chain: tuple[str, ...] = ()) -> dict:
    if name not in files:
        raise UnknownNameError("cluster", name, files)
    path = files[name]
    data = _read_yaml(path)
    own_name = data.get("name", name)
    parent = data.get("extends")
    if parent:
        if parent in chain + (name,):
            raise ProfileError(f"{path}: extends: cycle through {parent!r}")
        data = _inherit(_raw(parent, files, chain + (name,)), data)
        data["extends"] = parent
    data["name"] = own_name  # a child is never named after its parent
    return data


def _validate(data: dict, path: str | Path, variant: str | None) -> ClusterProfile:
    try:
        profile = ClusterProfile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(_first_error(path, exc)) from None
    chosen = variant or profile.default_variant
    if chosen is None:
        return profile
    if chosen not in profile.variants:
        raise UnknownNameError(f"variant of cluster {profile.name}", chosen, profile.variants)
    merged = _inherit(data, profile.variants[chosen].overrides)
    merged["variant"] = chosen
    try:
        return ClusterProfile.model_validate(merged)
    except ValidationError as exc:
        raise ProfileError(_first_error(f"{path} (variant {chosen})", exc)) from None


def load_profile(name: str) -> ClusterProfile:
    """Load a profile by name; `name:variant` picks a node type (e.g. `berzelius:fat`)."""
    base, colon, variant = name.partition(":")
    if colon and not variant:  # `berzelius:` was read as the default node type
        raise ProfileError(f"cluster {name!r}: no variant after ':'; give name:variant (e.g. berzelius:fat) or name")
    files = profile_files()
    data = _raw(base, files)
    return _validate(data, files[base], variant or None)


def load_profile_file(path: str | Path, variant: str | None = None) -> ClusterProfile:
    """Load and validate one profile file; `extends` resolves against the known profiles."""
    path = Path(path)
    data = _read_yaml(path)
    own_name = data.get("name", path.stem)
    parent = data.get("extends")
    if parent:
        data = _inherit(_raw(parent, profile_files()), data)
        data["extends"] = parent
    data["name"] = own_name
    return _validate(data, path, variant)


def resolve_profile(
    cluster: str | None = None, cluster_file: str | Path | None = None, variant: str | None = None
) -> ClusterProfile:
    """The profile a command runs against: a file, a name, or the default (isambard-ai).

    `variant` picks another node type of the same profile (also for a --cluster-file profile,
    whose name need not be on the search path).
    """
    if cluster_file:
        return load_profile_file(cluster_file, variant)
    name = cluster or DEFAULT_CLUSTER
    return load_profile(f"{name.partition(':')[0]}:{variant}" if variant else name)


DEFAULT_CLUSTER = "isambard-ai"
