"""Helpers the tests share: the project root, processes started and stopped by PID, and a
real GCS emulator. Fixtures that use them are in tests/conftest.py."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from mljob.procs import free_ports, pid_alive, stop_process  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Reaper:
    """Starts processes in their own process group and stops every one by PID at teardown:
    SIGTERM, a grace period, then SIGKILL to the group."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []

    def popen(self, args, **kwargs) -> subprocess.Popen:
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(args, **kwargs)
        self.procs.append(proc)
        return proc

    def python(self, *args, **kwargs) -> subprocess.Popen:
        return self.popen([sys.executable, *args], **kwargs)

    def stop(self, proc: subprocess.Popen, grace: float = 5.0) -> None:
        stop_process(proc, grace)

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            self.stop(proc)


def start_gcs_emulator(popen, port: int, bucket: str, *, in_memory: bool = True,
                       cwd: str | None = None) -> subprocess.Popen:
    """Start gcp-storage-emulator on 127.0.0.1:port with `bucket` through popen (which
    must start it in its own session), and return once it answers. A restart on the same
    port can find it held for a moment (free, it may be the local end of another
    process's outgoing connection, from the same ephemeral range), and an emulator that
    cannot bind does not exit, it only never answers: the port is waited for first."""
    deadline = time.time() + 30
    while not _bindable(port) and time.time() < deadline:
        time.sleep(0.2)
    args = [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
            "--port", str(port), "--default-bucket", bucket, "-q"]
    with tempfile.TemporaryFile() as log:
        proc = popen(args + (["--in-memory"] if in_memory else []), cwd=cwd,
                     stdout=subprocess.DEVNULL, stderr=log)
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/storage/v1/b",
                                       timeout=1).read()
                return proc
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    status = proc.poll()
                    stop_process(proc)
                    log.seek(0)
                    said = log.read().decode(errors="replace").strip().splitlines()
                    why = [f"it exited with status {status}"] if status is not None else []
                    why += said[-1:]
                    raise RuntimeError(
                        f"the GCS emulator did not answer on 127.0.0.1:{port} in 30 s"
                        + (f" ({': '.join(why)})" if why else "")) from None
                time.sleep(0.1)


def _bindable(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:port now (as http.server binds)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def reset_gcsfs():
    """gcsfs caches filesystem instances (and their endpoint); drop them."""
    try:
        import gcsfs
        gcsfs.GCSFileSystem.clear_instance_cache()
    except ImportError:
        pass
