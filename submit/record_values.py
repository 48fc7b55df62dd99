"""The values of a stored job record, checked after its types (`jobs.check_record`): a
record is data, hand-edited or foreign, and every command and the console format its
times, counts and trials without looking again.

Times are finite seconds since 1970 up to 9999-12-31 (what a date can print); PIDs,
counts and restarts whole and not negative; exit statuses whole; a tuning job's trials
have ASCII-digit ids, parameters that are a mapping of names to text, numbers or
booleans, and metrics whose objective is a finite number; a replica's usage summary is
finite numbers. Each failure is a ValueError naming the field, which the readers turn
into the one warning `jobs list` prints (the record skipped) or a one-line refusal.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from mljob.errors import ascii_digits

MAX_TIME = 253402300799.0  # 9999-12-31T23:59:59Z
MAX_ID_DIGITS = 18
USAGE_FIELDS = ("cpuPeak", "cpuMean", "memoryPeakMiB", "memoryMeanMiB", "samples")


def _show(value: Any) -> str:
    try:
        return json.dumps(value)[:40]
    except (TypeError, ValueError):
        return type(value).__name__


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


def _whole(value: Any, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _id(value: Any) -> bool:
    """A trial id or step: ASCII digits, or a whole number, not negative."""
    if isinstance(value, str):
        return ascii_digits(value) and len(value) <= MAX_ID_DIGITS
    return _whole(value) and value < 10 ** MAX_ID_DIGITS


def _fail(where: str, value: Any, why: str) -> None:
    raise ValueError(f"its {where} {_show(value)} {why}")


def check_values(data: Mapping[str, Any]) -> None:
    """ValueError naming the first value of a type-checked record that is out of range."""
    for key in ("create_time", "start_time", "end_time", "supervisor_create_time"):
        value = data.get(key)
        if value is not None and not (_number(value) and 0 <= value <= MAX_TIME):
            _fail(key, value, "is not a time (seconds since 1970, finite, up to 9999)")
    pid = data.get("supervisor_pid")
    if pid is not None and not _whole(pid):
        _fail("supervisor_pid", pid, "is not a process id")
    if not all(isinstance(a, str) for a in data.get("trainer_args", [])):
        raise ValueError("its trainer_args are not all text")
    for replica in data.get("replicas", []):
        _replica(replica)
    usage = data.get("usage", {})
    for label, summary in usage.items():
        if not isinstance(summary, dict) or not all(
                _number(summary.get(k)) for k in USAGE_FIELDS):
            _fail(f"usage of {label[:40]!r}", summary, "is not a usage summary "
                  f"({', '.join(USAGE_FIELDS)} as numbers)")
    hyper = data.get("training_input", {}).get("hyperparameters", {})
    if not isinstance(hyper, dict) or not isinstance(hyper.get("params", []), list):
        _fail("trainingInput.hyperparameters", hyper, "is not a mapping with a list of "
              "params")
    for trial in data.get("training_output", {}).get("trials", []):
        _trial(trial)


def _replica(replica: dict) -> None:
    label = replica["label"][:40]
    for key, low in (("pid", 0), ("restarts", 0), ("exit_code", -(2 ** 31))):
        value = replica.get(key)
        if value is not None and not _whole(value, low):
            _fail(f"replica {label!r} {key}", value, "is not a whole number in range")
    codes = replica.get("exit_codes", [])
    if not isinstance(codes, list) or not all(_whole(c, -(2 ** 31)) for c in codes):
        _fail(f"replica {label!r} exit_codes", codes, "are not exit statuses")
    if not isinstance(replica.get("state", ""), str):
        _fail(f"replica {label!r} state", replica.get("state"), "is not text")


def _trial(trial: dict) -> None:
    trial_id = trial.get("trialId")
    if not _id(trial_id):
        _fail("trial id", trial_id, "is not a trial number (ASCII digits)")
    where = f"trial {trial_id}"
    for name, value in trial.get("hyperparameters", {}).items():
        if not isinstance(name, str) or not (
                isinstance(value, (str, bool)) or _number(value)):
            _fail(f"{where} hyperparameter {str(name)[:40]!r}", value,
                  "is not text, a finite number or a boolean")
    metrics = trial.get("allMetrics", [])
    if not isinstance(metrics, list):
        _fail(f"{where} allMetrics", metrics, "is not a list")
    for metric in [trial.get("finalMetric") or {}, *metrics]:
        if not isinstance(metric, dict):
            _fail(f"{where} metric", metric, "is not an object")
        value = metric.get("objectiveValue")
        if value is not None and not _number(value):
            _fail(f"{where} objectiveValue", value, "is not a finite number")
        step = metric.get("trainingStep")
        if step is not None and not _id(step):
            _fail(f"{where} trainingStep", step, "is not a step number")
    if not isinstance(trial.get("isTrialStoppedEarly", False), bool):
        _fail(f"{where} isTrialStoppedEarly", trial["isTrialStoppedEarly"],
              "is not true or false")
