"""Job specs: the YAML file that says what to train, how fast it runs where, and by when.

```yaml
jobs:
  - name: resnet50
    throughput: {K80: 0.25, P100: 0.93, V100: 2.4}   # steps/s on ONE GPU of that model
    work: {gpu_days: 4, gpu: V100}                   # or {steps: 985000}
    gpus: 1                                          # or {min: 1, max: 8}
    deadline: 72h                                    # or an ISO 8601 time
    checkpoint_gb: 0.1
    restart_s: 300
```

Validation errors name the job and the field (``jobs[0] (resnet50).work.gpu_days: must be > 0``)
and are raised as ``InputError``; nothing is half-loaded.
"""

from __future__ import annotations

import difflib
import re
import shlex
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from spotopt.catalog import gpu_matches, gpu_models
from spotopt.errors import InputError
from spotopt.files import check_text, read_text
from spotopt.render import shown
from spotopt.times import check_time, parse_duration

CHECKPOINT_GB_PER_S = 0.25
"""Assumed write speed to durable object storage when a spec gives ``checkpoint_gb`` but no
``checkpoint_s`` (a single-stream upload to S3/GCS/Blob runs at roughly 100-500 MB/s)."""

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def gpu_key(value: str) -> str:
    """Canonical spelling of a GPU model or family (``v100`` → ``V100``); ``ValueError`` if unknown."""
    for name in sorted(gpu_models()):
        if gpu_matches(value, name):
            return name if len(name) == len(value) else name[: len(value)]
    names = sorted({n.split("-")[0] for n in gpu_models()} | set(gpu_models()))
    close = difflib.get_close_matches(value.upper(), names, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise ValueError(f"unknown GPU {value!r}; {hint}use a model (V100-32GB) or family (V100)")


class _Strict(BaseModel):
    # No inf/nan anywhere: the solver then fails with "kUnknown" far from the field to blame.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# Sane ranges. Each bound is far beyond any real job, and far inside what float64 arithmetic in
# the policies (steps / steps-per-second, $/h x hours) handles without overflow or underflow.
MAX_STEPS = 1e15
MAX_GPU_DAYS = 1e6
MIN_STEPS_PER_S = 1e-6
MAX_STEPS_PER_S = 1e9
MAX_GPUS = 1024
MAX_GB = 1e7
MAX_SECONDS = 7 * 86400.0
MAX_COMM_RATIO = 100.0
MAX_USD = 1e9
MAX_MOVE_MARGIN = 100.0
"""A voluntary move that must save 100 times its cost is one that never happens: say so with
a higher ``guardrails.min_dwell_s`` instead."""
MIN_USD = 0.01
"""A cent: less buys no second of any instance, so a smaller budget is a typo."""


class Work(_Strict):
    """How much training is left: steps, or GPU-days on a reference GPU (converted with its throughput)."""

    steps: Annotated[float, Field(gt=0, le=MAX_STEPS)] | None = None
    gpu_days: Annotated[float, Field(gt=0, le=MAX_GPU_DAYS)] | None = None
    gpu: str | None = None

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, value: str | None) -> str | None:
        return None if value is None else gpu_key(value)

    @field_validator("steps")
    @classmethod
    def _whole(cls, value: float | None) -> float | None:
        if value is not None and value != int(value):
            raise ValueError(f"{value!r} is not a whole number of steps")
        return value

    @model_validator(mode="after")
    def _one_of(self) -> Work:
        if (self.steps is None) == (self.gpu_days is None):
            raise ValueError("give exactly one of steps or gpu_days")
        if self.gpu_days is not None and self.gpu is None:
            raise ValueError("gpu_days needs gpu: the GPU model the days are counted on (e.g. gpu: V100)")
        return self


class GpuRange(_Strict):
    min: Annotated[int, Field(ge=1, le=MAX_GPUS)] = 1
    max: Annotated[int, Field(ge=1, le=MAX_GPUS)]

    @model_validator(mode="after")
    def _ordered(self) -> GpuRange:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self


class Dataset(_Strict):
    """Where the training data lives; running elsewhere costs one egress transfer of ``gb``."""

    gb: Annotated[float, Field(ge=0, le=MAX_GB)]
    cloud: Literal["aws", "gcp", "azure"]
    region: str


