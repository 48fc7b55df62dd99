"""A job's life on this machine, as the local runner and the local tuner both live it.

PREPARING, then RUNNING, then an ending state (SUCCEEDED, FAILED or CANCELLED, through
CANCELLING when cancelled), with everything the job started stopped on every way out:
its own end, an exception, SIGINT or SIGTERM to this process (routed to `cancel`), and
Ctrl-C. When the job ends, its mirrored folders are copied to their URLs one last time;
a job that succeeded but cannot be copied fails, any other keeps its own reason. The
record is published after each change; a failed write is logged and never leaves a
process behind.

Every change of state is also a supervisor event: `_event(text)` writes a `service`
line (`3/service` in a tuning trial) to `<log dir>/service.log`, which `jobs stream-logs`
follows with the replicas' logs, as Cloud ML's service lines were; events before the
folders are prepared wait for them (preparing empties a mirrored log folder).

A subclass gives `_live()` (prepare, start, supervise: the ending state and its error),
`_stop_everything()` (stop and close all it started; called more than once), may add to
`_wind_up()` (after the stop, before the last copy) and `_copy_out()` (the last copy).
"""
from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable

from mljob import procs
from submit import jobs, logs
from submit.local.mirror import Mirror
from submit.local.plan import JobPlan

log = logging.getLogger(__name__)


class JobLife:
    """Runs a job to its end with `run()`; `publish(record)` is called after each change."""

    def __init__(self, plan: JobPlan, record: jobs.JobRecord, *,
                 publish: Callable[[jobs.JobRecord], None],
                 terminal: logs.Terminal | None = None):
        self.plan = plan
        self.record = record
        self.publish = publish
        self.terminal = terminal or logs.Terminal(stream=False)
        self.mirrors = [Mirror(local, url) for local, url in plan.mirrors]
        self._cancel = procs.SignalFlag()  # set by the signal handler: never an Event
        self._lock = threading.RLock()
        self._pending_events: list[str] | None = []  # None once the log folder is ready
        # a tuning trial's replicas are `3/master-replica-0`: its events are `3/service`
        prefix = next((r.label.rpartition("/")[0] for r in getattr(plan, "replicas", ())), "")
        self.service_label = f"{prefix}/{logs.SERVICE}" if prefix else logs.SERVICE

    def cancel(self, *_):
        self._cancel.set()

    def run(self) -> str:
        """Prepare, start, supervise and stop; returns the final state."""
        previous = procs.handle_stop_signals(self.cancel)
        try:
            self._set(jobs.PREPARING)
            state, error = self._live()
            if state == jobs.CANCELLED:
                self._set(jobs.CANCELLING)
            return self._finish(state, error)
        except BaseException as exc:  # _finish stops everything first
            if isinstance(exc, KeyboardInterrupt):
                return self._finish(jobs.CANCELLED, None)
            self._finish(jobs.FAILED, str(exc) or type(exc).__name__)
            raise
        finally:
            self._stop_everything()
            procs.restore_signals(previous)
            self.terminal.close()

    # --- what a subclass gives --------------------------------------------------------

    def _live(self) -> tuple[str, str | None]:
        raise NotImplementedError

    def _stop_everything(self) -> None:
        raise NotImplementedError

    def _wind_up(self) -> None:
        """After everything stopped, before the last copy."""

    def _copy_out(self) -> None:
        """The last copy of the job's folders to their URLs."""
        self._mirror(final=True)

    # --- shared ---------------------------------------------------------------------------

    def _prepare_folders(self, *folders: str) -> None:
        # A mirrored folder starts as a copy of its URL: what an earlier job of the same
        # id left locally must not leak into this one (stale checkpoints would be
        # resumed), while a job dir's own checkpoints must be there to resume from.
        for mirror in self.mirrors:
            shutil.rmtree(mirror.local_dir, ignore_errors=True)
            mirror.seed()
        for folder in folders:
            os.makedirs(folder, exist_ok=True)
        self._flush_events()

    def _finish(self, state: str, error: str | None) -> str:
        self._stop_everything()
        self._flush_events()
        self._wind_up()
        try:
            self._copy_out()
        except Exception as exc:  # any storage failure fails a job that succeeded
            if state == jobs.SUCCEEDED:
                state, error = jobs.FAILED, f"cannot copy the job dir: {exc}"
            else:  # keep the job's own failure reason
                log.warning("could not copy the job dir after the job ended: %s", exc)
        self._set(state, error)
        return state

    def _mirror(self, *, final: bool) -> None:
        for mirror in self.mirrors:
            try:
                mirror.sync()
            except Exception as exc:
                if final:
                    raise
                log.warning("mirroring %s failed, will retry: %s", mirror.url, exc)

    def _set(self, state: str, error: str | None = None) -> None:
        with self._lock:
            self.record.set_state(state, error)
            self._event(f"job {state}" + (f": {error}" if error else ""))
            self.terminal.state(state)
            self._save()

    def _event(self, text: str) -> None:
        """A supervisor event: a service line in the job's log and on the terminal."""
        line = logs.format_line(self.service_label, text)
        with self._lock:
            if self._pending_events is not None:
                self._pending_events.append(line)
            else:
                self._write_events([line])
        self.terminal.event(line, text)

    def _flush_events(self) -> None:
        with self._lock:
            pending, self._pending_events = self._pending_events or [], None
            self._write_events(pending)

    def _write_events(self, lines: list[str]) -> None:
        if not lines:
            return
        try:
            os.makedirs(self.plan.log_dir, exist_ok=True)
            with open(os.path.join(self.plan.log_dir, logs.SERVICE_LOG), "a",
                      encoding="utf-8") as f:
                f.writelines(line + "\n" for line in lines)
        except OSError as exc:  # a full disk must not stop the supervisor
            log.warning("cannot write the job's service log: %s", exc)

    def _save(self) -> None:
        try:
            self.publish(self.record)
        except Exception as exc:  # a record write must not orphan a process
            log.warning("cannot save the job record: %s", exc)
