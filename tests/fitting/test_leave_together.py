"""A normal end under MultiWorkerMirroredStrategy is no crash: a worker whose script ends
while the chief's goes on (its export, the rest of its script) waits for the chief, so
the chief's coordination service never takes it for crashed ("The tasks have
crashed..."), and neither task logs the other's death. Two real TensorFlow processes on
gRPC, started by mljob's launcher as every runner starts a replica."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mljob import coordination
from tests.support.common import ROOT, free_ports

SCRIPT = '''\
import os, sys, time
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    v = tf.Variable(1.0)
strategy.run(lambda: v.assign_add(1.0))
print("trained", flush=True)
if strategy.cluster_resolver.task_type == sys.argv[1]:
    time.sleep(float(sys.argv[2]))  # past the coordination service's heartbeat timeout
print("ended", flush=True)
'''
DEATH = ("tasks have crashed", "stopped sending heartbeats", "leader task was preempted")


@pytest.mark.slow
@pytest.mark.parametrize("later", ["chief", "worker"])
def test_no_task_is_taken_for_crashed_when_one_ends_later(tmp_path, reaper, later):
    (tmp_path / "lingering.py").write_text(SCRIPT)
    ports = free_ports(2)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    procs = {}
    for task in ("chief", "worker"):
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}",
               "TF_CPP_MIN_LOG_LEVEL": "0",
               "TF_CONFIG": json.dumps({"cluster": cluster,
                                        "task": {"type": task, "index": 0}})}
        procs[task] = reaper.popen(
            [sys.executable, "-m", "mljob.fitting.launch", "lingering", later, "25"],
            cwd=tmp_path, env=env, stdout=(tmp_path / f"{task}.log").open("w"),
            stderr=subprocess.STDOUT)
    for task, proc in procs.items():
        assert proc.wait(timeout=300) == 0, (tmp_path / f"{task}.log").read_text()
    for task in procs:
        out = (tmp_path / f"{task}.log").read_text()
        assert "ended" in out, out
        assert not [line for line in out.splitlines() if any(d in line for d in DEATH)], out


def test_nothing_to_wait_for_outside_a_multi_worker_cluster():
    # This process has no coordination service (and maybe no TensorFlow): no barrier.
    assert coordination.leave_together("nobody", timeout_seconds=1) is False
