"""`trainingInput.hyperparameters`: Cloud ML's HyperparameterSpec, strictly checked.

The contract is Cloud ML Engine's, field for field: `goal`, `hyperparameterMetricTag`,
`maxTrials`, `maxParallelTrials`, `maxFailedTrials`, `enableTrialEarlyStopping`,
`resumePreviousJobId`, `algorithm` and `params` (each `{parameterName, type, minValue,
maxValue, categoricalValues, discreteValues, scaleType}`). The keys and types are the
schema's (`submit.jobdef.config_schema.HyperparameterSpec`); `parse` checks the rest and turns
the spec into a frozen `TuningSpec`, or raises `ConfigError` naming the field and the
fix. `submit.jobdef.spec.resolve` parses it once into the JobSpec; every runner reads that
value (the local tuner, Vertex AI's HyperparameterTuningJob, Katib).
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mljob.contracts import DEFAULT_HP_METRIC_TAG
from submit.jobdef.vocabulary import PARAM_TYPES as TYPES
from submit.jobdef.vocabulary import SCALES
from submit.errors import ConfigError

if TYPE_CHECKING:
    from submit.jobdef.config_schema import HyperparameterSpec

# Where a tuning job keeps its study: <job-dir>/hptuning/optuna-journal.log
HP_DIR = "hptuning"
JOURNAL = "optuna-journal.log"
MAX_VALUES = 1_000           # categorical or discrete values of one parameter
# GRID_SEARCH's points, counted before any grid is built (Optuna's GridSampler holds the
# whole product as a list: 10^9 points would not fit in memory).
MAX_GRID_POINTS = 100_000
# INTEGER bounds and DISCRETE values: numbers a double holds exactly (Cloud ML sends them
# as doubles), never the 400-digit integers that overflow a float.
MAX_EXACT_INT = 2 ** 53
# A parameter becomes the trainer flag --<parameterName>=<value>.
PARAM_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_\-]{0,63}")
METRIC_TAG = re.compile(r"[A-Za-z0-9_\-./]{1,128}")
JOB_ID = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")
WHERE = "trainingInput.hyperparameters"


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One tuned parameter. `values` holds CATEGORICAL (strings) or DISCRETE (numbers,
    increasing) values; `low`/`high` bound DOUBLE and INTEGER ones."""

    name: str
    type: str
    low: float | None = None
    high: float | None = None
    values: tuple = ()
    scale: str = "UNIT_LINEAR_SCALE"

    @property
    def bounds(self) -> tuple[float, float]:
        """(minValue, maxValue) of a DOUBLE or INTEGER parameter."""
        if self.low is None or self.high is None:
            raise ValueError(f"parameter {self.name} is {self.type}, it has no bounds")
        return self.low, self.high

    def flag(self, value) -> str:
        """`--name=value` as a trial's trainer gets it."""
        return f"--{self.name}={format_value(value)}"


@dataclasses.dataclass(frozen=True)
class TuningSpec:
    """The checked spec; `max_failed_trials` None is Cloud ML's unset (the job fails only
    when every trial failed)."""

    goal: str
    metric_tag: str
    max_trials: int
    max_parallel_trials: int
    max_failed_trials: int | None
    early_stopping: bool
    resume_from: str | None
    algorithm: str
    params: tuple[Parameter, ...]

    @property
    def maximize(self) -> bool:
        return self.goal == "MAXIMIZE"

    def grid(self) -> dict[str, list]:
        """Every parameter's grid points (GRID_SEARCH has no DOUBLE parameters); parse
        has bounded their product by MAX_GRID_POINTS."""
        return {p.name: (list(range(int(p.bounds[0]), int(p.bounds[1]) + 1))
                         if p.type == "INTEGER"
                         else list(p.values)) for p in self.params}

    def grid_size(self) -> int:
        """The grid's point count, computed without building it."""
        return math.prod(_points(p) for p in self.params)


