"""A job's training curves, read from its own TensorBoard summaries with TensorBoard's
reader: every scalar of `<job-dir>/summaries/<run>/` (the trainer writes `train/` and
`eval/`) by step, for the job page's charts (`metrics/loss` first, then each metric,
each run a line on the same axes).

The reader is TensorBoard's `EventFileLoader` in its TensorFlow-free form (the one
TensorBoard itself uses where TensorFlow is not installed), so the console never loads
TensorFlow; it reads local paths and any fsspec URL (`gs://`). Each event file keeps its
loader between polls, which goes on from where it stopped: a running job's files are read
once, a little at each poll, and a record the trainer has half written is read at the
next poll. A step written twice (a resumed job) keeps its last value.
"""
from __future__ import annotations

import collections
import math
import sys
import threading
import types
from collections.abc import Mapping
from typing import Any

from mljob import storage

METRICS = "metrics/"
MAX_JOBS = 32        # jobs whose loaders are kept between polls
MAX_FILES = 64       # event files read per run (a job restarted that often shows its last)
Series = dict[str, dict[str, dict[int, float]]]  # tag -> run -> step -> value


def _reader():
    """TensorBoard's event file loader, TensorFlow-free unless TensorFlow is already
    loaded here (tensorboard.compat picks the stub when `tensorboard.compat.notf`
    imports)."""
    if "tensorflow" not in sys.modules:
        sys.modules.setdefault("tensorboard.compat.notf",
                               types.ModuleType("tensorboard.compat.notf"))
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.util import tensor_util
    return event_file_loader, tensor_util


class MissingReader(Exception):
    """The `tensorboard` package is not installed."""


class JobCurves:
    """The scalars of one job dir's summaries, read on as its files grow."""

    def __init__(self, job_dir: str):
        self.root = storage.join(job_dir, "summaries")
        self.loaders: dict[str, Any] = {}  # event file -> its loader
        self.values: Series = {}
        self.lock = threading.Lock()

    def read(self) -> Series:
        """Every scalar so far (new events read since the last call)."""
        try:
            loader_mod, tensor_util = _reader()
        except ImportError as exc:
            raise MissingReader("the curves need TensorBoard's reader: pip install "
                                "tensorboard (the tuning extra installs it)") from exc
        with self.lock:
            for run, path in self._files():
                loader = self.loaders.get(path)
                if loader is None:
                    try:
                        loader = self.loaders[path] = loader_mod.EventFileLoader(path)
                    except Exception:  # gone between listing and opening
                        continue
                for event in _events(loader):
                    if not event.HasField("summary"):
                        continue
                    for value in event.summary.value:
                        number = _scalar(value, tensor_util)
                        if number is not None:
                            self.values.setdefault(value.tag, {}).setdefault(
                                run, {})[int(event.step)] = number
            return {tag: {run: dict(points) for run, points in runs.items()}
                    for tag, runs in self.values.items()}

    def _files(self) -> list[tuple[str, str]]:
        fs, root = storage.filesystem(self.root)
        local = storage.is_local(self.root)
        try:
            runs = sorted(p for p in fs.ls(root, detail=False) if fs.isdir(p))
        except (FileNotFoundError, NotADirectoryError):
            return []
        found = []
        for run_path in runs:
            run = run_path.rstrip("/").rsplit("/", 1)[-1]
            try:
                names = sorted(p for p in fs.ls(run_path, detail=False)
                               if "tfevents" in p.rsplit("/", 1)[-1])
            except FileNotFoundError:
                continue
            found += [(run, p if local else fs.unstrip_protocol(p))
                      for p in names[-MAX_FILES:]]
        return found


def _events(loader):
    try:
        yield from loader.Load()
    except Exception:  # a damaged record: what came before it stands
        return


def _scalar(value, tensor_util) -> float | None:
    """A summary value's number when it is a scalar (TF2 writes scalars as rank-0
    tensors; the loader turns TF1's simple_value into one); None for histograms, text
    and images."""
    if not value.HasField("tensor"):
        return None
    tensor = value.tensor
    if tensor.tensor_shape.dim or tensor.dtype not in _NUMERIC:
        return None
    try:
        number = float(tensor_util.make_ndarray(tensor).item())
    except (ValueError, TypeError):
        return None
    return number if math.isfinite(number) else None


_NUMERIC = {1, 2, 3, 4, 5, 6, 9, 19}  # DT_FLOAT, DOUBLE, INT32, UINT8, INT16, INT8, INT64, HALF

_cache: collections.OrderedDict[tuple[str, str], JobCurves] = collections.OrderedDict()
_cache_lock = threading.Lock()


def of_job(job_id: str, job_dir: str | None) -> Series:
    """The job's scalars (its loaders kept for the next poll); {} without a job dir."""
    if not job_dir:
        return {}
    key = (job_id, job_dir)
    with _cache_lock:
        curves = _cache.pop(key, None) or JobCurves(job_dir)
        _cache[key] = curves
        while len(_cache) > MAX_JOBS:
            _cache.popitem(last=False)
    return curves.read()


def shown(series: Mapping[str, object]) -> list[str]:
    """The tags the page charts: the `metrics/` ones, loss first (every scalar when a
    trainer of its own writes none there)."""
    tags = [t for t in series if t.startswith(METRICS)] or list(series)
    return sorted(tags, key=lambda t: (t.rsplit("/", 1)[-1] != "loss", t))
