"""The parameter-server speed levers (off by default; bench/ps_speed.py measures them):
each still trains a real cluster to an exported model above chance."""
from __future__ import annotations

import signal

import pytest

from tests.support.common import free_ports, pid_alive
from tests.support.trainer_runs import FAST, cluster, export_accuracy, lines, read, start, \
    tf_config, wait_exit


@pytest.mark.slow
def test_local_steps_in_bfloat16_train_sharded_variables_over_two_ps(reaper, tmp_path):
    spec = cluster(free_ports(4), workers=1, ps=2)
    args = [*FAST, "--train-steps", "300", "--checkpoint-every", "300", "--eval-every", "300",
            "--log-every", "100", "--job-dir", str(tmp_path / "job"), "--ps-shards", "2",
            "--ps-local-steps", "--ps-wire-dtype", "bfloat16"]
    servers = [start(reaper, tmp_path / f"ps{i}.log", args, tf_config=tf_config(spec, "ps", i))
               for i in range(2)]
    servers.append(start(reaper, tmp_path / "w0.log", args,
                         tf_config=tf_config(spec, "worker", 0)))
    chief = start(reaper, tmp_path / "chief.log", args, tf_config=tf_config(spec, "chief"))
    assert wait_exit(chief, 300, tmp_path / "chief.log") == 0, read(tmp_path / "chief.log")
    assert lines(tmp_path / "chief.log", "training finished: step=300")
    # The worker's copy is the whole kernel, put together from the two shards.
    assert "hidden/kernel=2" in lines(tmp_path / "chief.log", "variables:")[0]
    assert export_accuracy(str(tmp_path / "job" / "model")) > 0.6
    for proc in servers:
        proc.send_signal(signal.SIGTERM)
    for proc in servers:
        assert wait_exit(proc, 15) == 0
        assert not pid_alive(proc.pid)


def _ps_run(reaper, tmp_path, name: str, *extra: str) -> dict:
    """chief + 1 worker + 1 ps, the MLP for 100 steps; the final checkpoint's weights."""
    import tensorflow as tf

    spec = cluster(free_ports(3), workers=1, ps=1)
    job = tmp_path / name
    args = [*FAST, "--train-steps", "100", "--checkpoint-every", "100", "--eval-every", "0",
            "--log-every", "20", "--job-dir", str(job), *extra]
    servers = [start(reaper, tmp_path / f"{name}-{kind}.log", args,
                     tf_config=tf_config(spec, kind)) for kind in ("ps", "worker")]
    chief = start(reaper, tmp_path / f"{name}-chief.log", args,
                  tf_config=tf_config(spec, "chief"))
    assert wait_exit(chief, 300, tmp_path / f"{name}-chief.log") == 0, \
        read(tmp_path / f"{name}-chief.log")
    for proc in servers:
        proc.send_signal(signal.SIGTERM)
        assert wait_exit(proc, 15) == 0
    reader = tf.train.load_checkpoint(str(job / "checkpoints" / "ckpt-100"))
    return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()
            if "model" in key or "optimizer" in key}


@pytest.mark.slow
def test_local_steps_with_one_worker_train_as_step_by_step(reaper, tmp_path):
    # With one worker nobody else updates the ps between a function's read and its
    # write: the weights and Adam's moments after 100 steps must be the same training.
    import numpy as np

    local = _ps_run(reaper, tmp_path, "local", "--ps-local-steps")
    step_by_step = _ps_run(reaper, tmp_path, "steps", "--no-ps-local-steps")
    assert local.keys() == step_by_step.keys() and len(local) >= 8
    for key, value in step_by_step.items():
        np.testing.assert_allclose(local[key], value, rtol=1e-3, atol=1e-5, err_msg=key)
