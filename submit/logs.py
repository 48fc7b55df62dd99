"""Replica logs: labelled, timestamped lines, a live progress line, and following files.

Every line a replica prints becomes, as gcloud streams it,
`INFO<TAB>2026-11-22 12:00:00 +0000<TAB>master-replica-0<TAB><text>` (TensorFlow's
`W...`/`E...` lines are `WARNING`/`ERROR`, as are Python's `WARNING:`/`ERROR:` log lines
and stderr lines that look like errors). The same lines go to `<log dir>/<label>.log`,
so `jobs stream-logs` can follow a job from any terminal by reading those files; the
supervisor's own events are `service` lines in `<log dir>/service.log`.

Quiet by default: unless the user set TF_CPP_MIN_LOG_LEVEL, replicas get 1 (no
TensorFlow INFO lines) and the two start-up lines that ignore it (absl's "before
InitializeLog" warning, oneDNN's notice) are dropped. A storm of the same stderr lines
(a killed peer's gRPC "Connection refused", four lines an attempt, dozens a second) is
shown once, then as one line with the count of repeats (`Repeats`).
"""
from __future__ import annotations

import codecs
import os
import re
import sys
import threading
import time
from collections import OrderedDict
from typing import TextIO
from collections.abc import Callable, Iterator

from mljob import contracts
from mljob.errors import ascii_digits

ERROR_LINE = re.compile(r"^(error:|Traceback|\w*Error\b)|\bERROR\b")
SERVICE = "service"                 # the label of the supervisor's own lines
SERVICE_LOG = f"{SERVICE}.log"
TF_LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
QUIET_TF_LOG_LEVEL = "1"            # warnings and errors only
# absl's header: severity letter, date, time, thread id, then file:line]
GLOG = re.compile(r"^([IWEF])[0-9]{4} [0-9:.]+\s+[0-9]+ (?=\S+:[0-9]+\] )")
PYTHON_LOG = re.compile(r"^(WARNING|ERROR|CRITICAL):[\w.]+:")
GLOG_SEVERITY = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}
STARTUP_NOISE = contracts.TF_STARTUP_NOISE
REPEAT_MEMORY = 16      # distinct recent lines a repeat is looked for among
REPEAT_WINDOW_S = 60.0  # a line not seen for this long is new again
REPEAT_MIN_CHARS = 20   # short lines (blank, separators) are never collapsed
REPEAT_REPORT_S = 30.0  # a storm that goes on is counted this often


def format_line(label: str, text: str, severity: str = "INFO",
                when: float | None = None) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S +0000", time.gmtime(when or time.time()))
    return f"{severity}\t{stamp}\t{label}\t{text}"


def severity(text: str, stream: str) -> str:
    glog = GLOG.match(text)
    if glog:
        return GLOG_SEVERITY[glog.group(1)]
    python = PYTHON_LOG.match(text)
    if python:
        return python.group(1)
    return "ERROR" if stream == "stderr" and ERROR_LINE.search(text) else "INFO"


def startup_noise(text: str) -> bool:
    """TensorFlow's start-up lines that TF_CPP_MIN_LOG_LEVEL does not silence."""
    return STARTUP_NOISE.match(text) is not None


def quiet_env(environ) -> dict:
    """What a replica's environment gets so that TensorFlow starts quietly: nothing when
    the user set TF_CPP_MIN_LOG_LEVEL (any value; 0 shows everything)."""
    return {} if TF_LOG_LEVEL_ENV in environ else {TF_LOG_LEVEL_ENV: QUIET_TF_LOG_LEVEL}


def _repeat_key(text: str) -> str:
    """A line without what differs between repeats: TensorFlow's time and thread header,
    and the order of gRPC's `{field: value, ...}` details."""
    text = GLOG.sub(lambda m: m.group(1), text)
    return re.sub(r"\{([^{}]*)\}", lambda m: "{" + ", ".join(
        sorted(f.strip() for f in m.group(1).split(","))) + "}", text)


class Repeats:
    """Collapses storms of repeated lines on one stream: a line already seen among the
    last REPEAT_MEMORY distinct ones within REPEAT_WINDOW_S is held back and counted; the
    count becomes one line when a new line comes, every REPEAT_REPORT_S while the storm
    goes on, or at `flush()` (the stream's end). `emit(text, like)`: like is the line
    whose severity the text takes."""

    def __init__(self, emit: Callable[[str, str], None],
                 clock: Callable[[], float] = time.monotonic):
        self.emit = emit
        self.clock = clock
        self.recent: OrderedDict[str, float] = OrderedDict()
        self.held = 0
        self.first_held: str | None = None
        self.held_since = 0.0

    def feed(self, text: str) -> None:
        now = self.clock()
        key = _repeat_key(text)
        seen = self.recent.get(key)
        repeat = seen is not None and now - seen <= REPEAT_WINDOW_S
        self.recent[key] = now
        self.recent.move_to_end(key)
        if repeat and len(text) >= REPEAT_MIN_CHARS:
            self.held += 1
            if self.first_held is None:
                self.first_held, self.held_since = text, now
            elif now - self.held_since >= REPEAT_REPORT_S:
                self.flush()  # a storm that goes on: its count so far
            return
        while len(self.recent) > REPEAT_MEMORY:
            self.recent.popitem(last=False)
        self.flush()
        self.emit(text, text)

    def flush(self) -> None:
        if not self.held:
            return
        first = self.first_held or ""
        head = first if len(first) <= 120 else first[:117] + "..."
        self.emit(f"[{self.held} repeated line(s) not shown, the first: {head}]", first)
        self.held, self.first_held = 0, None


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
            if self.loss != "nan":  # a model whose logs have no loss (a GAN's)
                parts.append(f"loss {self.loss}")
        parts.append(f"{elapsed // 60:d}:{elapsed % 60:02d}")
        return "  ".join(parts)


