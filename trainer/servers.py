"""The ps and worker replicas of a ParameterServerStrategy job, and how every replica stops.

Under ParameterServerStrategy only the chief runs Python training code; parameter servers
and workers run a `tf.distribute.Server` that the chief's coordinator drives over gRPC.
TensorFlow gives such servers no way to stop (`server.join()` blocks forever, and that is
why Cloud ML's and Kubeflow's parameter servers famously outlived their jobs), so here the
main thread waits on an Event instead, and the process ends with `os._exit` when:

- it gets SIGTERM or SIGINT (the launcher stopping the job), or
- the process named by env `MLJOB_PARENT_PID` is gone (the launcher died without
  stopping it), checked every `PARENT_POLL_SECONDS`.

A server stopped this way exits 0: for a ps or worker, being stopped is how a job ends.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

from trainer.cluster import ClusterInfo

PARENT_PID_ENV = "MLJOB_PARENT_PID"
PARENT_POLL_SECONDS = 1.0


class StopSignal:
    """SIGTERM/SIGINT and the death of the launcher, seen as one flag.

    `install()` replaces the handlers of SIGTERM and SIGINT (main thread only); the
    training loop polls `requested()` between steps, servers `wait()` on it.
    """

    def __init__(self, environ=os.environ):
        self._event = threading.Event()
        self.signum: int | None = None
        self.parent_gone = False
        self._parent = _parse_pid(environ.get(PARENT_PID_ENV))
        self._next_parent_check = 0.0

    def install(self) -> "StopSignal":
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)
        return self

    def install_default(self) -> "StopSignal":
        """For replicas with nothing to save: SIGTERM and SIGINT end the process at once
        (the parent-death check still goes through `requested()`)."""
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        return self

    def _handle(self, signum, _frame) -> None:
        self.signum = signum
        self._event.set()

    def requested(self) -> bool:
        """True once a signal arrived or the launcher is gone (checked at most once a
        PARENT_POLL_SECONDS, so calling this every step costs nothing)."""
        if self._event.is_set():
            return True
        now = time.monotonic()
        if self._parent is not None and now >= self._next_parent_check:
            self._next_parent_check = now + PARENT_POLL_SECONDS
            if not _alive(self._parent):
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


def serve(info: ClusterInfo, stop: StopSignal) -> int:
    """Run this replica's gRPC server until stopped; never returns normally (os._exit),
    since TensorFlow's server threads would keep the interpreter from exiting."""
    import tensorflow as tf

    cluster = tf.train.ClusterSpec(info.tf_config()["cluster"])
    tf.distribute.Server(cluster, job_name=info.task_type, task_index=info.task_index,
                         protocol="grpc", start=True)
    stop.install()  # after the server: TensorFlow's runtime may set its own handlers
    print(f"{info.task_name} serving {info.task_type} {info.task_index} at {info.address}",
          flush=True)
    while not stop.wait(3600):
        pass
    print(f"{info.task_name} stopping: {stop.reason()}", flush=True)
    _exit(0)


def _exit(status: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _parse_pid(text: str | None) -> int | None:
    if not text or not text.strip().isdigit():
        return None
    pid = int(text)
    return pid if pid > 0 else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # an unreaped zombie is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True  # no /proc (macOS): kill(0) said it exists


__all__ = ["StopSignal", "serve", "PARENT_PID_ENV"]