def __getattr__(name: str) -> Any:
    """KEYS and PARAM_KEYS: the schema's keys, read (with pydantic) only when asked for."""
    if name in ("KEYS", "PARAM_KEYS"):
        from submit.jobdef import config_schema
        return config_schema.keys(config_schema.HyperparameterSpec if name == "KEYS"
                                  else config_schema.ParameterSpec)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def from_dict(data: Mapping[str, Any]) -> TuningSpec:
    """A spec from its `dataclasses.asdict` (a plan read back from JSON)."""
    params = tuple(Parameter(**{**p, "values": tuple(p.get("values", ()))})
                   for p in data["params"])
    return TuningSpec(**{**data, "params": params})


def format_value(value) -> str:
    if isinstance(value, float):
        return repr(value)  # round-trips exactly, as a trainer's float() reads it back
    return str(value)


def parse(given: HyperparameterSpec | Mapping[str, Any], *,
          job_dir: str | None = None) -> TuningSpec:
    """The checked spec, or ConfigError naming the field and the fix. The schema
    (`submit.jobdef.config_schema.HyperparameterSpec`) has checked keys and types; this checks
    what holds between fields and values."""
    from submit.jobdef import config_schema  # pydantic: only where a spec is read
    if not isinstance(given, config_schema.HyperparameterSpec):
        given = config_schema.validate(config_schema.HyperparameterSpec, given, WHERE)
    hp = given.to_dict()
    tag = hp.get("hyperparameterMetricTag", DEFAULT_HP_METRIC_TAG)
    if not METRIC_TAG.fullmatch(tag):
        raise ConfigError(f"{WHERE}.hyperparameterMetricTag {tag!r:.60} is not a metric "
                          "tag; use up to 128 letters, digits and _-./ (e.g. accuracy)")
    max_trials, parallel = given.max_trials or 1, given.max_parallel_trials or 1
    if parallel > max_trials:
        raise ConfigError(f"{WHERE}.maxParallelTrials {parallel} is more than maxTrials "
                          f"{max_trials}; lower it to {max_trials} or raise maxTrials")
    resume = given.resume_previous_job_id
    if resume is not None and not JOB_ID.fullmatch(resume):
        raise ConfigError(f"{WHERE}.resumePreviousJobId {resume!r:.60} is not a job id; "
                          "name the earlier tuning job, e.g. tune01")
    algorithm = given.algorithm or "ALGORITHM_UNSPECIFIED"
    raw = hp["params"]
    params = tuple(_param(p, i) for i, p in enumerate(raw))
    names = [p.name.replace("-", "_") for p in params]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(f"{WHERE}.params[{i}].parameterName {params[i].name!r} is "
                              "given twice; tune each parameter once")
    spec = TuningSpec(goal=given.goal, metric_tag=tag, max_trials=max_trials,
                      max_parallel_trials=parallel,
                      max_failed_trials=given.max_failed_trials,
                      early_stopping=bool(given.enable_trial_early_stopping),
                      resume_from=resume, algorithm=algorithm, params=params)
    if algorithm == "GRID_SEARCH":
        doubles = [p.name for p in params if p.type == "DOUBLE"]
        if doubles:
            raise ConfigError(f"{WHERE}: GRID_SEARCH cannot search DOUBLE parameter "
                              f"{doubles[0]!r}; make it DISCRETE with the values to try, "
                              "or use another algorithm")
        size = spec.grid_size()
        if size > MAX_GRID_POINTS:
            raise ConfigError(f"{WHERE}: GRID_SEARCH over {_count_text(size)} points is "
                              f"more than the limit of {MAX_GRID_POINTS}; narrow the "
                              "INTEGER ranges or list fewer values, or use RANDOM_SEARCH")
    if job_dir is None:
        raise ConfigError(f"{WHERE}: hyperparameter tuning needs --job-dir (each trial "
                          "writes to <job-dir>/<trialId>/); give --job-dir or jobDir")
    return spec


