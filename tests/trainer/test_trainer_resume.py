"""Checkpoints carry a job across failures: SIGKILL and resume, SIGTERM saves and exits
143, a finished job is not trained again, an unreadable newest checkpoint is skipped."""
from __future__ import annotations

import contextlib
import glob
import io
import os
import re
import signal

import pytest

from trainer import task
from tests.support.trainer_runs import FAST, lines, read, start, wait_exit, wait_for

TOTAL = 6000


def _checkpoint_steps(job) -> list[int]:
    return sorted(int(re.search(r"ckpt-(\d+)\.index$", p).group(1))
                  for p in glob.glob(os.path.join(job, "checkpoints", "ckpt-*.index")))


def _state_step(job) -> int:
    text = read(os.path.join(job, "checkpoints", "checkpoint"))
    return int(re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', text, re.M).group(1))


@pytest.mark.slow  # long: CI runs it in the slow step
def test_killed_chief_resumes_and_sigterm_saves_then_exits_143(reaper, tmp_path):
    job = str(tmp_path / "job")
    # One step per call and frequent checkpoints: the run lasts long enough to be killed
    # part-way on any machine, and checkpoints land often.
    args = [*FAST, "--job-dir", job, "--train-steps", str(TOTAL), "--checkpoint-every", "200",
            "--eval-every", "0", "--log-every", "200", "--steps-per-execution", "1"]

    first = start(reaper, tmp_path / "run1.log", args)
    wait_for(lambda: _checkpoint_steps(job) or first.poll() is not None, 120,
             "the first checkpoint")
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    # The newest index is the checkpoint a resume starts from: the kill may land after
    # the index and before the state file names it (mljob/training/checkpoints.py).
    killed_at = max(_checkpoint_steps(job))
    assert 0 < killed_at < TOTAL, read(tmp_path / "run1.log")

    second = start(reaper, tmp_path / "run2.log", args)
    wait_for(lambda: lines(tmp_path / "run2.log", "step ") or second.poll() is not None,
             120, "the resumed run's first step")
    started = lines(tmp_path / "run2.log", "training started:")[0]
    assert f" step={killed_at} train_steps={TOTAL} " in started
    first_step = lines(tmp_path / "run2.log", "step ")[0]
    assert first_step.startswith(f"step {killed_at + 1}/{TOTAL} ")
    second.send_signal(signal.SIGTERM)
    assert wait_exit(second, 60, tmp_path / "run2.log") == 143
    assert "error: stopped at step" in read(tmp_path / "run2.log")
    stopped_at = _state_step(job)
    assert killed_at < stopped_at < TOTAL

    # The last run may pack steps: the step count, not the packing, is what resumes.
    third = start(reaper, tmp_path / "run3.log",
                  [*args[:-1], str(task_default_packing())])
    assert wait_exit(third, 240, tmp_path / "run3.log") == 0, read(tmp_path / "run3.log")
    assert f" step={stopped_at} " in lines(tmp_path / "run3.log", "training started:")[0]
    assert lines(tmp_path / "run3.log", f"training finished: step={TOTAL} ")
    assert _state_step(job) == TOTAL
    assert os.path.exists(os.path.join(job, "model", "saved_model.pb"))


def task_default_packing() -> int:
    from mljob.training import STEPS_PER_EXECUTION
    return STEPS_PER_EXECUTION


def _run(args) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = task.main(args)
    return status, out.getvalue()


def test_finished_job_is_not_trained_again(memfs):
    job = "memory://jobs/done"
    args = [*FAST, "--job-dir", job, "--train-steps", "60", "--checkpoint-every", "30",
            "--log-every", "30"]
    assert _run(args)[0] == 0

    status, out = _run(args)
    assert status == 0
    assert not [line for line in out.splitlines() if line.startswith("step ")]
    assert "training finished: step=60 already_done=true" in out
    assert f"model already exported at {job}/model" in out

    memfs.rm("/jobs/done/model", recursive=True)
    status, out = _run(args)
    assert status == 0 and f"exported model to {job}/model" in out
    assert memfs.exists("/jobs/done/model/saved_model.pb")


def test_unreadable_newest_checkpoint_falls_back_to_the_previous(memfs):
    job = "memory://jobs/corrupt"
    args = [*FAST, "--job-dir", job, "--checkpoint-every", "30", "--log-every", "30"]
    assert _run([*args, "--train-steps", "60"])[0] == 0
    data = "/jobs/corrupt/checkpoints/ckpt-60.data-00000-of-00001"
    memfs.pipe_file(data, memfs.cat_file(data)[:100])  # truncated

    status, out = _run([*args, "--train-steps", "90"])
    assert status == 0, out
    assert "warning: checkpoint ckpt-60 cannot be read" in out
    assert "training started: strategy=single step=30 train_steps=90" in out
    assert "training finished: step=90 " in out
    # The unreadable checkpoint is gone; the state file names the new newest.
    names = {os.path.basename(p) for p in memfs.ls("/jobs/corrupt/checkpoints", detail=False)}
    assert "ckpt-60.index" in names  # rewritten by this run at step 60
    state = memfs.cat_file("/jobs/corrupt/checkpoints/checkpoint").decode()
    assert state.startswith('model_checkpoint_path: "ckpt-90"')


@pytest.mark.parametrize("flag", ["--train-steps", "--checkpoint-every"])
def test_step_flags_reject_nonsense(capsys, flag):
    assert task.main([flag, "-5"]) == 2
    assert capsys.readouterr().err.startswith(f"error: argument {flag}")
