"""What the chief reports: TensorBoard event files and the progress lines on stdout.

Event files go to `<job-dir>/summaries/train` and `<job-dir>/summaries/eval`; with Vertex
AI's AIP_TENSORBOARD_LOG_DIR set, `train/` and `eval/` go under that instead
(RunConfig.summary_url). Tags are grouped by prefix, because TensorBoard's time-series
page makes one group per prefix and opens only the first ones:

| group | tags | in |
|---|---|---|
| `metrics/` | `loss` and each of the model's metrics (`accuracy`) | train and eval (overlaid) |
| `optimizer/` | `learning_rate` | train |
| `speed/` | `steps_per_sec`, `examples_per_sec` | train |
| `weights/` | a histogram per variable, at every checkpoint | train |

TensorFlow writes event files only to local paths here, so for a remote job dir they are
written to a scratch folder and uploaded (`sync`) at every checkpoint and at the end; a
local job dir is written in place.

The progress lines are a contract with the launcher (it parses them): one line per event,
flushed. A carriage-return progress bar is drawn between them only on a terminal.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

import numpy as np
import tensorflow as tf

from mljob import contracts, storage

METRICS, OPTIMIZER, SPEED, WEIGHTS = "metrics", "optimizer", "speed", "weights"
# The loss of a model whose own step's logs have none (a GAN's are `d_loss`, `g_loss`):
# NaN to arithmetic, left out of the lines and the event files (told by identity).
NO_LOSS = float("nan")
# Where the loop's own scalars go; the model's metrics go under METRICS by their names.
GROUPS = {"loss": METRICS, "learning_rate": OPTIMIZER, "steps_per_sec": SPEED,
          "examples_per_sec": SPEED}


class SummaryWriters:
    """The chief's event files; on other replicas (enabled=False) every call is a no-op."""

    def __init__(self, url: str, *, enabled: bool, jobs: tuple = ("train", "eval")):
        self.enabled = enabled
        self.url = url  # the folder holding train/ and eval/ (RunConfig.summary_url)
        self._scratch = None
        if not enabled:
            return
        if storage.is_local(self.url):
            self.dir = storage.local_path(self.url)
        else:
            self._scratch = tempfile.mkdtemp(prefix="mljob-summaries-")
            self.dir = self._scratch
        # The evaluator writes eval only: an empty train event file would be noise.
        self._train, self._eval = (
            tf.summary.create_file_writer(os.path.join(self.dir, job)) if job in jobs
            else None for job in ("train", "eval"))

    def train(self, step: int, **scalars: float) -> None:
        self._scalars(self._train if self.enabled else None, step, scalars)

    def eval(self, step: int, **scalars: float) -> None:
        self._scalars(self._eval if self.enabled else None, step, scalars)

    def histograms(self, step: int, weights: dict[str, np.ndarray]) -> None:
        if not self.enabled or self._train is None:
            return
        with self._train.as_default(step=step):
            for name, value in weights.items():
                tf.summary.histogram(f"{WEIGHTS}/{name}", value)

    def sync(self) -> None:
        """Flush, and upload to a remote job dir (files already there unchanged are
        skipped; event files grow, so they are uploaded again whole)."""
        if not self.enabled:
            return
        for writer in self._writers():
            writer.flush()
        if self._scratch:
            storage.upload_tree(self._scratch, self.url, skip_existing=True)

    def close(self) -> None:
        if not self.enabled:
            return
        self.sync()
        for writer in self._writers():
            writer.close()
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)

    def _writers(self) -> list:
        return [w for w in (self._train, self._eval) if w is not None]

    @staticmethod
    def _scalars(writer, step: int, scalars: dict[str, float]) -> None:
        if writer is None:
            return
        with writer.as_default(step=step):
            for name, value in scalars.items():
                if value is NO_LOSS:
                    continue
                tf.summary.scalar(tag(name), value)


def tag(name: str) -> str:
    """The TensorBoard tag of a scalar: `loss` -> `metrics/loss`, `examples_per_sec` ->
    `speed/examples_per_sec`, a model metric `accuracy` -> `metrics/accuracy`, one
    optimizer's rate among several `g_optimizer_lr` -> `optimizer/g_optimizer_lr`."""
    group = OPTIMIZER if name.endswith("_lr") else GROUPS.get(name, METRICS)
    return f"{group}/{name}"


class Progress:
    """The chief's stdout lines (see the contract in docs/trainer.md); other replicas
    print nothing but the start and end."""

    def __init__(self, total: int, *, enabled: bool, stream=None):
        self.total = total
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self._bar_shown = False
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        if self._bar_shown:
            self.stream.write("\r\x1b[K")
            self._bar_shown = False
        self.stream.write(text + "\n")
        self.stream.flush()

    def step(self, step: int, loss: float, metrics: dict[str, float],
             examples_per_sec: float, lr) -> None:
        """lr: the rate, or {`<attribute>_lr`: rate} of each optimizer the step uses."""
        self.line(contracts.progress_line(step, self.total, None if loss is NO_LOSS
                                          else loss, metrics, examples_per_sec, lr))

    def eval(self, step: int, loss: float, metrics: dict[str, float]) -> None:
        self.line(contracts.eval_line(step, None if loss is NO_LOSS else loss, metrics))

    def bar(self, step: int) -> None:
        """Redraw the terminal progress bar (only when stdout is a terminal)."""
        if not self.tty:
            return
        width = 30
        done = int(width * step / max(1, self.total))
        self.stream.write(f"\r[{'#' * done}{'.' * (width - done)}] {step}/{self.total}")
        self.stream.flush()
        self._bar_shown = True


__all__ = ["SummaryWriters", "Progress", "tag", "GROUPS", "NO_LOSS"]
