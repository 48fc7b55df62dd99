"""Process helpers shared by the launcher, the replicas, the tests and the benchmarks:
free ports, liveness by PID, and stopping a process (and what it started) by PID.

Kept free of TensorFlow so every caller can import it cheaply.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time


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
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:  # gone since kill(0), or no /proc at all (macOS)
        return not os.path.isdir("/proc")
    except OSError:
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
# and command line, as /proc shows them) and carry the job's own marker: an environment
# variable set when it was started, or a file only that job's supervisor holds open.


def _proc_read(pid: int, name: str) -> bytes | None:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read(1 << 20)
    except OSError:  # gone, not ours to read, or no /proc
        return None


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks after boot (/proc/PID/stat field 22)."""
    stat = _proc_read(pid, "stat")
    if stat is None:
        return None
    fields = stat.rsplit(b")", 1)[-1].split()  # the name in () may hold spaces
    try:
        return int(fields[19])  # fields[0] is field 3 (state)
    except (IndexError, ValueError):
        return None


def command_line(pid: int) -> list[str] | None:
    raw = _proc_read(pid, "cmdline")
    if not raw:
        return None
    return [a.decode("utf-8", "surrogateescape") for a in raw.rstrip(b"\0").split(b"\0")]


def environment(pid: int) -> dict[str, str]:
    raw = _proc_read(pid, "environ") or b""
    pairs = (item.decode("utf-8", "surrogateescape").partition("=")
             for item in raw.split(b"\0") if item)
    return {k: v for k, _, v in pairs}


def holds_open(pid: int, path: str) -> bool:
    """True when the process has `path` open (read from /proc/PID/fd)."""
    target = os.path.realpath(path)
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                return True
        except OSError:
            continue
    return False


def stamp(pid: int, wait: float = 2.0) -> dict | None:
    """What identifies a process we just started: its start time and command line.
    Popen returns while exec is still under way and the command line is empty for a
    moment, so it is waited for (up to `wait` seconds)."""
    deadline = time.monotonic() + wait
    while True:
        ticks, argv = start_ticks(pid), command_line(pid)
        if ticks is not None and argv is not None:
            return {"start_ticks": ticks, "cmdline": argv}
        if ticks is None or time.monotonic() > deadline:  # gone, or no /proc
            return None
        time.sleep(0.005)


def is_ours(pid, recorded, *, env=None, open_file: str | None = None) -> bool:
    """True only when pid is still the process `recorded` (a `stamp`) describes, alive,
    and carrying one of the markers asked for: every variable of `env` set to its value in
    its environment, or `open_file` held open. Anything unknown answers False: a PID
    that cannot be shown to be ours is never signalled."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    if not isinstance(recorded, dict) or not pid_alive(pid):
        return False
    if start_ticks(pid) != recorded.get("start_ticks") \
            or command_line(pid) != recorded.get("cmdline"):
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
