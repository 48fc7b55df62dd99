"""Process identity on real processes: a zombie is not alive, and a PID the system gave
to a new process (same command line, same environment) is not the recorded one."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from mljob import procs
from tests.support.common import ROOT

# Runs as PID 1 of a new PID namespace (with its own /proc): starts a process, records
# it, ends it, makes the kernel hand the same PID to an identical process, and checks.
REUSE = r"""
import os, subprocess, sys, time
from mljob import procs
env = dict(os.environ, MLJOB_JOB_ID="job01")
argv = ["sleep", "300"]
first = subprocess.Popen(argv, env=env)
deadline = time.monotonic() + 5  # exec may still be under way
while procs.command_line(first.pid) != argv:
    assert time.monotonic() < deadline, procs.command_line(first.pid)
    time.sleep(0.005)
recorded = procs.stamp(first.pid)
assert procs.is_ours(first.pid, recorded, env={"MLJOB_JOB_ID": "job01"})
first.kill()
first.wait()
time.sleep(0.05)  # the next process starts at least a few clock ticks later
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(first.pid - 1))
second = subprocess.Popen(argv, env=env)
assert second.pid == first.pid, (first.pid, second.pid)
deadline = time.monotonic() + 5
while procs.command_line(second.pid) != argv:
    assert time.monotonic() < deadline, procs.command_line(second.pid)
    time.sleep(0.005)
assert procs.environment(second.pid)["MLJOB_JOB_ID"] == "job01"
print("reused" if not procs.is_ours(second.pid, recorded, env={"MLJOB_JOB_ID": "job01"})
      else "mistaken", flush=True)
print("new" if procs.is_ours(second.pid, procs.stamp(second.pid),
                             env={"MLJOB_JOB_ID": "job01"}) else "lost", flush=True)
second.kill()
second.wait()
"""


def _pid_namespaces() -> bool:
    if not shutil.which("unshare") or not sys.platform.startswith("linux"):
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.skipif(not _pid_namespaces(), reason="needs PID namespaces (unshare)")
def test_a_reused_pid_is_not_the_recorded_process(reaper):
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = reaper.popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable,
                         "-c", REUSE], env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.split() == ["reused", "new"]


def test_a_zombie_is_not_alive_and_not_ours(reaper):
    proc = reaper.popen([sys.executable, "-c", "import time; time.sleep(300)"],
                        env={**os.environ, "MLJOB_JOB_ID": "job01"})
    recorded = procs.stamp(proc.pid)
    assert procs.pid_alive(proc.pid)
    assert procs.is_ours(proc.pid, recorded, env={"MLJOB_JOB_ID": "job01"})
    assert recorded["cmdline"][1:] == ["-c", "import time; time.sleep(300)"]
    os.kill(proc.pid, 9)  # not reaped: a zombie until wait()
    deadline = time.monotonic() + 10
    while procs.pid_alive(proc.pid):
        assert time.monotonic() < deadline, "the killed process never became a zombie"
        time.sleep(0.01)
    assert os.path.exists(f"/proc/{proc.pid}") or sys.platform != "linux"  # still there
    assert not procs.is_ours(proc.pid, recorded, env={"MLJOB_JOB_ID": "job01"})
    assert procs.command_line(proc.pid) is None and procs.environment(proc.pid) == {}
    proc.wait()
    assert not procs.pid_alive(proc.pid) and procs.started(proc.pid) is None
    assert procs.stamp(proc.pid) is None


def test_older_records_in_clock_ticks_still_match(reaper):
    proc = reaper.popen(["sleep", "300"], env={**os.environ, "MLJOB_JOB_ID": "job01"})
    recorded = procs.stamp(proc.pid)
    ticks = round(recorded["started"] * os.sysconf("SC_CLK_TCK"))
    older = {"start_ticks": ticks, "cmdline": recorded["cmdline"]}
    assert procs.is_ours(proc.pid, older, env={"MLJOB_JOB_ID": "job01"})
    assert not procs.is_ours(proc.pid, {**older, "start_ticks": ticks + 1},
                             env={"MLJOB_JOB_ID": "job01"})


@pytest.mark.parametrize("pid", [0, -1, True, 2 ** 22 + 1])
def test_no_such_pid_is_not_alive(pid):
    assert not procs.pid_alive(pid)
    assert procs.stamp(pid, wait=0) is None