class Terminal:
    """Thread-safe writer of log lines; on a TTY it keeps a progress line redrawn with
    `\\r` under the log (never on pipes or files, where it would be noise).

    A refusal every replica makes alike (the same `error: ...` line, as a cluster's
    replicas running the same code make it before training) is shown once, from the
    first replica that says it; each replica's own log keeps its line."""

    def __init__(self, out: TextIO | None = None, stream: bool = True,
                 clock: Callable[[], float] = time.monotonic):
        self.out = out or sys.stdout
        self.stream = stream
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        self.progress = Progress()
        self.clock = clock
        self._lock = threading.Lock()
        self._shown = False
        self._errors: dict[str, tuple[str, float]] = {}  # text -> (first label, when)

    def line(self, label: str, text: str, formatted: str) -> None:
        with self._lock:
            self.progress.observe(label, text)
            if not self.stream or self._said_by_another(label, text):
                return
            self._clear()
            self.out.write(formatted + "\n")
            if self.tty:
                self._draw()
            self.out.flush()

    def _said_by_another(self, label: str, text: str) -> bool:
        if not text.startswith("error: "):
            return False
        now = self.clock()
        first = self._errors.get(text)
        if first is not None and first[0] != label and now - first[1] <= REPEAT_WINDOW_S:
            return True
        self._errors[text] = (label, now)
        return False

    def state(self, state: str) -> None:
        with self._lock:
            self.progress.state = state
            if self.stream and self.tty:
                self._clear()
                self._draw()
                self.out.flush()

    def event(self, formatted: str, text: str) -> None:
        """A supervisor event: its log line when streaming, else as a note."""
        self.note(formatted if self.stream else text)

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


def names_a_task(task_name: str, labels: list[str]) -> bool:
    """Whether --task-name is one of the job's replicas (when the record lists them), or
    at least a replica label: `master-replica-0`, or a tuning trial's `3/master-replica-0`;
    `service` names the supervisor's events."""
    trial, _, label = task_name.rpartition("/")
    if label == SERVICE and (not trial or ascii_digits(trial)):
        return True  # the supervisor's own lines (a trial's: `3/service`)
    if labels:
        return task_name in labels
    return contracts.parse_label(label) is not None and (
        not trial or ascii_digits(trial))


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


def _tail_start(f, tail_bytes: int | None) -> int:
    """The offset of the first line that begins in the last tail_bytes of f (0: all)."""
    size = os.fstat(f.fileno()).st_size
    if not tail_bytes or size <= tail_bytes:
        return 0
    f.seek(size - tail_bytes - 1)
    head = f.read(min(tail_bytes + 1, MAX_LINE))
    newline = head.find(b"\n")
    return size - tail_bytes - 1 + newline + 1 if newline >= 0 else size - tail_bytes


READ_BYTES = 1 << 20   # a log is read this much at a time, from where the last read ended
MAX_LINE = 1 << 20     # a longer line is passed on in pieces of this size


def follow(log_dir: str, *, task_name: str | None = None,
           done: Callable[[], bool], poll: float = 0.3,
           timeout: float | None = None, tail_bytes: int | None = None,
           starts: dict[str, int] | None = None) -> Iterator[str]:
    """Yield lines of every `<label>.log` in log_dir (or just task_name's) as they are
    written, until done() is true and the files are drained (or timeout passes).
    A tuning job's trials log in subfolders: `3/master-replica-0` is trial 3's chief.

    Each file is read from the offset the last read ended at (a seek, never the file
    again), READ_BYTES at a time, each piece's lines yielded before the next is read:
    a 400 MB log costs a follower about READ_BYTES, not 400 MB.

    `tail_bytes`: a file longer than that when first seen is read from its last
    `tail_bytes` (from the line that begins there, by a seek), after one line saying
    how much was skipped. `starts` keeps where each file began, so that a follower
    given the same dict again (a browser reconnecting) begins at the same lines."""
    starts = {} if starts is None else starts
    offsets: dict[str, int] = {}
    partial: dict[str, str] = {}
    decoders: dict[str, codecs.IncrementalDecoder] = {}
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        finished = done()  # read before draining, so lines written before the end show
        for name in _log_names(log_dir):
            if not name.endswith(".log") or (task_name and name != f"{task_name}.log"):
                continue
            path = os.path.join(log_dir, name)
            decoder = decoders.setdefault(name, codecs.getincrementaldecoder("utf-8")(
                errors="replace"))
            try:
                f = open(path, "rb")
            except OSError:
                continue
            with f:
                if name not in offsets:
                    offsets[name] = starts.setdefault(name, _tail_start(f, tail_bytes))
                    if offsets[name]:
                        yield (f"-- {offsets[name] / (1 << 20):.1f} MiB of {name} skipped "
                               "(`jobs stream-logs` prints them) --")
                f.seek(offsets[name])
                while True:
                    try:
                        piece = f.read(READ_BYTES)
                    except OSError:
                        break
                    if not piece:
                        break
                    offsets[name] = f.tell()
                    text = partial.pop(name, "") + decoder.decode(piece)
                    lines = text.split("\n")
                    rest = lines.pop()
                    while len(rest) > MAX_LINE:  # a line without an end: in pieces
                        lines.append(rest[:MAX_LINE])
                        rest = rest[MAX_LINE:]
                    if rest:
                        partial[name] = rest
                    yield from lines
        if finished or (deadline is not None and time.monotonic() > deadline):
            return
        time.sleep(poll)
