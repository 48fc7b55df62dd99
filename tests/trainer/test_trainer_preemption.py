"""Preemption under MultiWorkerMirroredStrategy: SIGTERM to any replica stops every
replica at the same chunk boundary, all of them take part in one save and exit 143, and
the restarted job resumes from exactly that step. Real processes on 127.0.0.1, the MLP
on the packaged sample."""
from __future__ import annotations

import pytest

import os
import re
import signal

from tests.support.common import free_ports, pid_alive
from tests.support.trainer_runs import FAST, cluster, lines, read, start, tf_config, wait_exit, wait_for

TIMEOUT = 240


def _logged_steps(log) -> list[int]:
    return [int(re.match(r"step (\d+)/", line).group(1)) for line in lines(log, "step ")]


def _checkpoints(job) -> list[str]:
    return sorted(n for n in os.listdir(os.path.join(job, "checkpoints"))
                  if n.endswith(".index"))


def _stopped_at(log) -> int:
    match = re.search(r"^error: stopped at step (\d+) \((.*?)\); checkpoint saved",
                      read(log), re.M)
    assert match, read(log)[-3000:]
    return int(match.group(1))


@pytest.mark.slow  # long: CI runs it in the slow step
def test_sigterm_to_a_worker_stops_every_replica_at_one_saved_step(reaper, tmp_path):
    job = str(tmp_path / "job")
    # Packed steps (chunks of 5) and no periodic checkpoint: the only checkpoint before
    # the end is the one the preemption saves.
    common = [*FAST, "--job-dir", job, "--steps-per-execution", "5", "--log-every", "50",
              "--eval-every", "0", "--checkpoint-every", "0"]
    run1 = [*common, "--train-steps", "100000"]
    spec = cluster(free_ports(2), workers=1, ps=0)
    worker = start(reaper, tmp_path / "w0-1.log", run1, tf_config=tf_config(spec, "worker"))
    chief = start(reaper, tmp_path / "chief-1.log", run1, tf_config=tf_config(spec, "chief"))
    wait_for(lambda: [s for s in _logged_steps(tmp_path / "chief-1.log") if s >= 100]
             or chief.poll() is not None or worker.poll() is not None,
             TIMEOUT, "the multiworker chief to reach step 100")
    assert chief.poll() is None and worker.poll() is None, read(tmp_path / "chief-1.log")
    last_logged = _logged_steps(tmp_path / "chief-1.log")[-1]
    worker.send_signal(signal.SIGTERM)

    # Both stop: the worker was asked, the chief learns it from the chunk's all-reduce.
    assert wait_exit(worker, 60, tmp_path / "w0-1.log") == 143, read(tmp_path / "w0-1.log")
    assert wait_exit(chief, 60, tmp_path / "chief-1.log") == 143, \
        read(tmp_path / "chief-1.log")
    saved = _stopped_at(tmp_path / "chief-1.log")
    assert _stopped_at(tmp_path / "w0-1.log") == saved
    assert "(got SIGTERM)" in read(tmp_path / "w0-1.log")
    assert "(another replica was stopped)" in read(tmp_path / "chief-1.log")
    assert saved >= last_logged and saved % 5 == 0, (saved, last_logged)
    assert _checkpoints(job) == [f"ckpt-{saved}.index"]
    assert f'model_checkpoint_path: "ckpt-{saved}"' in read(
        os.path.join(job, "checkpoints", "checkpoint"))

    # The restarted job (new ports) resumes from exactly that step and finishes.
    total = saved + 60
    run2 = [*common, "--train-steps", str(total)]
    spec = cluster(free_ports(2), workers=1, ps=0)
    worker = start(reaper, tmp_path / "w0-2.log", run2, tf_config=tf_config(spec, "worker"))
    chief = start(reaper, tmp_path / "chief-2.log", run2, tf_config=tf_config(spec, "chief"))
    assert wait_exit(chief, TIMEOUT, tmp_path / "chief-2.log") == 0, \
        read(tmp_path / "chief-2.log")
    assert wait_exit(worker, 60, tmp_path / "w0-2.log") == 0, read(tmp_path / "w0-2.log")
    started = lines(tmp_path / "chief-2.log", "training started:")[0]
    assert started.startswith(f"training started: strategy=multiworker step={saved} "
                              f"train_steps={total} "), started
    assert _logged_steps(tmp_path / "chief-2.log")[0] == saved + 1
    assert lines(tmp_path / "chief-2.log", f"training finished: step={total} ")
    assert _checkpoints(job)[-1] == f"ckpt-{total}.index" or \
        f"ckpt-{total}.index" in _checkpoints(job)
    assert os.path.exists(os.path.join(job, "model", "saved_model.pb"))
    for proc in (worker, chief):
        assert not pid_alive(proc.pid)
