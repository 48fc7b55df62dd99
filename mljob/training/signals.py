"""How every replica stops: SIGTERM, SIGINT and the launcher's death, seen as one flag.

A replica that trains polls `StopSignal.requested()` between chunks of steps and saves a
checkpoint before it exits 143; a ps or worker server (`mljob.training.servers`) waits
on it and exits 0; the evaluator waits on it between checkpoints and exits 0.

The launcher's death is the process named by env `MLJOB_PARENT_PID` being gone, checked
every `PARENT_POLL_SECONDS`.

A chief stopped this way saves a checkpoint first, which needs its peers: under ps a step
in flight on a worker that is gone never finishes, and the main thread waits inside
TensorFlow, where neither the stop flag nor the launcher's death is looked at. So
`install()` also starts a watchdog thread that notices the launcher's death by itself and
ends the process (exit 143, without the new checkpoint) once a stop request has gone
unanswered for `MLJOB_STOP_DEADLINE` seconds (default 60): a process asked to stop never
lives on, orphaned, waiting for peers that are gone.

No TensorFlow here.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import NoReturn

from mljob import contracts
from mljob.errors import EXIT_PREEMPTED
from mljob.procs import pid_alive

PARENT_PID_ENV = contracts.PARENT_PID_ENV
PARENT_POLL_SECONDS = 1.0
STOP_DEADLINE_ENV = contracts.STOP_DEADLINE_ENV
STOP_DEADLINE_SECONDS = contracts.STOP_DEADLINE_SECONDS


class StopSignal:
    """SIGTERM/SIGINT and the death of the launcher, seen as one flag.

    `install()` replaces the handlers of SIGTERM and SIGINT (main thread only); the
    training loop polls `requested()` between steps, servers `wait()` on it.
    """

    def __init__(self, environ: Mapping[str, str] = os.environ) -> None:
        self._event = threading.Event()
        self.signum: int | None = None
        self.parent_gone = False
        self._parent = _parse_pid(environ.get(PARENT_PID_ENV))
        self._next_parent_check = 0.0
        self._lock = threading.Lock()
        self._deadline = _parse_seconds(environ.get(STOP_DEADLINE_ENV), STOP_DEADLINE_SECONDS)
        self._watchdog: threading.Thread | None = None

    def install(self) -> "StopSignal":
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name="stop-watchdog",
                                              daemon=True)
            self._watchdog.start()
        return self

    def _watch(self) -> None:
        """Notice a stop even while the main thread waits in TensorFlow; end the process
        when the stop has gone unanswered for the deadline."""
        while not self.requested():
            self._event.wait(PARENT_POLL_SECONDS)
        time.sleep(self._deadline)
        say(f"error: still running {self._deadline:g} s after the stop request "
             f"({self.reason()}): a step in flight never finished (its peers are gone?); "
             "exiting without a new checkpoint, run again to resume from the latest one",
             sys.stderr)
        exit_now(EXIT_PREEMPTED)

    def _handle(self, signum, _frame) -> None:
        # Only a plain assignment here: the handler runs between two bytecodes of the
        # main thread, possibly inside Event.set or wait, whose lock is not reentrant; a
        # second signal arriving there (SIGTERM and the parent-death signal together)
        # deadlocked the process. `requested()` turns the note into the event, and every
        # wait wakes at least once a PARENT_POLL_SECONDS to ask.
        self.signum = signum

    def requested(self) -> bool:
        """True once a signal arrived or the launcher is gone (checked at most once a
        PARENT_POLL_SECONDS, so calling this every step costs nothing)."""
        if self._event.is_set():
            return True
        if self.signum is not None:
            self._event.set()
            return True
        with self._lock:  # the main thread and the watchdog both ask
            now = time.monotonic()
            if self._parent is not None and now >= self._next_parent_check:
                self._next_parent_check = now + PARENT_POLL_SECONDS
                if not pid_alive(self._parent):
                    self.parent_gone = True
                    self._event.set()
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Sleep up to timeout seconds, waking early when a stop is requested."""
        deadline = time.monotonic() + timeout
        while not self.requested():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._event.wait(min(left, PARENT_POLL_SECONDS))
        return True

    def reason(self) -> str:
        if self.parent_gone:
            return f"the launcher (pid {self._parent}) is gone"
        if self.signum is not None:
            return f"got {signal.Signals(self.signum).name}"
        return "stop requested"


def say(text: str, stream) -> None:
    """Print a line; a launcher that died took the pipe with it, which must not keep
    this process from exiting (SIGPIPE is ignored in Python: writes raise)."""
    try:
        print(text, file=stream, flush=True)
    except (OSError, ValueError):
        pass


def exit_now(status: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def _parse_seconds(text: str | None, default: float) -> float:
    try:
        value = float(text) if text else default
    except ValueError:
        return default
    # inf (`1e400` too) would make the watchdog's sleep raise and the deadline vanish
    return value if 0 < value < float("inf") else default


def _parse_pid(text: str | None) -> int | None:
    text = (text or "").strip()
    if not (text.isascii() and text.isdecimal()):  # isdigit() also takes "²": int() fails
        return None
    pid = int(text)
    return pid if pid > 0 else None


__all__ = ["StopSignal", "say", "exit_now", "PARENT_PID_ENV", "STOP_DEADLINE_ENV"]
