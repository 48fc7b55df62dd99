"""A job across hosts: chief, two workers and a ps each in its own network namespace
(tests/netns.py), talking gRPC over the test bridge at 10.213.0.x:2222, as separate
machines would. One worker's link is cut for a few seconds mid-training (a pulled
cable: packets dropped, no error); the job still trains every requested step.

Skipped, with the reason, where namespaces cannot be made (not root, no `ip netns`).
"""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

import pytest

from tests.support.common import ROOT, pid_alive
from tests.support.netns import test_hosts
from tests.support.trainer_runs import FAST, read, wait_exit, wait_for

TOTAL = 1200
PORT = 2222
ROLES = [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]   # host i runs ROLES[i]
CUT_SECONDS = 5


def _last_step(log) -> int:
    steps = re.findall(r"^step (\d+)/", read(log), re.M)
    return int(steps[-1]) if steps else 0


@pytest.mark.slow  # kept out of the default run's 15 minutes; CI runs it
def test_job_across_hosts_survives_a_cut_worker_link(reaper, tmp_path):
    with test_hosts(len(ROLES), reaper) as hosts:
        cluster = {"chief": [hosts[0].endpoint(PORT)],
                   "worker": [hosts[1].endpoint(PORT), hosts[2].endpoint(PORT)],
                   "ps": [hosts[3].endpoint(PORT)]}
        job = str(tmp_path / "job")
        args = [*FAST, "--job-dir", job, "--train-steps", str(TOTAL), "--checkpoint-every",
                "100", "--log-every", "50", "--eval-every", "0", "--steps-per-execution", "2"]
        procs, logs = [], []
        for host, (task_type, index) in reversed(list(zip(hosts, ROLES))):  # chief last
            env = {**os.environ, "PYTHONPATH": ROOT, "GRPC_FAIL_FAST": "use_caller",
                   "TF_CONFIG": json.dumps({"cluster": cluster, "environment": "cloud",
                                            "task": {"type": task_type, "index": index}})}
            log = tmp_path / f"{task_type}{index}.log"
            with open(log, "wb") as out:
                procs.append(hosts[host.index].popen(
                    [sys.executable, "-m", "trainer.task", *args], env=env, cwd=ROOT,
                    stdout=out, stderr=out))
            logs.append(log)
        chief, chief_log = procs[-1], logs[-1]
        for host, (task_type, index) in list(zip(hosts, ROLES))[1:]:
            log = tmp_path / f"{task_type}{index}.log"
            wait_for(lambda: f"at {host.endpoint(PORT)}" in read(log), 120,
                     f"{task_type} {index} serving at {host.endpoint(PORT)}")

        def reached(step):
            assert chief.poll() is None, read(chief_log)[-3000:]
            return _last_step(chief_log) >= step
        wait_for(lambda: reached(200), 300, "the chief at step 200", interval=0.1)
        hosts.link_down(hosts[2])          # worker 1 drops off the network ...
        time.sleep(CUT_SECONDS)
        back_at = _last_step(chief_log)
        hosts.link_up(hosts[2])            # ... and comes back
        assert chief.poll() is None and back_at < TOTAL  # the cut fell inside training
        assert wait_exit(chief, 400, chief_log) == 0, read(chief_log)[-3000:]
        assert re.search(rf"^training finished: step={TOTAL} ", read(chief_log), re.M)
        state = read(os.path.join(job, "checkpoints", "checkpoint"))
        assert state.startswith(f'model_checkpoint_path: "ckpt-{TOTAL}"')
        assert os.path.exists(os.path.join(job, "model", "saved_model.pb"))
        # The servers serve until stopped, then end promptly; stopped by PID.
        servers = procs[:-1]
        assert [p.poll() for p in servers] == [None] * len(servers)
        for proc in servers:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc, log in zip(servers, logs):
            assert wait_exit(proc, 30, log) == 143
            assert not pid_alive(proc.pid)
