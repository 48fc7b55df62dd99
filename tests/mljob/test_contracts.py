"""The wire contracts: the progress line the trainer writes is the one the launcher reads,
and replica labels map both ways for the local runner and both engines."""
from __future__ import annotations

import pytest

from mljob import contracts
from submit import logs
from submit.runners import vertex


def test_progress_line_round_trips():
    line = contracts.progress_line(120, 2000, 0.44123, 0.87, 1234.5, 0.001)
    assert line == "step 120/2000 loss=0.4412 accuracy=0.8700 examples/s=1234.5 lr=0.001"
    assert contracts.parse_progress(line) == (120, 2000, 0.4412)
    progress = logs.Progress()
    assert progress.observe("master-replica-0", line)
    assert "step 120/2000" in progress.render() and "loss 0.4412" in progress.render()
    assert not progress.observe("worker-replica-0", line)  # the chief's line alone


@pytest.mark.parametrize("text", ["eval step=3 loss=0.1 accuracy=0.9", "step x/2 loss=1",
                                  "step 1/2 accuracy=0.5", "step ١/2 loss=1"])
def test_other_lines_are_not_progress(text):
    assert contracts.parse_progress(text) is None


def test_a_line_without_a_loss_is_progress_and_shows_each_optimizer_s_rate():
    line = contracts.progress_line(3, 6, None, {"d_loss": 0.5, "g_loss": 0.7}, 10.0,
                                   {"d_optimizer_lr": 3e-4, "g_optimizer_lr": 1e-4})
    assert line == ("step 3/6 d_loss=0.5000 g_loss=0.7000 examples/s=10.0 "
                    "d_optimizer_lr=0.0003 g_optimizer_lr=0.0001")
    progress = contracts.parse_progress(line)
    assert progress is not None and progress.step == 3 and progress.loss != progress.loss
    watched = logs.Progress()
    assert watched.observe("master-replica-0", line)
    assert "step 3/6" in watched.render() and "loss" not in watched.render()
    assert contracts.eval_line(6, None, {"d_loss": 0.5}) == "eval step=6 d_loss=0.5000"


@pytest.mark.parametrize("task_type, index, label, pool", [
    ("chief", 0, "master-replica-0", "workerpool0-0"),
    ("master", 0, "master-replica-0", "workerpool0-0"),
    ("worker", 3, "worker-replica-3", "workerpool1-3"),
    ("ps", 1, "ps-replica-1", "workerpool2-1"),
    ("evaluator", 0, "evaluator-replica-0", "workerpool3-0"),
])
def test_labels_map_to_task_types_and_vertex_pools(task_type, index, label, pool):
    assert contracts.replica_label(task_type, index) == label
    assert contracts.parse_label(label) == ("chief" if task_type == "master" else task_type,
                                            index)
    assert vertex.vertex_task_name(label) == pool
    assert vertex.replica_label(pool) == label


@pytest.mark.parametrize("label", ["master-replica-0\n", "chief-replica-0", "worker-replica-",
                                   "worker-replica-٣", "ps-replica-1/../x"])
def test_malformed_labels_are_refused(label):
    assert contracts.parse_label(label) is None
