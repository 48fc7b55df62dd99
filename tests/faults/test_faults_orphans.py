"""Nothing outlives a job, even when its launcher is SIGKILLed and the chief is stuck
waiting for peers that are gone: the chief's stop watchdog (trainer/servers.py) notices
the launcher's death and a stop request left unanswered, and ends the process."""
from __future__ import annotations

import pytest

import os
import signal
import subprocess

from tests.support.common import ROOT, pid_alive
from tests.support.faults import Job
from tests.support.trainer_runs import wait_exit, wait_for

# A main thread blocked the way a chief is inside TensorFlow waiting for a step that
# never finishes: Python signal handlers run, but nothing ever looks at the stop flag.
STUCK = """
import sys, threading
sys.path.insert(0, sys.argv[1])
from mljob.training.signals import StopSignal
StopSignal().install()
print("ready", flush=True)
lock = threading.Lock()
lock.acquire()
lock.acquire()
"""


def _stuck(reaper, env: dict) -> subprocess.Popen:
    proc = reaper.python("-c", STUCK, ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "MLJOB_STOP_DEADLINE": "2", **env})
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_stop_request_left_unanswered_ends_the_process(reaper):
    proc = _stuck(reaper, {})
    proc.send_signal(signal.SIGTERM)
    assert wait_exit(proc, 60) == 143
    err = proc.stderr.read()
    assert err.startswith("error: still running 2 s after the stop request (got SIGTERM)")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_the_launchers_death_is_noticed_by_a_stuck_process(reaper):
    parent = reaper.popen(["sleep", "600"])
    proc = _stuck(reaper, {"MLJOB_PARENT_PID": str(parent.pid)})
    parent.kill()
    parent.wait(10)
    assert wait_exit(proc, 60) == 143
    assert f"the launcher (pid {parent.pid}) is gone" in proc.stderr.read()


@pytest.mark.slow  # long: CI runs it in the slow step
def test_launcher_sigkilled_mid_training_leaves_no_replica(reaper, tmp_path):
    job = Job(reaper, tmp_path, "launcher_kill", env={"MLJOB_STOP_DEADLINE": "10"})
    job.wait_step(200)
    pids = {r["label"]: r["pid"] for r in job.record()["replicas"]}
    assert len(pids) == 4 and all(pid_alive(p) for p in pids.values())
    # Both workers die, and the launcher with them before it can restart them: the
    # chief's scheduled steps wait for a worker that never comes back.
    for label in ("worker-replica-0", "worker-replica-1"):
        os.kill(pids[label], signal.SIGKILL)
    job.proc.send_signal(signal.SIGKILL)
    job.proc.wait(10)
    # Each replica got SIGTERM from the kernel (PR_SET_PDEATHSIG) and watches the
    # launcher's PID; the ps goes at once, the chief cannot save without workers and
    # ends by its stop deadline.
    wait_for(lambda: not any(pid_alive(p) for p in pids.values()), 120,
             "every replica gone after the launcher's death")