class Allow(_Strict):
    """Filters on the markets a job may use; an empty or missing list means "any"."""

    clouds: list[Literal["aws", "gcp", "azure"]] = []
    markets: list[Literal["spot", "on-demand"]] = []
    regions: list[str] = []
    gpus: list[str] = []
    instance_types: list[str] = []

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: list[str]) -> list[str]:
        return [gpu_key(v) for v in value]


class Scaling(_Strict):
    """Data-parallel efficiency model: ``eff(d) = 1 / (1 + 2·comm_ratio·(d-1))`` (ring all-reduce)."""

    comm_ratio: Annotated[float, Field(ge=0, le=MAX_COMM_RATIO)]


_PARAMETERS = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmbt])$", re.IGNORECASE)
_PARAMETER_UNITS = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}
MAX_PARAMETERS = 1e14
OPTIMIZER_BYTES = {"adam": 8.0, "sgd": 4.0, "none": 0.0}
"""Bytes of optimizer state per parameter (fp32): Adam's two moments, SGD's momentum."""


class Memory(_Strict):
    """What the job needs in each GPU's memory, so a GPU that cannot hold it is never offered.

    Either ``peak_gb``, a measured peak per GPU (``nvidia-smi``/``torch.cuda.max_memory_allocated``),
    or the model states counted as the ZeRO paper (Rajbhandari et al. 2020, section 3) and
    Rubick count them: ``parameters`` × (weights + gradients + optimizer states) bytes, with
    ``precision: mixed`` 2 + 2 + (4 fp32 master + ``optimizer``'s states) = 16 for Adam, ``fp32``
    4 + 4 + states; ZeRO ``zero_stage`` 1, 2, 3 partition the optimizer states, then the
    gradients, then the weights over the job's data-parallel GPUs; plus ``activations_gb`` per GPU.
    """

    parameters: Annotated[float, Field(gt=0, le=MAX_PARAMETERS)] | None = None
    precision: Literal["mixed", "fp32"] = "mixed"
    optimizer: Literal["adam", "sgd", "none"] = "adam"
    zero_stage: Literal[0, 1, 2, 3] = 0
    activations_gb: Annotated[float, Field(ge=0, le=MAX_GB)] = 0.0
    peak_gb: Annotated[float, Field(gt=0, le=MAX_GB)] | None = None

    @field_validator("parameters", mode="before")
    @classmethod
    def _count(cls, value: Any) -> Any:
        """``13B``, ``350M``, ``1.3e9`` (PyYAML reads a bare ``13e9`` as text) or a number."""
        if isinstance(value, str):
            text = value.strip()
            match = _PARAMETERS.match(text)
            if match:
                return float(match.group(1)) * _PARAMETER_UNITS[match.group(2).lower()]
            try:
                return float(text)
            except ValueError:
                raise ValueError(
                    f"{value!r} is not a parameter count; write e.g. 13B, 350M or 1.3e9"
                ) from None
        return value

    @model_validator(mode="after")
    def _one_of(self) -> Memory:
        if (self.parameters is None) == (self.peak_gb is None):
            raise ValueError(
                "give exactly one of parameters (the model's size) or peak_gb (a measured peak per GPU)"
            )
        return self

    def per_gpu_gb(self, gpus: int) -> float:
        """GB each GPU needs when the job runs data-parallel on ``gpus`` GPUs."""
        if self.peak_gb is not None:
            return self.peak_gb
        assert self.parameters is not None
        weights = grads = 2.0 if self.precision == "mixed" else 4.0
        master = 4.0 if self.precision == "mixed" and self.optimizer != "none" else 0.0
        states = OPTIMIZER_BYTES[self.optimizer] + master
        stage = self.zero_stage
        per_param = (
            (weights / gpus if stage >= 3 else weights)
            + (grads / gpus if stage >= 2 else grads)
            + (states / gpus if stage >= 1 else states)
        )
        return self.parameters * per_param / 1e9 + self.activations_gb


