"""The parameter-server speed levers (off by default; bench/ps_speed.py measures them):
each still trains a real cluster to an exported model above chance."""
from __future__ import annotations

import signal

import pytest

from tests.support.common import free_ports, pid_alive
from tests.support.trainer_runs import FAST, cluster, export_accuracy, lines, read, start, \
    tf_config, wait_exit


@pytest.mark.slow
def test_cached_reads_train_sharded_variables_over_two_ps(reaper, tmp_path):
    spec = cluster(free_ports(4), workers=1, ps=2)
    args = [*FAST, "--train-steps", "300", "--checkpoint-every", "300", "--eval-every", "300",
            "--log-every", "100", "--job-dir", str(tmp_path / "job"), "--ps-shards", "2",
            "--ps-cache-reads"]
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
