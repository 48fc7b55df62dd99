"""Hyperparameter tuning metrics, in the cloudml-hypertune library's file format.

A trial reports its metric as Cloud ML's `cloudml-hypertune` library does: JSON lines
`{"global_step": "1000", "<tag>": "0.987", "timestamp": 1525851440.12, "trial": "3"}` in
`$CLOUD_ML_HP_METRIC_FILE` (default `/tmp/hypertune/output.metrics`), the last 100
reports kept (or, as Cloud ML also read them, as TensorBoard summaries under its job
dir whose tag is the metric tag: `read_summaries`). `HyperTune` writes that file with the
library's API (so a trainer written for the library runs unchanged without it),
atomically (rename) where the library rewrites it in place; `read_reports` is the
tuner's side and tolerates both, including a half-written last line of the library's.

`report_evaluation` is what the training library calls after each evaluation: it reports
only inside a tuning trial (when the launcher set the variables), every metric and the
loss under their own names, and the job's metric tag only when it names one of them
(or Keras's `val_` name of one): a tag nothing measures is never filled in with another
number, so the tuner fails that trial naming the tags it did report (`reported_tags`).
"""
from __future__ import annotations

import collections
import importlib
import json
import math
import os
import tempfile
import time
from collections.abc import Mapping
from typing import NamedTuple

from mljob.contracts import (DEFAULT_HP_METRIC_FILE, DEFAULT_HP_METRIC_TAG,
                             HP_METRIC_FILE_ENV, HP_METRIC_TAG_ENV, TRIAL_ID_ENV)

MAX_REPORTS = 100  # the library keeps this many; a trial reports once an evaluation
ACCURACY_TAG, LOSS_TAG = "accuracy", "loss"


class Report(NamedTuple):
    step: int
    value: float
    timestamp: float


