"""Sidecar evaluation of a `model.fit` script, as tf.keras 2's `SidecarEvaluator` did it
(Keras 3 has none), for a job whose config gives it an evaluator replica
(`trainingInput.evaluatorCount`, Vertex AI's fourth worker pool, an `evaluator` job in
TF_CONFIG's cluster).

The chief publishes; the evaluator follows. Both run the same script with the same
arguments, and both find the folder of the epochs from them (`epochs_url`):
AIP_CHECKPOINT_DIR when the engine sets it, else the script's `--job-dir`, and in it
`fit-epochs/`.

- **The chief** (`Publisher`, added to the callbacks of its `fit` under
  ParameterServerStrategy or MultiWorkerMirroredStrategy when the job has an evaluator):
  at each epoch's end, after the script's own callbacks, it writes the model's weights
  (`epoch-NNNNN.npz`, the arrays of `model.get_weights()`, shards concatenated) and then
  `latest.json` naming them, with the epoch, the optimizer's step count and the job's
  id; each is written whole (a rename, or one object put), the index last, so what it
  names is complete. The two newest weight files are kept. When training ends (the last
  epoch, or `EarlyStopping`), `latest.json` says `final`.
- **The evaluator** (`follow`, what the script's `model.fit(...)` does there): it does
  not train. It builds the model as the script does, takes the call's validation data
  (`validation_data`, or the `validation_split` of arrays as Keras splits them), and
  evaluates each newly published epoch with Keras's own `model.evaluate` (the newest
  one when several were published meanwhile, as the SidecarEvaluator did). Each
  evaluation prints one line and, when the script has a `TensorBoard` callback, is
  written in the run `evaluator` beside its `train` and `validation` runs (`_EvalWriter`:
  the tags Keras's TensorBoard writes; the chief's own validation stays in
  `validation`), and in the job's summaries as mljob's trainer writes them and the
  console draws them (`<job-dir>/summaries/eval/`, `metrics/<metric>` by the chief's
  step). Once the
  final epoch is evaluated the replica ends with status 0: `fit` does not return there,
  so what the script does after `fit` (saving, exporting, writing its History) stays
  the chief's alone. SIGTERM, SIGINT or the launcher's death end it early, also with
  status 0, after one last look at the newest epoch (as mljob's evaluator does).
  No validation data: one line saying so, status 0.

The chief's own validation is unchanged: tf.keras 2's `fit` (tf_keras/engine/training.py)
validates `validation_data` whether or not a SidecarEvaluator runs beside it, and the
callbacks watching `val_` logs (EarlyStopping, ReduceLROnPlateau, a best-only
ModelCheckpoint) need them on the chief.
"""
from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Mapping, Sequence

import keras
import numpy as np

from mljob import contracts, storage
from mljob.errors import EXIT_OK, first_line
from mljob.fitting.errors import FitRefused
from mljob.training.signals import StopSignal

FOLDER = "fit-epochs"
INDEX = "latest.json"
KEEP = 2                 # weight files kept: the newest and the one before
POLL_SECONDS = 0.5
RUN = "evaluator"        # the TensorBoard run under the script's TensorBoard log_dir


def epochs_url(environ: Mapping[str, str], args: Sequence[str]) -> str | None:
    """Where the chief publishes its epochs: AIP_CHECKPOINT_DIR, else the script's
    `--job-dir` (or `--job_dir`), then `fit-epochs/`; None when there is neither."""
    base = environ.get(contracts.AIP_CHECKPOINT_DIR) or _job_dir(args)
    return storage.join(base, FOLDER) if base else None


def summaries_url(environ: Mapping[str, str], args: Sequence[str]) -> str | None:
    """The job's summaries, as mljob's trainer writes them and the console reads them
    (`<job-dir>/summaries`, or AIP_TENSORBOARD_LOG_DIR); None without a job dir."""
    from mljob.training.outputs import resolve_outputs
    job_dir = _job_dir(args)
    if job_dir is None and not any(environ.get(name) for name in (
            contracts.AIP_MODEL_DIR, contracts.AIP_TENSORBOARD_LOG_DIR)):
        return None
    return resolve_outputs(job_dir, environ).summary_url


def _job_dir(args: Sequence[str]) -> str | None:
    found = None
    for i, arg in enumerate(args):
        for flag in ("--job-dir", "--job_dir"):
            if arg == flag and i + 1 < len(args):
                found = args[i + 1]
            elif arg.startswith(flag + "="):
                found = arg[len(flag) + 1:]
    return found or None