class Checkpoint(_Strict):
    """Where a managed job's checkpoints go (a store URL or a path relative to the job file) and
    how often (a duration; none: the agent's Young/Daly period)."""

    uri: Annotated[str, Field(min_length=1)]
    every: str | None = None

    @field_validator("every")
    @classmethod
    def _every(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                if parse_duration(value, "every").total_seconds() <= 0:
                    raise ValueError(f"{value!r} must be longer than 0s")
            except InputError as exc:
                raise ValueError(str(exc).removeprefix("every: ")) from None
        return value


FAIL_FAST_EXIT_CODES = (2, 126, 127)
"""Exit statuses a retry cannot cure: a usage error, a command that is not executable, one that
does not exist (the shell's 126 and 127). Retrying them only bills another start each time."""


class Retry(_Strict):
    """What the daemon does when the training process exits with an error: relaunch it from the
    newest verified checkpoint, at most ``max`` times in a row (``spotopt jobs retry`` starts a
    new run of tries). ``on_exit_codes``: only these statuses are retried (none given: every
    status but ``FAIL_FAST_EXIT_CODES``; an OOM kill is 137, a crash 1 or 134)."""

    max: Annotated[int, Field(ge=0, le=100, strict=True)] = 3
    on_exit_codes: list[Annotated[int, Field(ge=1, le=255, strict=True)]] | None = None

    def retries(self, exit_code: int | None) -> bool:
        """Whether an exit with ``exit_code`` (None: no status, the process was killed) is retried."""
        if exit_code is None:
            return True
        if self.on_exit_codes is not None:
            return exit_code in self.on_exit_codes
        return exit_code not in FAIL_FAST_EXIT_CODES


class JobGuardrails(_Strict):
    """The daemon's guardrails this job sets for itself (None: the daemon's setting; see
    ``spotopt.decide.guardrails`` for why each exists). ``min_dwell_s``: seconds on a market
    before a voluntary move; ``move_margin``: the saving a voluntary move needs, as a multiple of
    its cost; ``deadline_margin_s``: slack kept before falling back to on-demand."""

    min_dwell_s: Annotated[float, Field(ge=0, le=MAX_SECONDS, strict=True)] | None = None
    move_margin: Annotated[float, Field(ge=0, le=MAX_MOVE_MARGIN, strict=True)] | None = None
    deadline_margin_s: Annotated[float, Field(ge=0, le=MAX_SECONDS, strict=True)] | None = None


StepsPerS = Annotated[float, Field(ge=MIN_STEPS_PER_S, le=MAX_STEPS_PER_S)]
GpuCount = Annotated[int, Field(ge=1, le=MAX_GPUS)]
Throughputs = dict[str, StepsPerS | dict[GpuCount, StepsPerS]]


def _bounded(deadline: datetime) -> datetime:
    """The shared time bounds, as the ``ValueError`` pydantic turns into a field error."""
    try:
        return check_time(deadline, "deadline")
    except InputError as exc:
        raise ValueError(str(exc).removeprefix("deadline: ")) from None


class Job(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=128)]
    workload: str | None = None
    """Name under which the throughput store holds this job's figures (default: ``name``)."""
    throughput: Throughputs = {}
    """GPU → steps/s on one GPU, or GPU → {GPU count: steps/s} for measured multi-GPU points."""
    work: Work
    gpus: GpuCount | GpuRange = 1
    deadline: str | datetime | None = None
    checkpoint_gb: Annotated[float, Field(ge=0, le=MAX_GB)] = 0.0
    checkpoint_s: Annotated[float, Field(ge=0, le=MAX_SECONDS)] | None = None
    restart_s: Annotated[float, Field(ge=0, le=MAX_SECONDS)] = 300.0
    dataset: Dataset | None = None
    allow: Allow = Allow()
    scaling: Scaling | None = None
    memory: Memory | None = None
    """What the job needs in each GPU's memory (None: unknown, every GPU is offered)."""
    # What the mover needs to run the job (``spotopt jobs submit`` requires run, checkpoint and
    # budget_usd); the planner and the what-if engine ignore these fields.
    run: Annotated[str, Field(min_length=1)] | None = None
    checkpoint: Checkpoint | None = None
    # Strict: YAML's ``true`` would otherwise be a budget of $1.
    budget_usd: Annotated[float, Field(ge=MIN_USD, le=MAX_USD, strict=True)] | None = None
    max_usd_per_hour: Annotated[float, Field(ge=MIN_USD, le=MAX_USD, strict=True)] | None = None
    retry: Retry | None = None
    """How a failed training process is retried (None: ``Retry()``'s defaults)."""
    guardrails: JobGuardrails | None = None
    """This job's own dwell and margins (None: the daemon's, or the what-if's, defaults)."""

    @field_validator("run")
    @classmethod
    def _run(cls, value: str | None) -> str | None:
        """The command is split like a shell would (no shell runs it): unbalanced quotes fail here."""
        if value is not None:
            try:
                words = shlex.split(value)
            except ValueError as exc:
                raise ValueError(f"not a command line ({exc}); check the quotes") from None
            if not words:
                raise ValueError("must name a command, e.g. python train.py")
        return value

    @field_validator("throughput")
    @classmethod
    def _throughput_keys(cls, value: Throughputs) -> Throughputs:
        return {gpu_key(k): v for k, v in value.items()}

    @field_validator("deadline", mode="before")
    @classmethod
    def _not_a_number(cls, value: Any) -> Any:
        """A bare number would be read as seconds since 1970 (12345: a deadline in 1970): refuse it."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise ValueError(
                f"{value!r} is a bare number; write a duration with its unit (72h, 3d, 90m) or an "
                "ISO 8601 time (2025-06-01T12:00Z)"
            )
        return value

    @field_validator("deadline")
    @classmethod
    def _deadline(cls, value: str | datetime | None) -> str | datetime | None:
        if isinstance(value, datetime):
            return _bounded(value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC))
        if value is None:
            return value
        if _DURATION.match(value.strip()):
            try:
                parse_duration(value, "deadline")  # at most 100 years
            except InputError as exc:
                raise ValueError(str(exc).removeprefix("deadline: ")) from None
            return value
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(
                f"{value!r} is neither a duration (72h, 3d, 90m) nor an ISO 8601 time (2025-06-01T12:00Z)"
            ) from None
        return _bounded(parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC))

    @property
    def store_name(self) -> str:
        return self.workload or self.name

    @property
    def gpu_range(self) -> tuple[int, int]:
        if isinstance(self.gpus, int):
            return self.gpus, self.gpus
        return self.gpus.min, self.gpus.max

    @property
    def checkpoint_seconds(self) -> float:
        """Time to write one checkpoint: given, or ``checkpoint_gb`` at ``CHECKPOINT_GB_PER_S``."""
        if self.checkpoint_s is not None:
            return self.checkpoint_s
        return self.checkpoint_gb / CHECKPOINT_GB_PER_S

    @property
    def checkpoint_every_s(self) -> float | None:
        """Seconds between the checkpoints the job's agent writes (``checkpoint.every``; None:
        not given, the planning model's Young/Daly interval within a period)."""
        if self.checkpoint is None or self.checkpoint.every is None:
            return None
        return parse_duration(self.checkpoint.every, "checkpoint.every").total_seconds()

    def deadline_hours(self, start: datetime) -> float | None:
        """Hours from ``start`` to the deadline (None: no deadline; may be <= 0 if already past)."""
        if self.deadline is None:
            return None
        if isinstance(self.deadline, datetime):
            return (self.deadline - start).total_seconds() / 3600
        match = _DURATION.match(self.deadline.strip())
        assert match is not None  # validated above
        return timedelta(seconds=float(match.group(1)) * _UNIT_S[match.group(2)]).total_seconds() / 3600


