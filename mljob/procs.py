"""Process helpers shared by the launcher, the replicas, the tests and the benchmarks:
free ports, liveness by PID, stopping a process (and what it started) by PID, and
whether a recorded PID is still the process that was started (psutil reads what the
system knows of a process: start time, command line, environment, open files, state).

Kept free of TensorFlow so every caller can import it cheaply.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time

import psutil


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (dead for our purposes)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # includes ZombieProcess
        return False
    except psutil.AccessDenied:  # exists, but not ours to read
        return True


def signal_group(pid: int, sig: int) -> None:
    """Send sig to the process group led by pid; a group already gone is fine."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_process(proc: subprocess.Popen, grace: float = 5.0, *,
                 own_group: bool = True) -> None:
    """SIGTERM the process (its group when it leads one), wait up to grace seconds,
    then SIGKILL what is left of the group, and reap it."""
    if proc.poll() is None:
        if own_group:
            signal_group(proc.pid, signal.SIGTERM)
        else:
            proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    if own_group:
        signal_group(proc.pid, signal.SIGKILL)  # children it may have left
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


# --- is this PID still the process we started? ------------------------------------------
# A PID in a record is only a number: by the time it is read the process may have ended
# and the number been reused, or the record may have been written by someone else. Before
# a PID is signalled it must still be the very process that was recorded (same start time
# and command line, as psutil reads them) and carry the job's own marker: an environment
# variable set when it was started, or a file only that job's supervisor holds open.

# Start times are compared to within a millisecond: they are whole clock ticks (10 ms)
# since boot, recovered from psutil's wall-clock start time in floating point.
_SAME_START = 1e-3


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except (psutil.Error, ValueError, TypeError):
        return None


def started(pid: int) -> float | None:
    """When the process started, in seconds since boot (psutil's start time less the
    boot time: unlike wall-clock time it never moves, so two readers agree)."""
    proc = _process(pid)
    try:
        return None if proc is None else proc.create_time() - psutil.boot_time()
    except psutil.Error:
        return None


def command_line(pid: int) -> list[str] | None:
    proc = _process(pid)
    try:
        return (proc.cmdline() or None) if proc is not None else None
    except psutil.Error:  # gone, a zombie, or not ours to read
        return None


def environment(pid: int) -> dict[str, str]:
    proc = _process(pid)
    try:
        return proc.environ() if proc is not None else {}
    except psutil.Error:
        return {}


def holds_open(pid: int, path: str) -> bool:
    """True when the process has `path` open."""
    target = os.path.realpath(path)
    proc = _process(pid)
    try:
        files = proc.open_files() if proc is not None else []
    except psutil.Error:
        return False
    return any(os.path.realpath(f.path) == target for f in files)


def stamp(pid: int, wait: float = 2.0) -> dict | None:
    """What identifies a process we just started: its start time and command line.
    Popen returns while exec is still under way and the command line is empty for a
    moment, so it is waited for (up to `wait` seconds)."""
    deadline = time.monotonic() + wait
    while True:
        start, argv = started(pid), command_line(pid)
        if start is not None and argv is not None:
            return {"started": start, "cmdline": argv}
        if start is None or time.monotonic() > deadline:  # gone, or not ours to read
            return None
        time.sleep(0.005)


def _same_start(pid: int, recorded: dict) -> bool:
    start = started(pid)
    if start is None:
        return False
    then = recorded.get("started")
    if then is None and isinstance(recorded.get("start_ticks"), int):  # older records
        then = recorded["start_ticks"] / os.sysconf("SC_CLK_TCK")
    if isinstance(then, bool) or not isinstance(then, (int, float)):
        return False
    return abs(start - then) < _SAME_START


def is_ours(pid, recorded, *, env=None, open_file: str | None = None) -> bool:
    """True only when pid is still the process `recorded` (a `stamp`) describes, alive,
    and carrying one of the markers asked for: every variable of `env` set to its value in
    its environment, or `open_file` held open. Anything unknown answers False: a PID
    that cannot be shown to be ours is never signalled."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    if not isinstance(recorded, dict) or not pid_alive(pid):
        return False
    if not _same_start(pid, recorded) or command_line(pid) != recorded.get("cmdline"):
        return False
    if env:
        live = environment(pid)
        if all(live.get(k) == v for k, v in env.items()):
            return True
    return open_file is not None and holds_open(pid, open_file)


class SignalFlag:
    """A flag a signal handler may set: `threading.Event.set` takes a lock that is not
    reentrant, so a second signal arriving inside the first handler's `set` deadlocks the
    process. Setting a plain attribute cannot block; readers poll `is_set()`."""

    def __init__(self) -> None:
        self._set = False

    def set(self, *_) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


def handle_stop_signals(handler) -> dict | None:
    """Route SIGINT and SIGTERM to handler (a `SignalFlag.set`: a handler must take no
    lock); the previous handlers, for `restore_signals`. Off the main thread, where
    Python cannot install handlers, nothing changes and None is returned."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}


def restore_signals(previous: dict | None) -> None:
    for sig, handler in (previous or {}).items():
        signal.signal(sig, handler)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. under taskset or a
    container's cpuset), not the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1