def _param(raw: Any, i: int) -> Parameter:
    where = f"{WHERE}.params[{i}]"
    name = raw.get("parameterName")
    if not isinstance(name, str) or not PARAM_NAME.fullmatch(name):
        raise ConfigError(f"{where}.parameterName {name!r:.60} is not a flag name; use "
                          "letters, digits, _ and -, starting with a letter (e.g. "
                          "learning_rate)")
    if name.replace("-", "_") == "job_dir":
        raise ConfigError(f"{where}.parameterName job_dir would replace the trial's own "
                          "--job-dir; tune another parameter")
    where = f"{WHERE}.params[{i}] ({name})"
    kind = raw.get("type")
    if kind not in TYPES:
        raise ConfigError(f"{where}.type must be one of {', '.join(TYPES)}, not "
                          f"{kind!r:.60}")
    allowed = {"DOUBLE": ("minValue", "maxValue", "scaleType"),
               "INTEGER": ("minValue", "maxValue", "scaleType"),
               "CATEGORICAL": ("categoricalValues",),
               "DISCRETE": ("discreteValues",)}[kind]
    extra = [k for k in raw if k not in allowed + ("parameterName", "type")]
    if extra:
        raise ConfigError(f"{where}: {extra[0]} does not apply to a {kind} parameter; "
                          f"give {' and '.join(allowed)}")
    if kind == "CATEGORICAL":
        values = raw.get("categoricalValues")
        if not isinstance(values, list) or not values or \
                not all(isinstance(v, str) and v for v in values):
            raise ConfigError(f"{where}.categoricalValues must be a non-empty list of "
                              "strings, e.g. [cnn, mlp]")
        _values_ok(values, where + ".categoricalValues")
        return Parameter(name, kind, values=tuple(values))
    if kind == "DISCRETE":
        values = raw.get("discreteValues")
        if not isinstance(values, list) or not values or not all(_finite(v) for v in values):
            raise ConfigError(f"{where}.discreteValues must be a non-empty list of "
                              "numbers (finite; integers within ±2^53), e.g. [32, 64, 128]")
        _values_ok(values, where + ".discreteValues")
        if any(b <= a for a, b in zip(values, values[1:], strict=False)):
            raise ConfigError(f"{where}.discreteValues must be in increasing order, each "
                              "once; sort them")
        return Parameter(name, kind, values=tuple(values))
    low, high = raw.get("minValue"), raw.get("maxValue")
    for key, value in (("minValue", low), ("maxValue", high)):
        if not _finite(value) or kind == "INTEGER" and not isinstance(value, int):
            wanted = "an integer within ±2^53" if kind == "INTEGER" else "a finite number"
            raise ConfigError(f"{where}.{key} must be {wanted}, not {_short(value)}")
    assert low is not None and high is not None  # both checked finite above
    if not low < high:
        raise ConfigError(f"{where}: minValue {low} must be less than maxValue {high}")
    scale = raw.get("scaleType", "UNIT_LINEAR_SCALE")
    if scale not in SCALES:
        raise ConfigError(f"{where}.scaleType must be one of {', '.join(SCALES)}, not "
                          f"{scale!r:.60}")
    if scale != "UNIT_LINEAR_SCALE" and low <= 0:
        raise ConfigError(f"{where}: {scale} needs minValue above 0, not {low}; raise "
                          "minValue or use UNIT_LINEAR_SCALE")
    return Parameter(name, kind, low=low, high=high, scale=scale)


def _finite(value) -> bool:
    """A finite number; an integer only up to MAX_EXACT_INT (float(10**400) overflows)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -MAX_EXACT_INT <= value <= MAX_EXACT_INT
    return isinstance(value, float) and math.isfinite(value)


def _points(p: Parameter) -> int:
    if p.type == "INTEGER":
        low, high = p.bounds
        return int(high) - int(low) + 1
    return len(p.values) if p.values else 1


def _count_text(n: int) -> str:
    return f"{n:,}" if n < 10 ** 30 else f"about 10^{int(n.bit_length() * math.log10(2))}"


def _short(value) -> str:
    """A value for a message: an integer of hundreds of digits as its size (its repr
    alone would fail past 4,300 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10 ** 30:
        return f"an integer of {value.bit_length()} bits"
    return f"{value!r:.60}"


def _values_ok(values: list, where: str) -> None:
    if len(values) > MAX_VALUES:
        raise ConfigError(f"{where} has {len(values)} values; the limit is {MAX_VALUES}")
    if len(set(values)) != len(values):
        raise ConfigError(f"{where} repeats a value; give each value once")
