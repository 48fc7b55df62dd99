"""A job pinned to fewer cores (taskset, a container's cpuset) sizes its workers and their
threads to the cores it may use, not to the machine's count."""
import os
import subprocess
import sys

import pytest

from tests.support.common import ROOT


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_usable_cores_follow_the_affinity():
    code = ("from mljob import procs; from submit.prediction.job import machine_workers; "
            "print(procs.usable_cores(), machine_workers()[0])")
    pinned = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, preexec_fn=lambda: os.sched_setaffinity(0, {0}),
                            check=True)
    assert pinned.stdout.split() == ["1", "1"]
    whole = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           cwd=ROOT, check=True)
    assert int(whole.stdout.split()[0]) == len(os.sched_getaffinity(0))
