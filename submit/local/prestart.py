"""Pre-started processes for a tuning job's next trial (`mljob.prestart` is their side).

While a trial trains, the tuner keeps one process ready for each replica of the next
trial (`Pool.fill`), for the replicas an earlier trial's process showed to load
TensorFlow (`loads_tensorflow`: a trainer without it would gain nothing), once every
running replica has loaded it, and with `MLJOB_PRESTART` at `auto` only where the trials
running at once leave a core free (`submit.local.tuner`). Each is started as the replica
would be (its interpreter, working directory, environment, session, output pipes, death
with the supervisor) but runs `python -m mljob.prestart MODULE [--library]`, which
imports what the replica would and waits. When the next trial's supervisor starts a
replica it takes a ready process of the same role (`Pool.take`) and hands it the
replica's order (its arguments and environment); the process becomes the replica, and
the trial skips the interpreter's start and the imports.

A ready process is handed over only when the replica would be started the same way:
the same interpreter and `-m MODULE`, the same working directory, and an environment
equal but for the variables a trial changes (`mljob.prestart.HANDED_OVER`: its cluster,
id and metric file). Otherwise, or when the process died, it is stopped and the replica
starts afresh, as it does with `MLJOB_PRESTART=0`. The processes ready when a
trial is launched are reserved for it (`Pool.reserve`): its supervisor takes from them,
and stops by PID any it did not take once its replicas started (and when it ends). The
job's pool stops what is still ready when no trial is left to start and when the job
ends, however it ends; a process whose launcher dies gets SIGTERM (PR_SET_PDEATHSIG) and
end of input.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from mljob import procs
from mljob.prestart import AUTO, ENV, HANDED_OVER, LIBRARY_FLAG, core_left_over, role

log = logging.getLogger(__name__)
MODULE = "mljob.prestart"
STOP_GRACE_S = 2.0  # a waiting process has nothing to save


@dataclasses.dataclass(frozen=True)
class Wanted:
    """A replica of the next trial: its label in the job's plan, command and environment
    (as its supervisor will start it), and the file its process leaves if it imports
    mljob's training library (`mljob.startup.library_seen`)."""

    label: str
    command: Sequence[str]
    env: Mapping[str, str]
    library_file: str


def job_pool(processes: int, setting: bool | str, spawn: Callable[..., subprocess.Popen],
             note: Callable[[str], None]) -> Pool | None:
    """A tuning job's pool, or None: MLJOB_PRESTART=0, or `auto` where the trials running
    at once (`processes` in all) take every core: their imports would run in the trials'
    place (measured: a 3-trial job of 4-process trials on 2 cores took 0.87x the time
    with them, bench/README.md section 10)."""
    if setting is False:
        return None
    have = procs.usable_cores()
    if setting == AUTO and not core_left_over(processes, have):
        note(f"trials start afresh: {processes} trial process(es) at once on {have} "
             f"core(s) leave none for processes started ahead ({ENV}=1 starts them anyway)")
        return None
    return Pool(spawn, note=note)


@dataclasses.dataclass
class Ready:
    """A process waiting for its order, and how it was started."""

    proc: subprocess.Popen
    python: str
    module: str
    cwd: str
    env: dict[str, str]
    role: str

    @property
    def key(self) -> tuple[str, str, str]:
        return self.python, self.module, self.role