class HyperTune:
    """cloudml-hypertune's `hypertune.HyperTune`, with the same method and file."""

    def __init__(self, environ: Mapping[str, str] | None = None):
        environ = os.environ if environ is None else environ
        self.metric_path = environ.get(HP_METRIC_FILE_ENV) or DEFAULT_HP_METRIC_FILE
        self.trial_id = environ.get(TRIAL_ID_ENV, "0")
        self.reports: collections.deque = collections.deque(maxlen=MAX_REPORTS)

    def report_hyperparameter_tuning_metric(self, hyperparameter_metric_tag: str | None,
                                            metric_value: float, global_step=None,
                                            checkpoint_path: str = "") -> None:
        tag = hyperparameter_metric_tag or DEFAULT_HP_METRIC_TAG
        self.report({tag: metric_value}, global_step, checkpoint_path)

    def report(self, metrics: Mapping[str, float], global_step=None,
               checkpoint_path: str = "") -> None:
        """Several tags in one line (one evaluation's accuracy and loss together)."""
        line = {"timestamp": time.time(), "trial": str(self.trial_id),
                "global_step": str(int(global_step) if global_step else 0),
                "checkpoint_path": checkpoint_path}
        line.update({tag: str(float(value)) for tag, value in metrics.items()})
        self.reports.append(line)
        self._write()

    def _write(self) -> None:
        folder = os.path.dirname(os.path.abspath(self.metric_path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".metrics-", dir=folder)
        try:
            with os.fdopen(fd, "w") as f:
                for line in self.reports:
                    f.write(json.dumps(line, sort_keys=True) + "\n")
            os.replace(tmp, self.metric_path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise


_trial_writer: HyperTune | None = None


def in_trial(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return bool(environ.get(HP_METRIC_FILE_ENV) or environ.get(TRIAL_ID_ENV))


def report_evaluation(step: int, *, loss: float, metrics: Mapping[str, float],
                      environ: Mapping[str, str] | None = None) -> bool:
    """Inside a tuning trial, report one evaluation; False (nothing written) outside.

    `loss` and every metric are reported under their own names; the job's tag
    (CLOUD_ML_HP_METRIC_TAG) gets the metric it names: `accuracy`, `loss`, or Keras's
    validation names `val_accuracy`, `val_loss` (an evaluation is on held-out data). A
    job that set no tag (Cloud ML's default `training/hptuning/metric`) gets the first
    metric under it. Any other tag is not reported: the tuner then fails the trial."""
    global _trial_writer
    environ = os.environ if environ is None else environ
    if not in_trial(environ):
        return False
    if _trial_writer is None or environ is not os.environ:
        _trial_writer = HyperTune(environ)
    tag = environ.get(HP_METRIC_TAG_ENV) or DEFAULT_HP_METRIC_TAG
    values = {LOSS_TAG: loss, **metrics}
    named = tag[len("val_"):] if tag.startswith("val_") else tag
    if named in values:
        values[tag] = values[named]
    elif tag == DEFAULT_HP_METRIC_TAG:
        values[tag] = next(iter(metrics.values()), loss)
    _trial_writer.report(values, step)
    return True


REPORT_FIELDS = {"timestamp", "trial", "global_step", "checkpoint_path"}


def reported_tags(path: str) -> list[str]:
    """The metric tags a metrics file holds reports of, sorted; [] without the file."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except (FileNotFoundError, IsADirectoryError):
        return []
    tags: set[str] = set()
    for raw in text.splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict):
            tags.update(str(k) for k in line if k not in REPORT_FIELDS)
    return sorted(tags)


def read_summaries(folder: str, tag: str) -> list[Report]:
    """Scalars of `tag` in the TensorBoard event files under a local folder, oldest first:
    the other way Cloud ML read a trial's metric. Where several folders hold the tag (a
    trainer's train/ and eval/ summaries), those of a folder named eval win. [] when
    there are none, or TensorBoard (which reads event files without TensorFlow) is not
    installed."""
    try:
        event_file_loader = importlib.import_module(
            "tensorboard.backend.event_processing.event_file_loader")
        tensor_util = importlib.import_module("tensorboard.util.tensor_util")
    except ImportError:
        return []
    found: dict[str, list[Report]] = {}
    for root, _, names in sorted(os.walk(folder)):
        for name in sorted(n for n in names if n.startswith("events.out.tfevents.")):
            try:
                events = list(event_file_loader.EventFileLoader(
                    os.path.join(root, name)).Load())
            except Exception:  # a half-written or foreign file is skipped
                continue
            for event in events:
                for value in event.summary.value:
                    if value.tag != tag:
                        continue
                    number = (float(tensor_util.make_ndarray(value.tensor))
                              if value.HasField("tensor") else float(value.simple_value))
                    if math.isfinite(number):
                        found.setdefault(root, []).append(
                            Report(int(event.step), number, float(event.wall_time)))
    evals = [r for root, reports in found.items()
             if os.path.basename(root) == "eval" for r in reports]
    chosen = evals or [r for reports in found.values() for r in reports]
    return sorted(chosen, key=lambda r: (r.timestamp, r.step))


def read_reports(path: str, tag: str) -> list[Report]:
    """The reports of `tag` in a metrics file, oldest first, each once; [] when the file
    does not exist yet. Lines that are not JSON objects (a half-written line of the
    library's in-place rewrite) and values that are not finite numbers are skipped."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except (FileNotFoundError, IsADirectoryError):
        return []
    seen, reports = set(), []
    for raw in text.splitlines():
        try:
            line = json.loads(raw)
            value = float(line[tag])
            step = int(float(line.get("global_step") or 0))
            stamp = float(line.get("timestamp") or 0.0)
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
            continue
        if not math.isfinite(value) or (stamp, step) in seen:
            continue
        seen.add((stamp, step))
        reports.append(Report(step, value, stamp))
    return sorted(reports, key=lambda r: (r.timestamp, r.step))
