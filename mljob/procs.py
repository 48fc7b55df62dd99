"""Process helpers shared by the launcher, the replicas, the tests and the benchmarks:
free ports, liveness by PID, and stopping a process (and what it started) by PID.

Kept free of TensorFlow so every caller can import it cheaply.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess


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