def loads_tensorflow(pid: int) -> bool:
    """Whether the process has TensorFlow's runtime library mapped (it imported
    TensorFlow); False when that cannot be read."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            return any(b"libtensorflow_framework" in line for line in f)
    except OSError:
        return False


def split_command(command: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """(python, module, args) of `python -m MODULE ARGS...`; None for any other shape."""
    if len(command) >= 3 and command[1] == "-m":
        return command[0], command[2], list(command[3:])
    return None


def same_start(ready: Ready, python: str, module: str, cwd: str,
               env: Mapping[str, str]) -> str | None:
    """Why `ready` cannot become this replica, or None when it can."""
    if (python, module) != (ready.python, ready.module):
        return f"started for {ready.python} -m {ready.module}"
    if os.path.realpath(cwd) != os.path.realpath(ready.cwd):
        return f"started in {ready.cwd}"
    keys = (set(env) | set(ready.env)) - HANDED_OVER
    differ = sorted(k for k in keys if env.get(k) != ready.env.get(k))
    if differ:
        return f"its environment differs in {', '.join(differ[:3])}"
    return None


class Pool:
    """The ready processes of one tuning job; every method from any thread.

    spawn(command, cwd, env, stdin) -> Popen starts a process the way the supervisor
    starts a replica (`submit.local.supervisor.spawn`)."""

    def __init__(self, spawn: Callable[..., subprocess.Popen], *,
                 note: Callable[[str], None] | None = None, parent: Pool | None = None):
        self._spawn = spawn
        self._note = note or (lambda text: log.info("%s", text))
        self._ready: list[Ready] = []
        self._lock = threading.Lock()
        self._closed = False
        self._parent = parent  # the job's pool, for a trial's reserved one
        self._loads_tensorflow: set[str] = set()  # labels of replicas seen with it loaded
        self._loaded_pids: set[int] = set()       # their processes

    def keep_ready(self, running: Iterable, wanted: Sequence[Wanted], cwd: str) -> None:
        """`fill` for the replicas of `wanted` whose process was seen with TensorFlow
        loaded (what a ready process imports: a trainer without it gains nothing), once
        every `running` replica (a supervisor's `Replica`) has loaded it (their own
        imports are not slowed by these), with mljob's library where its file says the
        trainer imported it."""
        starting = False
        for replica in running:
            if replica.proc is None or not replica.running:
                continue
            pid = replica.proc.pid
            if pid not in self._loaded_pids and loads_tensorflow(pid):
                self._loaded_pids.add(pid)
                self._loads_tensorflow.add(replica.plan.label.rpartition("/")[2])
            starting = starting or pid not in self._loaded_pids
        if not starting:
            self.fill([(w.command, w.env, os.path.exists(w.library_file)) for w in wanted
                       if w.label in self._loads_tensorflow], cwd)

    def reserve(self) -> Pool:
        """Every ready process, moved to a pool of their own for one trial to take from:
        what the job's pool does next (drain, close) leaves them alone."""
        mine = Pool(self._spawn, note=self._note, parent=self)
        with self._lock:
            mine._ready, self._ready = self._ready, []
        return mine

    def fill(self, replicas: Sequence[tuple[Sequence[str], Mapping[str, str], bool]],
             cwd: str) -> None:
        """Have one process ready for each (command, environment, uses mljob's training
        library) given, each started now if none of its role is ready. Replicas whose
        command is not `python -m MODULE` are left to start afresh."""
        with self._lock:
            gone = [r for r in self._ready if r.proc.poll() is not None]
        if gone:  # it could not import what it waits with: no more of them
            self.close()
            self._note(f"a pre-started process exited before its order (status "
                       f"{gone[0].proc.returncode}); the next trials start afresh")
            return
        with self._lock:
            if self._closed:
                return
            wanted: dict[tuple[str, str, str], int] = {}
            for command, env, library in replicas:
                shape = split_command(command)
                if shape is None:
                    continue
                key = (shape[0], shape[1], role(env))
                wanted[key] = wanted.get(key, 0) + 1
                if sum(1 for r in self._ready if r.key == key) >= wanted[key]:
                    continue
                flag = [LIBRARY_FLAG] if library else []
                proc = self._spawn([shape[0], "-m", MODULE, shape[1], *flag], cwd,
                                   dict(env), subprocess.PIPE)
                self._ready.append(Ready(proc, shape[0], shape[1], cwd, dict(env), key[2]))

    def take(self, command: Sequence[str], cwd: str,
             env: Mapping[str, str]) -> subprocess.Popen | None:
        """A ready process of this replica's role, handed its order; None: start it
        afresh (none ready, or none that would start the same way)."""
        shape = split_command(command)
        if shape is None:
            return None
        python, module, args = shape
        with self._lock:
            mine = [r for r in self._ready if r.key == (python, module, role(env))]
            if not mine:
                return None
            ready = mine[0]
            self._ready.remove(ready)
        if ready.proc.poll() is not None:
            _reap(ready)
            self._note(f"the pre-started process {ready.proc.pid} had exited "
                       f"(status {ready.proc.returncode}); starting afresh")
            return None
        why = same_start(ready, python, module, cwd, env)
        if why is not None:  # so would every next one: the trials start afresh
            self._note(f"the pre-started process {ready.proc.pid} {why}; the trials "
                       "start afresh")
            _stop(ready)
            self.close()
            if self._parent is not None:
                self._parent.close()
            return None
        order = json.dumps({"module": module, "args": args, "env": dict(env),
                            "cwd": cwd}) + "\n"
        try:
            assert ready.proc.stdin is not None  # started with a pipe for its order
            ready.proc.stdin.write(order.encode("utf-8"))
            ready.proc.stdin.close()
            ready.proc.stdin = None  # as a replica started afresh: stdin is not ours
        except (BrokenPipeError, OSError):  # it died while being handed over
            _stop(ready)
            return None
        return ready.proc

    def close(self) -> None:
        """Stop every process still waiting, now and for good."""
        with self._lock:
            self._closed = True
        self.drain()

    def drain(self) -> None:
        """Stop every process still waiting (no more trials to start, for now)."""
        with self._lock:
            ready, self._ready = self._ready, []
        for r in ready:
            _stop(r)

    @property
    def pids(self) -> list[int]:
        with self._lock:
            return [r.proc.pid for r in self._ready]


def _stop(ready: Ready) -> None:
    """SIGTERM to its process group (its own session), then SIGKILL, and reap it."""
    procs.stop_process(ready.proc, STOP_GRACE_S)
    _reap(ready)


def _reap(ready: Ready) -> None:
    for pipe in (ready.proc.stdin, ready.proc.stdout, ready.proc.stderr):
        try:
            if pipe is not None:
                pipe.close()
        except OSError:
            pass


__all__ = ["Pool", "Ready", "Wanted", "MODULE", "job_pool", "loads_tensorflow",
           "split_command", "same_start"]
