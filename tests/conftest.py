"""Shared fixtures: free ports, a reaper that stops every process a test starts (by PID),
a real GCS emulator on 127.0.0.1, and a clean memory:// store."""
from __future__ import annotations

import os
import subprocess

import pytest

from mljob.procs import free_ports, stop_process
from tests.support.common import ROOT, Reaper, reset_gcsfs, start_gcs_emulator
from tests.support.submit_cli import write_package

# Every process the tests start inherits these: quiet TensorFlow, fast failure detection,
# no network probes from gcsfs, and a job index that never touches the user's home.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
os.environ["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pytest.ini): one worker per core, at most two. Each test file runs in
    one worker (`--dist loadfile`: a file's tests may share a module's server); many tests
    start processes of their own, and their waits were set for about two at a time."""
    return max(1, min(2, len(os.sched_getaffinity(0))))


@pytest.fixture(scope="session", autouse=True)
def _shared_package_environments(tmp_path_factory):
    """Package environments are keyed by the hashes of what they hold, so tests share
    one cache (a pip install a job, not a test); a test about building sets its own."""
    old = os.environ.get("MLJOB_ENV_CACHE")
    os.environ["MLJOB_ENV_CACHE"] = str(tmp_path_factory.mktemp("mljob-envs"))
    yield
    if old is None:
        os.environ.pop("MLJOB_ENV_CACHE", None)
    else:
        os.environ["MLJOB_ENV_CACHE"] = old


@pytest.fixture(autouse=True)
def _project_loggers_as_a_fresh_process_has_them():
    """Each test starts with this project's loggers as a new process has them: a library
    an earlier test used in the same worker process may have disabled the loggers it
    found (`logging.config`'s `disable_existing_loggers`), raised the global
    `logging.disable` level or cut propagation, and a test that reads the warnings a
    command logs would then see none."""
    import logging
    logging.disable(logging.NOTSET)
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and name.split(".")[0] in (
                "submit", "mljob", "predict", "trainer"):
            logger.disabled = False
            logger.propagate = True
    yield


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MLJOB_HOME", str(tmp_path_factory.mktemp("mljob-home")))


@pytest.fixture
def reaper():
    r = Reaper()
    try:
        yield r
    finally:
        r.stop_all()


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
        reset_gcsfs()
        yield url
    finally:
        if "old" in locals():
            if old is None:
                os.environ.pop("STORAGE_EMULATOR_HOST", None)
            else:
                os.environ["STORAGE_EMULATOR_HOST"] = old
        stop_process(proc)
        reset_gcsfs()


@pytest.fixture
def pkg(tmp_path):
    """A minimal training package (setup.py and `fakejob.task`) to submit."""
    return write_package(tmp_path / "pkg")


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