def _job_id(environ: Mapping[str, str]) -> str:
    return environ.get(contracts.JOB_ID_ENV) or environ.get(contracts.MLJOB_JOB_ID_ENV) or ""


class Publisher(keras.callbacks.Callback):
    """The chief's side (module doc): each epoch's weights, then the index naming them."""

    def __init__(self, url: str, environ: Mapping[str, str] = os.environ):
        super().__init__()
        self.url, self.job = url, _job_id(environ)
        self.epoch: int | None = None
        self.iterations = 0
        self.files: list[str] = []

    def on_train_begin(self, logs=None):
        self.epoch = None
        self._index(final=False)

    def on_epoch_end(self, epoch, logs=None):
        from mljob.training.strategies import weights_numpy
        arrays = weights_numpy(self.model)
        buffer = io.BytesIO()
        np.savez(buffer, *arrays)
        name = f"epoch-{epoch + 1:05d}.npz"
        storage.write_bytes(storage.join(self.url, name), buffer.getvalue())
        self.epoch, self.iterations = epoch + 1, _iterations(self.model)
        self.files = [f for f in self.files if f != name] + [name]
        self._index(final=False)
        for old in self.files[:-KEEP]:
            _remove(storage.join(self.url, old))
        self.files = self.files[-KEEP:]

    def on_train_end(self, logs=None):
        self._index(final=True)

    def _index(self, *, final: bool) -> None:
        entry = {"job": self.job, "epoch": self.epoch, "iterations": self.iterations,
                 "epochs": (self.params or {}).get("epochs"), "final": final,
                 "weights": f"epoch-{self.epoch:05d}.npz" if self.epoch else None}
        storage.write_bytes(storage.join(self.url, INDEX),
                            json.dumps(entry, sort_keys=True).encode())


def _iterations(model) -> int:
    optimizer = getattr(model, "optimizer", None)
    try:
        return int(np.asarray(optimizer.iterations)) if optimizer is not None else 0
    except (TypeError, ValueError, AttributeError):
        return 0


def _remove(url: str) -> None:
    fs, path = storage.filesystem(url)
    try:
        fs.rm(path)
    except (OSError, FileNotFoundError):
        pass  # gone already: nothing to prune


def read_index(url: str, job: str) -> dict | None:
    """The chief's latest.json for this job, or None (not yet written, another job's,
    or unreadable in passing)."""
    try:
        entry = json.loads(storage.read_bytes(storage.join(url, INDEX), limit=1 << 16))
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or (job and entry.get("job") not in (job, "")):
        return None
    return entry


def follow(model, url: str | None, arguments: dict, *, summaries: str | None = None,
           say=None, environ: Mapping[str, str] = os.environ,
           poll_seconds: float = POLL_SECONDS, stop: StopSignal | None = None) -> int:
    """The evaluator's `fit` (module doc); returns the exit status the replica ends
    with (the caller raises SystemExit with it)."""
    say = say or _say
    data = validation_data(arguments)
    if data is None:
        say("evaluator: model.fit was given no validation_data (nor validation_split), so "
            "there is nothing to evaluate; this replica ends here (give fit "
            "validation_data to have the evaluator evaluate each epoch)")
        return EXIT_OK
    if url is None:
        raise FitRefused(
            "the evaluator follows the chief's epochs through the job dir, and this job "
            "has none: give the job --job-dir (or run it where AIP_CHECKPOINT_DIR is set)")
    if not model.built:
        from mljob.training.losses import unpack
        features, _, _ = unpack(next(iter(data.take(1))))
        model(features)
    writers = [_EvalWriter(os.path.join(str(cb.log_dir), RUN))
               for cb in _flat(arguments.get("callbacks"))
               if isinstance(cb, keras.callbacks.TensorBoard)]
    from mljob.training.summaries import SummaryWriters
    job_summaries = SummaryWriters(summaries, enabled=True, jobs=("eval",)) \
        if summaries else None
    stop = stop or StopSignal(environ).install()
    job = _job_id(environ)
    say(f"evaluator: following the chief's epochs in {url}")
    last: int | None = None

    def look(entry: dict) -> bool:
        nonlocal last
        epoch = entry.get("epoch")
        if not isinstance(epoch, int) or epoch == last:
            return False
        try:
            arrays = _load(storage.join(url, str(entry.get("weights"))))
        except (OSError, ValueError) as exc:  # pruned under us: a newer one is named
            say(f"evaluator: epoch {epoch}'s weights cannot be read "
                f"({first_line(exc, 200)}); waiting for the next")
            return False
        _set(model, arrays, int(entry.get("iterations") or 0))
        logs = model.evaluate(data, verbose=0, return_dict=True)
        logs = {k: float(v) for k, v in logs.items() if np.ndim(v) == 0}
        step = int(entry.get("iterations") or 0)
        for writer in writers:
            writer.write(epoch, step, logs)
        if job_summaries is not None:  # the console's curves: run `eval`, by step
            job_summaries.eval(step, **logs)
            job_summaries.sync()
        total = entry.get("epochs")
        values = " ".join(f"val_{k}={v:.6g}" for k, v in logs.items())
        say(f"evaluator: epoch {epoch}{'' if total is None else f'/{total}'} (step "
            f"{entry.get('iterations')}): {values}")
        last = epoch
        return True

    try:
        return _follow_loop(url, job, look, stop, poll_seconds, say, lambda: last)
    finally:
        if job_summaries is not None:
            job_summaries.close()