class JobSpec(_Strict):
    jobs: Annotated[list[Job], Field(min_length=1)]

    @model_validator(mode="after")
    def _unique(self) -> JobSpec:
        seen: set[str] = set()
        for job in self.jobs:
            if job.name in seen:
                raise ValueError(f"job name {job.name!r} appears twice; names must be unique")
            seen.add(job.name)
        return self


_MESSAGES = {
    "greater_than": "must be > {gt:g}",
    "greater_than_equal": "must be >= {ge:g}",
    "less_than_equal": "must be <= {le:g}",
    "finite_number": "must be a finite number",
    "missing": "is required",
    "too_short": "must not be empty",
}


def _path(loc: tuple[int | str, ...], data: Any) -> list[str]:
    """The parts of ``loc`` that exist in the user's data (pydantic adds union-branch labels)."""
    parts: list[str] = []
    node = data
    for item in loc:
        if isinstance(node, list) and isinstance(item, int) and item < len(node):
            node = node[item]
            label = f"[{item}]"
            if isinstance(node, dict) and isinstance(node.get("name"), str) and parts == ["jobs"]:
                label += f" ({shown(node['name'])})"  # a name cannot break or reverse the line
            parts[-1] += label
        elif isinstance(node, dict) and item in node:
            node = node[item]
            parts.append(str(item))
        elif not parts or (isinstance(node, dict) and item not in node and _is_field(item)):
            parts.append(str(item))  # a missing or unknown field: still the user's word
            node = None
    return parts


def _is_field(item: int | str) -> bool:
    return isinstance(item, str) and item.isidentifier() and item.islower()


