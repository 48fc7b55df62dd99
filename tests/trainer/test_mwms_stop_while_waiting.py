"""A MultiWorkerMirrored worker waiting for a chief that never comes stops at SIGTERM
within seconds (before: TensorFlow's coordination service held the signal, and the
worker was still waiting 75 s later)."""
from __future__ import annotations

import signal
import time

from mljob.procs import free_ports
from mljob.errors import EXIT_PREEMPTED
from tests.support.trainer_runs import FAST, cluster, read, start, tf_config, wait_exit, \
    wait_for


def test_a_worker_waiting_for_its_chief_stops_at_sigterm(reaper, tmp_path):
    spec = cluster(free_ports(2), workers=1, ps=0)  # the chief is never started
    log = tmp_path / "worker.log"
    proc = start(reaper, log, [*FAST, "--job-dir", str(tmp_path / "job"),
                               "--train-steps", "10"],
                 tf_config=tf_config(spec, "worker", 0))
    wait_for(lambda: "worker-replica-0 waiting for the chief at " in read(log)
             or proc.poll() is not None, 120, "the worker to wait for its chief")
    time.sleep(3)
    assert proc.poll() is None, read(log)[-2000:]
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    status = wait_exit(proc, 20, log)
    assert time.monotonic() - sent < 10
    assert status == EXIT_PREEMPTED
    assert "error: stopped while waiting for the chief (got SIGTERM)" in read(log)
