"""Shared fixtures: free ports, a reaper that stops every process a test starts (by PID),
a real GCS emulator on 127.0.0.1, and a clean memory:// store."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

import pytest

# free_ports and pid_alive are imported from here by the tests.
from mljob.procs import free_ports, pid_alive, stop_process  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every process the tests start inherits these: quiet TensorFlow, fast failure detection,
# no network probes from gcsfs, and a job index that never touches the user's home.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
os.environ["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MLJOB_HOME", str(tmp_path_factory.mktemp("mljob-home")))


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


@pytest.fixture
def reaper():
    r = Reaper()
    try:
        yield r
    finally:
        r.stop_all()


def start_gcs_emulator(popen, port: int, bucket: str, *, in_memory: bool = True,
                       cwd: str | None = None) -> subprocess.Popen:
    """Start gcp-storage-emulator on 127.0.0.1:port with `bucket` through popen (which
    must start it in its own session), and return once it answers."""
    args = [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
            "--port", str(port), "--default-bucket", bucket, "-q"]
    proc = popen(args + (["--in-memory"] if in_memory else []), cwd=cwd,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/storage/v1/b", timeout=1).read()
            return proc
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                stop_process(proc)
                raise RuntimeError("the GCS emulator did not start")
            time.sleep(0.1)


@pytest.fixture(scope="session")
def gcs_emulator():
    """A real GCS emulator server (gcp-storage-emulator) on 127.0.0.1 with bucket
    `mljob-test`; yields its URL and sets STORAGE_EMULATOR_HOST for gcsfs and children."""
    port = free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    proc = start_gcs_emulator(
        lambda args, **kw: subprocess.Popen(args, start_new_session=True, **kw),
        port, "mljob-test")
    try:
        old = os.environ.get("STORAGE_EMULATOR_HOST")
        os.environ["STORAGE_EMULATOR_HOST"] = url
        _reset_gcsfs()
        yield url
    finally:
        if "old" in locals():
            if old is None:
                os.environ.pop("STORAGE_EMULATOR_HOST", None)
            else:
                os.environ["STORAGE_EMULATOR_HOST"] = old
        stop_process(proc)
        _reset_gcsfs()


def _reset_gcsfs():
    """gcsfs caches filesystem instances (and their endpoint); drop them."""
    try:
        import gcsfs
        gcsfs.GCSFileSystem.clear_instance_cache()
    except ImportError:
        pass


@pytest.fixture
def memfs():
    """memory:// is process-global: give each test an empty store and empty it after."""
    import fsspec
    fs = fsspec.filesystem("memory")
    fs.store.clear()
    fs.pseudo_dirs.clear()
    fs.pseudo_dirs.append("")
    yield fs
    fs.store.clear()
    fs.pseudo_dirs.clear()
    fs.pseudo_dirs.append("")