def _message(err: Any, where: list[str]) -> str:
    kind = err["type"]
    if kind in _MESSAGES:
        return _MESSAGES[kind].format(**err.get("ctx", {}))
    if kind == "extra_forbidden":
        owner = _FIELDS.get(where[-2].split("[")[0] if len(where) > 1 else "", [])
        close = difflib.get_close_matches(where[-1], owner, n=1)
        return (
            "unknown field"
            + (f"; did you mean {close[0]!r}?" if close else "")
            + (f" (valid: {', '.join(owner)})" if owner else "")
        )
    return str(err["msg"]).removeprefix("Value error, ")


_FIELDS = {
    "jobs": list(Job.model_fields),
    "work": list(Work.model_fields),
    "gpus": list(GpuRange.model_fields),
    "dataset": list(Dataset.model_fields),
    "allow": list(Allow.model_fields),
    "scaling": list(Scaling.model_fields),
    "checkpoint": list(Checkpoint.model_fields),
    "memory": list(Memory.model_fields),
    "": list(JobSpec.model_fields),
}


def parse_jobs(data: Any, source: str = "jobs") -> JobSpec:
    """Validate parsed YAML/JSON; every problem is reported, each as ``<where>: <what>``.

    Where a field accepts several forms (``gpus: 2`` or ``gpus: {min, max}``), pydantic reports
    a failure per form; the "wrong type" ones are dropped when a more specific error exists.
    """
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a mapping with a 'jobs' list at the top level")
    _refuse_nul(data, source)
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        found = [(_path(err["loc"], data), err) for err in exc.errors()]
        specific = {".".join(w) for w, err in found if not err["type"].endswith("_type")}
        lines: list[str] = []
        for where, err in found:
            key = ".".join(where)
            if err["type"].endswith("_type") and any(s == key or s.startswith(key + ".") for s in specific):
                continue
            line = f"{key or source}: {_message(err, where)}"
            if line not in lines:
                lines.append(line)
        raise InputError(f"{source}: invalid job spec:\n  " + "\n  ".join(lines)) from None


def _refuse_nul(node: Any, source: str, path: str = "") -> None:
    """Every text of the spec (keys, names, the ``run`` command, URIs) without NUL: YAML's
    ``"\\0"`` escape makes one, which PostgreSQL cannot store (``spotopt.files.check_text``).
    ``path`` is where ``node`` is, as validation errors name it (``jobs[0] (resnet).run``)."""
    if isinstance(node, str):
        check_text(node, f"{source}: {path}" if path else source)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            name = item.get("name") if isinstance(item, dict) and path == "jobs" else None
            label = f" ({name})" if isinstance(name, str) and "\x00" not in name else ""
            _refuse_nul(item, source, f"{path}[{i}]{label}")
    elif isinstance(node, dict):
        for key, value in node.items():
            inner = f"{path}.{key}" if path else str(key)
            _refuse_nul(key, source, inner)
            _refuse_nul(value, source, inner)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """``line 3, column 5: <what is wrong>`` without PyYAML's ``in "<unicode string>"`` (the
    caller names the file)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    detail = f"{problem} ({context})" if context else problem
    return f"line {mark.line + 1}, column {mark.column + 1}: {detail}" if mark is not None else detail


def load_jobs(path: str | Path) -> JobSpec:
    """Read and validate a YAML job spec file."""
    path = Path(path)
    return parse_jobs(read_yaml(read_text(path, "the job spec"), str(path)), str(path))


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping: YAML requires keys to be
    unique, and PyYAML would keep the last value silently (a second ``budget_usd`` overriding
    the first). Keys merged in with ``<<`` may still be overridden, as YAML defines."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                earlier = first.setdefault(key, key_node)
            except TypeError:  # an unhashable key: the base class says so
                continue
            if earlier is not key_node:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"{key!r} appears twice in one mapping (first on line {earlier.start_mark.line + 1}); "
                    "keep one",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


def read_yaml(text: str, source: str) -> Any:
    """``text`` parsed as YAML; an ``InputError`` naming ``source`` when it is not YAML (a key
    given twice included) or nests deeper than the parser's recursion allows (a thousand
    ``[``: no job spec nests like that)."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as exc:
        raise InputError(f"{source}: not valid YAML: {yaml_problem(exc)}") from None
    except RecursionError:
        raise InputError(f"{source}: nested too deeply to be a job spec; check its brackets") from None
