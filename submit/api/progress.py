"""Progress of the Python API's long calls: what `submit` is doing (packaging, building
an image, starting the job) and where a job is while `wait` waits (its state, its
latest step from its own summaries, the time so far).

In a notebook (an IPython kernel) with tqdm and ipywidgets installed it is tqdm's
notebook bar; elsewhere, lines on stderr: each phase once, and a job's state when it
changes and every LINE_EVERY_S seconds. `progress=False` on a call, or
`MLJOB_PROGRESS=0` in the environment, turns it off; nothing is printed to stdout.
"""
from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from submit.query import curves

LINE_EVERY_S = 30.0
STEP_EVERY_S = 2.0   # how often `wait` reads the job's summaries for its progress
ENV = "MLJOB_PROGRESS"


def enabled(progress: bool | None) -> bool:
    """Whether to show progress: the call's choice, else the environment's (on unless
    MLJOB_PROGRESS is 0, false, no or off)."""
    if progress is not None:
        return progress
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _notebook_bar(total: int | None, desc: str) -> Any | None:
    """tqdm's notebook bar when this runs in an IPython kernel (a notebook's: its shell
    is the ZMQ one) with ipywidgets; else None."""
    if "IPython" not in sys.modules:  # never imported here: not a notebook
        return None
    from IPython import get_ipython
    if type(get_ipython()).__name__ != "ZMQInteractiveShell":
        return None
    try:
        import ipywidgets  # noqa: F401  (tqdm's notebook bar draws with it)
        from tqdm.notebook import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="step", leave=True)


class Progress:
    """One call's progress: `note(text)` a phase, `job(state, step, total)` where a job
    is; `close()` when the call returns or raises."""

    def __init__(self, what: str, *, on: bool, stream: TextIO | None = None,
                 clock=time.monotonic):
        self.what = what
        self.on = on
        self.stream = stream
        self.clock = clock
        self.started = clock()
        self.bar: Any | None = None
        self.last_line = -LINE_EVERY_S
        self.last: tuple[str, int | None] | None = None

    def _out(self, text: str) -> None:
        stream = self.stream or sys.stderr
        print(text, file=stream, flush=True)

    def note(self, text: str) -> None:
        """A phase of the call (a line of what the command line would print)."""
        if not self.on:
            return
        if self.bar is not None:
            self.bar.set_description_str(f"{self.what}: {text[:60]}")
        else:
            for line in text.splitlines():
                self._out(f"[{self.what}] {line}")

    def job(self, state: str, step: int | None = None, total: int | None = None) -> None:
        """Where the job is now: its state, its latest step and the steps it trains."""
        if not self.on:
            return
        elapsed = self.clock() - self.started
        if self.bar is None and self.stream is None:
            self.bar = _notebook_bar(total, self.what)
        if self.bar is not None:
            if total and self.bar.total != total:
                self.bar.total = total
            if step is not None and step > self.bar.n:
                self.bar.update(step - self.bar.n)
            self.bar.set_postfix_str(state)
            return
        now = (state, step)
        if now != self.last and (state != (self.last or ("",))[0]
                                 or elapsed - self.last_line >= LINE_EVERY_S):
            shown = "" if step is None else f", step {step}" + (f"/{total}" if total else "")
            self._out(f"[{self.what}] {state}{shown} after {elapsed:.0f} s")
            self.last, self.last_line = now, elapsed

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class JobSteps:
    """A job's latest step, from its own summaries (read on, a little at a time, every
    STEP_EVERY_S), and the steps it trains when its args say (`--train-steps N`, the
    bundled trainer's flag and Cloud ML samples')."""

    def __init__(self, record: Any):
        # a tuning job's trials write their summaries in folders of their own: its
        # progress is its state
        tuning = bool((record.training_input or {}).get("hyperparameters"))
        self.reader = curves.JobCurves(record.job_dir) if record.job_dir and not tuning \
            else None
        self.total = None if tuning else _train_steps(record.trainer_args)
        self.read_at = -STEP_EVERY_S
        self.step: int | None = None

    def now(self, *, force: bool = False) -> tuple[int | None, int | None]:
        if self.reader is not None and (force or time.monotonic() - self.read_at
                                        >= STEP_EVERY_S):
            self.read_at = time.monotonic()
            try:
                steps = [max(points) for runs in self.reader.read().values()
                         for points in runs.values() if points]
            except Exception:  # no reader, a damaged file: progress goes without a step
                self.reader, steps = None, []
            self.step = max(steps, default=self.step)
        return self.step, self.total


def _train_steps(args: Sequence[str]) -> int | None:
    for i, arg in enumerate(args):
        found = re.fullmatch(r"--train[-_]steps(?:=([0-9]{1,18}))?", arg)
        if found:
            text = found[1] or (args[i + 1] if i + 1 < len(args) else "")
            return int(text) if re.fullmatch(r"[0-9]{1,18}", text) else None
    return None
