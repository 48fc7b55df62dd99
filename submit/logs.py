"""Replica logs: labelled, timestamped lines, a live progress line, and following files.

Every line a replica prints becomes, as gcloud streams it,
`INFO<TAB>2026-11-22 12:00:00 +0000<TAB>master-replica-0<TAB><text>` (stderr lines that
look like errors are `ERROR`). The same lines go to `<log dir>/<label>.log`, so
`jobs stream-logs` can follow a job from any terminal by reading those files.
"""
from __future__ import annotations

import os
import re
import sys
import threading
import time
from typing import TextIO
from collections.abc import Callable, Iterator

from mljob import contracts

ERROR_LINE = re.compile(r"^(error:|Traceback|\w*Error\b)|\bERROR\b")


def format_line(label: str, text: str, severity: str = "INFO",
                when: float | None = None) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S +0000", time.gmtime(when or time.time()))
    return f"{severity}\t{stamp}\t{label}\t{text}"


def severity(text: str, stream: str) -> str:
    return "ERROR" if stream == "stderr" and ERROR_LINE.search(text) else "INFO"


class Progress:
    """State, step/total, loss and elapsed time, parsed from the chief's `step` lines."""

    def __init__(self, state: str = "PREPARING"):
        self.state = state
        self.step: int | None = None
        self.total: int | None = None
        self.loss: str | None = None
        self.started = time.monotonic()

    def observe(self, label: str, text: str) -> bool:
        if not label.startswith("master-"):
            return False
        progress = contracts.parse_progress(text)
        if progress is None:
            return False
        self.step, self.total, self.loss = progress.step, progress.total, f"{progress.loss:g}"
        return True

    def render(self) -> str:
        elapsed = int(time.monotonic() - self.started)
        parts = [self.state]
        if self.step is not None:
            parts.append(f"step {self.step}/{self.total}")
            parts.append(f"loss {self.loss}")
        parts.append(f"{elapsed // 60:d}:{elapsed % 60:02d}")
        return "  ".join(parts)


class Terminal:
    """Thread-safe writer of log lines; on a TTY it keeps a progress line redrawn with
    `\\r` under the log (never on pipes or files, where it would be noise)."""

    def __init__(self, out: TextIO | None = None, stream: bool = True):
        self.out = out or sys.stdout
        self.stream = stream
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        self.progress = Progress()
        self._lock = threading.Lock()
        self._shown = False

    def line(self, label: str, text: str, formatted: str) -> None:
        with self._lock:
            self.progress.observe(label, text)
            if not self.stream:
                return
            self._clear()
            self.out.write(formatted + "\n")
            if self.tty:
                self._draw()
            self.out.flush()

    def state(self, state: str) -> None:
        with self._lock:
            self.progress.state = state
            if self.stream and self.tty:
                self._clear()
                self._draw()
                self.out.flush()

    def note(self, text: str) -> None:
        """A launcher message (not a replica line), always shown."""
        with self._lock:
            self._clear()
            self.out.write(text + "\n")
            if self.stream and self.tty:
                self._draw()
            self.out.flush()

    def close(self) -> None:
        with self._lock:
            self._clear()
            self.out.flush()

    def _clear(self) -> None:
        if self._shown:
            self.out.write("\r\033[K")
            self._shown = False

    def _draw(self) -> None:
        self.out.write(self.progress.render())
        self._shown = True


def _log_names(log_dir: str) -> list[str]:
    """`<label>.log` files of log_dir, and `<trial>/<label>.log` of a tuning job's."""
    names = []
    for entry in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []:
        sub = os.path.join(log_dir, entry)
        if os.path.isdir(sub):
            names += [f"{entry}/{n}" for n in sorted(os.listdir(sub)) if n.endswith(".log")]
        else:
            names.append(entry)
    return names


def follow(log_dir: str, *, task_name: str | None = None,
           done: Callable[[], bool], poll: float = 0.3,
           timeout: float | None = None) -> Iterator[str]:
    """Yield lines of every `<label>.log` in log_dir (or just task_name's) as they are
    written, until done() is true and the files are drained (or timeout passes).
    A tuning job's trials log in subfolders: `3/master-replica-0` is trial 3's chief."""
    offsets: dict[str, int] = {}
    partial: dict[str, str] = {}
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        finished = done()  # read before draining, so lines written before the end show
        for name in _log_names(log_dir):
            if not name.endswith(".log") or (task_name and name != f"{task_name}.log"):
                continue
            path = os.path.join(log_dir, name)
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    f.seek(offsets.get(name, 0))
                    chunk = f.read()
                    offsets[name] = f.tell()
            except OSError:
                continue
            text = partial.pop(name, "") + chunk
            lines = text.split("\n")
            if lines[-1]:
                partial[name] = lines[-1]
            yield from (line for line in lines[:-1])
        if finished or (deadline is not None and time.monotonic() > deadline):
            return
        time.sleep(poll)
