"""Real local clusters: every replica its own `python -m trainer.task` process, gRPC on
127.0.0.1, the MLP on the packaged sample. Each test checks the job trains, exports a
model well above chance, and that no replica outlives it."""
from __future__ import annotations

import pytest

import glob
import os
import re
import signal

from tests.support.common import free_ports, pid_alive
from tests.support.trainer_runs import FAST, cluster, export_accuracy, lines, read, start, tf_config, \
    wait_exit, wait_for

STEPS = ["--train-steps", "300", "--checkpoint-every", "150", "--eval-every", "300",
         "--log-every", "100"]
CHIEF_TIMEOUT = 240


def _job_args(tmp_path, *extra):
    return [*FAST, *STEPS, "--job-dir", str(tmp_path / "job"), *extra]


def _check_trained(tmp_path, chief_log, strategy: str) -> None:
    assert lines(chief_log, "training started:")[0].startswith(
        f"training started: strategy={strategy} step=0 train_steps=300"), read(chief_log)
    assert lines(chief_log, "training finished: step=300")
    export = tmp_path / "job" / "model"
    assert lines(chief_log, "exported model to") == [f"exported model to {export}"]
    assert export_accuracy(str(export)) > 0.6


def test_ps_cluster_of_chief_two_workers_one_ps_from_the_seed_flags(reaper, tmp_path):
    # The original samples' flags: worker 0 of --worker-hosts is the chief.
    chief_port, w0_port, w1_port, ps_port = free_ports(4)
    hosts = ["--worker-hosts", ",".join(f"127.0.0.1:{p}" for p in (chief_port, w0_port,
                                                                    w1_port)),
             "--ps-hosts", f"127.0.0.1:{ps_port}"]
    launcher = reaper.python("-c", "import time; time.sleep(600)")
    watched = {"MLJOB_PARENT_PID": str(launcher.pid)}
    args = _job_args(tmp_path, *hosts)
    ps = start(reaper, tmp_path / "ps0.log", [*args, "--job-name", "ps", "--task-index", "0"],
               env=watched)
    worker0 = start(reaper, tmp_path / "w0.log",
                    [*args, "--job-name", "worker", "--task-index", "1"])
    worker1 = start(reaper, tmp_path / "w1.log",
                    [*args, "--job-name", "worker", "--task-index", "2"], env=watched)
    chief = start(reaper, tmp_path / "chief.log",
                  [*args, "--job-name", "worker", "--task-index", "0"])
    assert wait_exit(chief, CHIEF_TIMEOUT, tmp_path / "chief.log") == 0, \
        read(tmp_path / "chief.log")
    _check_trained(tmp_path, tmp_path / "chief.log", "ps")
    assert lines(tmp_path / "chief.log", "eval step=300")
    # a normal run logs no error: TensorFlow's (E0000 ...) nor anyone's ERROR, as the
    # bfloat16 wire on a CPU without AVX-512 did in every worker (oneDNN's fallback)
    for log in ("chief.log", "w0.log", "w1.log", "ps0.log"):
        errors = [line for line in read(tmp_path / log).splitlines()
                  if re.match(r"E[0-9]{4} ", line) or "ERROR" in line]
        assert errors == [], (log, errors)
    # The first step's line, then every --log-every steps: under ps the first step's
    # line waits until the next chunk is scheduled (on the other worker), never lost.
    steps = [line.split()[1] for line in lines(tmp_path / "chief.log", "step ")]
    assert steps == ["1/300", "100/300", "200/300", "300/300"], steps
    assert os.path.exists(tmp_path / "job" / "checkpoints" / "ckpt-300.index")

    # Servers serve until stopped (exit 143): SIGTERM ends one, the launcher's death the
    # others.
    assert ps.poll() is None and worker0.poll() is None and worker1.poll() is None
    worker0.send_signal(signal.SIGTERM)
    assert wait_exit(worker0, 15, tmp_path / "w0.log") == 143
    assert "stopping: got SIGTERM" in read(tmp_path / "w0.log")
    launcher.kill()
    launcher.wait(5)
    assert wait_exit(ps, 15, tmp_path / "ps0.log") == 143
    assert wait_exit(worker1, 15, tmp_path / "w1.log") == 143
    assert "is gone" in read(tmp_path / "ps0.log")
    for proc in (chief, ps, worker0, worker1):
        assert not pid_alive(proc.pid)


@pytest.mark.slow  # long: CI runs it in the slow step
def test_two_ps_shard_variables_and_master_is_a_chief(reaper, tmp_path):
    spec = cluster(free_ports(4), workers=1, ps=2, chief="master")
    args = _job_args(tmp_path, "--ps-shards", "2")
    servers = [start(reaper, tmp_path / f"ps{i}.log", args,
                     tf_config=tf_config(spec, "ps", i)) for i in range(2)]
    servers.append(start(reaper, tmp_path / "w0.log", args,
                         tf_config=tf_config(spec, "worker", 0)))
    chief = start(reaper, tmp_path / "chief.log", args, tf_config=tf_config(spec, "master"))
    assert wait_exit(chief, CHIEF_TIMEOUT, tmp_path / "chief.log") == 0, \
        read(tmp_path / "chief.log")
    _check_trained(tmp_path, tmp_path / "chief.log", "ps")
    shards = lines(tmp_path / "chief.log", "variables:")[0]
    assert "hidden/kernel=2" in shards and "logits/kernel=2" in shards, shards
    assert lines(tmp_path / "chief.log", "ps updates: local steps (")  # the default
    # The checkpoint of sharded variables holds the whole, unsharded kernel.
    assert glob.glob(str(tmp_path / "job" / "checkpoints" / "ckpt-300.data-*"))
    for proc in servers:
        proc.send_signal(signal.SIGTERM)
    for proc in servers:
        assert wait_exit(proc, 15) == 143  # stopped, as a ps or worker always is
        assert not pid_alive(proc.pid)


