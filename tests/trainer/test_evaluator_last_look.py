"""The evaluator's last look: stopped (SIGTERM), it evaluates the newest published
checkpoint once more before it exits. Kubeflow's Training Operator deletes a running
evaluator's pod the moment the chief succeeds, possibly before the evaluator has polled
the chief's final checkpoint; this is what lets that checkpoint be evaluated anyway
(docs/engine-kubeflow.md). A real evaluator process, its checkpoints published by hand
while it is held by SIGSTOP, so the SIGTERM surely comes before its next poll."""
from __future__ import annotations

import glob
import os
import signal

from tests.support.trainer_runs import FAST, lines, read, start, wait_exit, wait_for

EVALUATOR = '{"cluster": {}, "task": {"type": "evaluator", "index": 0}}'


def _publish(state_file, text: str) -> None:
    """Replace the `checkpoint` state file at once, as the chief does."""
    tmp = f"{state_file}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, state_file)


def test_sigterm_evaluates_the_newest_checkpoint_before_exiting(reaper, tmp_path):
    job = tmp_path / "job"
    chief = start(reaper, tmp_path / "chief.log",
                  [*FAST, "--train-steps", "40", "--checkpoint-every", "20",
                   "--eval-every", "0", "--job-dir", str(job)])
    assert wait_exit(chief, 240, tmp_path / "chief.log") == 0, read(tmp_path / "chief.log")
    state_file = job / "checkpoints" / "checkpoint"
    final_state = state_file.read_text()
    assert final_state.startswith('model_checkpoint_path: "ckpt-40"')
    # Back to the moment checkpoint 20 was the newest (ckpt-40's files stay unnamed).
    _publish(state_file, 'model_checkpoint_path: "ckpt-20"\n'
             'all_model_checkpoint_paths: "ckpt-20"\n')

    # An evaluator that never finishes by itself (the job it follows has 1000 steps).
    log = tmp_path / "eval.log"
    evaluator = start(reaper, log, [*FAST, "--train-steps", "1000", "--job-dir", str(job)],
                      tf_config=EVALUATOR)
    wait_for(lambda: lines(log, "eval step=20 ") or evaluator.poll() is not None, 180,
             "the evaluator to evaluate step 20")
    assert evaluator.poll() is None, read(log)

    os.kill(evaluator.pid, signal.SIGSTOP)
    try:
        _publish(state_file, final_state)  # the chief's final checkpoint...
        os.kill(evaluator.pid, signal.SIGTERM)  # ...and at once the pod's deletion
    finally:
        os.kill(evaluator.pid, signal.SIGCONT)
    assert wait_exit(evaluator, 60, log) == 0, read(log)

    evals = [line.split()[1] for line in lines(log, "eval step=")]
    assert evals == ["step=20", "step=40"], read(log)
    assert lines(log, "evaluator stopping: ") == [
        "evaluator stopping: got SIGTERM; last evaluated step=40"], read(log)
    from tensorboard.backend.event_processing import event_file_loader
    mine = glob.glob(str(job / "summaries" / "eval" / f"*.{evaluator.pid}.*"))
    assert len(mine) == 1
    tagged = {(v.tag, e.step) for e in event_file_loader.EventFileLoader(mine[0]).Load()
              for v in e.summary.value}
    assert ("metrics/accuracy", 40) in tagged and ("metrics/loss", 40) in tagged


def test_sigterm_with_nothing_new_exits_at_once(reaper, tmp_path):
    """No checkpoint at all: the last look finds nothing and the evaluator exits 0."""
    log = tmp_path / "eval.log"
    evaluator = start(reaper, log, [*FAST, "--train-steps", "40", "--job-dir",
                                    str(tmp_path / "job")], tf_config=EVALUATOR)
    wait_for(lambda: lines(log, "evaluator started: ") or evaluator.poll() is not None,
             180, "the evaluator to start")
    evaluator.send_signal(signal.SIGTERM)
    assert wait_exit(evaluator, 60, log) == 0, read(log)
    assert lines(log, "evaluator stopping: ") == [
        "evaluator stopping: got SIGTERM; last evaluated step=none"], read(log)
    assert lines(log, "eval step=") == []