def _follow_loop(url, job, look, stop, poll_seconds, say, last) -> int:
    """Look at the index until the chief's last epoch is evaluated, or a stop."""
    while True:
        entry = read_index(url, job)
        if entry is not None:
            look(entry)
            if entry.get("final") and (entry.get("epoch") is None or
                                       entry.get("epoch") == last()):
                say(f"evaluator finished: the chief's last epoch "
                    f"({'none' if last() is None else last()}) evaluated")
                return EXIT_OK
        if stop.wait(poll_seconds):
            entry = read_index(url, job)  # one last look, as mljob's evaluator takes
            if entry is not None:
                look(entry)
            if last() is None:
                say(f"evaluator stopping: {stop.reason()}; nothing evaluated: the chief "
                    f"published no epoch in {url}")
            else:
                say(f"evaluator stopping: {stop.reason()}; last evaluated epoch {last()}")
            return EXIT_OK


class _EvalWriter:
    """The evaluations as Keras's TensorBoard callback writes a validation run, in a run
    of their own: `epoch_<metric>` at the epoch's index (fit's validation scalars, so
    TensorBoard draws the evaluator's curve over the chief's `validation` one) and
    `evaluation_<metric>_vs_iterations` at the chief's step (what Keras's TensorBoard
    writes for an `evaluate`); flushed after each."""

    def __init__(self, folder: str):
        import tensorflow as tf
        self.tf, self.writer = tf, tf.summary.create_file_writer(folder)

    def write(self, epoch: int, step: int, logs: dict[str, float]) -> None:
        with self.writer.as_default():
            for name, value in logs.items():
                self.tf.summary.scalar(f"epoch_{name}", value, step=epoch - 1)
                self.tf.summary.scalar(f"evaluation_{name}_vs_iterations", value,
                                       step=step)
        self.writer.flush()


def _say(text: str) -> None:
    print(text, file=sys.stdout, flush=True)


def _flat(callbacks) -> list:
    if isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = callbacks.callbacks
    return list(keras.tree.flatten(callbacks)) if callbacks else []


def _load(url: str) -> list[np.ndarray]:
    with np.load(io.BytesIO(storage.read_bytes(url)), allow_pickle=False) as found:
        return [found[f"arr_{i}"] for i in range(len(found.files))]


def _set(model, arrays: list[np.ndarray], iterations: int) -> None:
    """The chief's epoch weights into this replica's model (and its step count, the step
    TensorBoard writes the evaluation at)."""
    mine = model.get_weights()
    if [np.shape(a) for a in mine] != [np.shape(b) for b in arrays]:
        raise FitRefused(
            f"the chief's epoch weights ({len(arrays)} arrays) do not fit the evaluator's "
            f"model ({len(mine)}): the script must build the same model on every replica")
    model.set_weights(arrays)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        optimizer.iterations.assign(iterations)


def validation_data(arguments: dict):
    """The call's validation data as a finite dataset (as `fit` would evaluate it), or
    None."""
    from mljob.fitting import ps_inputs
    batch = arguments.get("validation_batch_size") or arguments.get("batch_size")
    data = arguments.get("validation_data")
    split = arguments.get("validation_split") or 0.0
    if data is None and split and arguments.get("x") is not None:
        from mljob.training.keras_private import train_validation_split
        x, y, w = arguments.get("x"), arguments.get("y"), arguments.get("sample_weight")
        _, held = train_validation_split((x, y, w), validation_split=split)
        data = tuple(v for v in held if v is not None)
    if data is None:
        return None
    return ps_inputs.validation(data, arguments.get("validation_steps"), batch)


__all__ = ["FOLDER", "INDEX", "epochs_url", "summaries_url", "Publisher", "read_index", "follow",
           "validation_data"]