@pytest.mark.slow  # long: CI runs it in the slow step
def test_multiworker_sigterm_saves_then_restart_resumes(reaper, tmp_path):
    # Run 1: a long job, one step per call; SIGTERM to the chief once it is under way.
    spec = cluster(free_ports(2), workers=1, ps=0)
    long_run = _job_args(tmp_path, "--train-steps", "100000", "--steps-per-execution", "1")
    worker = start(reaper, tmp_path / "w0-1.log", long_run,
                   tf_config=tf_config(spec, "worker"))
    chief = start(reaper, tmp_path / "chief-1.log", long_run,
                  tf_config=tf_config(spec, "chief"))
    wait_for(lambda: lines(tmp_path / "chief-1.log", "step 100/") or chief.poll() is not None,
             CHIEF_TIMEOUT, "the multiworker chief to reach step 100")
    chief.send_signal(signal.SIGTERM)
    assert wait_exit(chief, 60, tmp_path / "chief-1.log") == 143, read(tmp_path / "chief-1.log")
    # The worker learns of the stop from the chunk's all-reduce and saves the same step.
    assert wait_exit(worker, 60, tmp_path / "w0-1.log") == 143, read(tmp_path / "w0-1.log")
    assert "(another replica was stopped)" in read(tmp_path / "w0-1.log")
    state = read(tmp_path / "job" / "checkpoints" / "checkpoint")
    saved = int(state.split('"ckpt-', 1)[1].split('"', 1)[0])
    assert 100 <= saved < 300, state

    # Run 2: the same job restarted (new ports) resumes from that checkpoint and finishes.
    spec = cluster(free_ports(2), workers=1, ps=0)
    args = _job_args(tmp_path)
    worker = start(reaper, tmp_path / "w0.log", args, tf_config=tf_config(spec, "worker"))
    chief = start(reaper, tmp_path / "chief.log", args, tf_config=tf_config(spec, "chief"))
    assert wait_exit(chief, CHIEF_TIMEOUT, tmp_path / "chief.log") == 0, \
        read(tmp_path / "chief.log")
    assert wait_exit(worker, 60, tmp_path / "w0.log") == 0, read(tmp_path / "w0.log")
    started = lines(tmp_path / "chief.log", "training started:")[0]
    assert started.startswith(f"training started: strategy=multiworker step={saved} "
                              "train_steps=300 ") and "replicas=2" in started
    assert lines(tmp_path / "chief.log", "training finished: step=300")
    assert export_accuracy(str(tmp_path / "job" / "model")) > 0.6
    # Only the chief writes: the worker's saves went to temp dirs it deleted.
    assert sorted(os.listdir(tmp_path / "job")) == ["checkpoints", "model", "summaries"]
    assert not pid_alive(worker.pid) and not pid_alive(chief.pid)


def test_evaluator_follows_the_chief_and_exits_after_the_final_checkpoint(reaper, tmp_path):
    args = [*FAST, "--train-steps", "400", "--checkpoint-every", "100", "--log-every", "100",
            "--eval-every", "0", "--job-dir", str(tmp_path / "job")]
    evaluator = start(reaper, tmp_path / "eval.log", args,
                      tf_config='{"cluster": {}, "task": {"type": "evaluator", "index": 0}}')
    chief = start(reaper, tmp_path / "chief.log", args)
    assert wait_exit(chief, CHIEF_TIMEOUT, tmp_path / "chief.log") == 0
    assert wait_exit(evaluator, 120, tmp_path / "eval.log") == 0, read(tmp_path / "eval.log")
    evals = lines(tmp_path / "eval.log", "eval step=")
    assert evals and evals[-1].startswith("eval step=400 "), read(tmp_path / "eval.log")
    assert lines(tmp_path / "eval.log", "evaluator finished: step=400")
    accuracy = float(evals[-1].rsplit("accuracy=", 1)[1])
    assert accuracy > 0.6

    from tensorboard.backend.event_processing import event_file_loader
    mine = glob.glob(str(tmp_path / "job" / "summaries" / "eval" / f"*.{evaluator.pid}.*"))
    assert len(mine) == 1, os.listdir(tmp_path / "job" / "summaries" / "eval")
    tagged = {(v.tag, e.step) for e in event_file_loader.EventFileLoader(mine[0]).Load()
              for v in e.summary.value}
    assert ("metrics/accuracy", 400) in tagged and ("metrics/loss", 400) in tagged
    assert not glob.glob(str(tmp_path / "job" / "summaries" / "train" / f"*.{evaluator.pid}.*"))
