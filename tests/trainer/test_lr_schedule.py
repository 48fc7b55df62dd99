"""--lr-schedule: the step size over a run (trainer.fit.learning_rate_schedule).

cosine goes from --learning-rate at step 0 down to 0 at --train-steps and stays there,
keyed on Adam's step count, so a resumed job takes the rate of the step it resumes at;
constant is the number itself. The flag's default is the model's (trainer.task
LR_SCHEDULES) and a name not in its choices is a one-line usage error."""
from __future__ import annotations

import math
import os
import shutil

import numpy as np
import pytest

from trainer import fit, task
from tests.support.trainer_runs import FAST, run_task

PEAK, TOTAL = 0.002, 2000


def _rates(kind: str, steps, peak=PEAK, total=TOTAL) -> list[float]:
    schedule = fit.learning_rate_schedule(kind, peak, total)
    return [float(np.asarray(schedule(s))) if callable(schedule) else schedule
            for s in steps]


def test_cosine_starts_at_the_rate_halves_midway_and_ends_at_zero():
    first, quarter, mid, last, end, after = _rates(
        "cosine", [0, TOTAL // 4, TOTAL // 2, TOTAL - 1, TOTAL, 3 * TOTAL])
    assert first == pytest.approx(PEAK, rel=1e-6)
    assert quarter == pytest.approx(PEAK * (1 + math.cos(math.pi / 4)) / 2, rel=1e-5)
    assert mid == pytest.approx(PEAK / 2, rel=1e-5)
    # the last step still moves, a little; from --train-steps on, nothing
    assert 0 < last < PEAK * 1e-5
    assert end == pytest.approx(0, abs=1e-12) and after == pytest.approx(0, abs=1e-12)


def test_cosine_never_rises_and_stays_within_the_rate():
    rates = _rates("cosine", range(0, TOTAL + 1, 50))
    assert all(b <= a for a, b in zip(rates, rates[1:], strict=False))
    assert all(0 <= r <= PEAK * (1 + 1e-6) for r in rates)
    assert rates[0] > rates[1]  # and it does decay from the first steps


def test_constant_is_the_number_itself():
    assert fit.learning_rate_schedule("constant", PEAK, TOTAL) == PEAK


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown learning-rate schedule 'linear'"):
        fit.learning_rate_schedule("linear", PEAK, TOTAL)


def test_defaults_by_model_and_the_flag_wins():
    for model in task.MODELS:
        args = task.parser().parse_args(["--model", model])
        assert task.lr_schedule_of(args) == task.LR_SCHEDULES[model]
        assert task.learning_rate_of(args) == task.LEARNING_RATES[model]
    args = task.parser().parse_args(["--model", "mlp", "--lr-schedule", "constant"])
    assert task.lr_schedule_of(args) == "constant"
    # the measured defaults (bench/results/time_to_accuracy_sweep_*_lr.json)
    assert (task.LEARNING_RATES, task.LR_SCHEDULES) == (
        {"cnn": 2e-3, "mlp": 1e-2}, {"cnn": "cosine", "mlp": "cosine"})
    assert set(task.SCHEDULES) == set(fit.SCHEDULES)


@pytest.mark.parametrize("argv", [["--lr-schedule", "linear"], ["--lr_schedule=Cosine"],
                                  ["--lr-schedule", ""]])
def test_unknown_schedule_is_a_one_line_usage_error(capsys, argv):
    assert task.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: argument --lr-schedule: invalid choice")
    assert err.count("\n") == 1 and "constant" in err and "cosine" in err


def _logged_rates(job: str) -> dict[int, float]:
    from tensorboard.backend.event_processing import event_accumulator
    train = event_accumulator.EventAccumulator(os.path.join(job, "summaries", "train"),
                                               size_guidance={"tensors": 0})
    train.Reload()
    import tensorflow as tf
    return {e.step: float(tf.make_ndarray(e.tensor_proto))
            for e in train.Tensors("optimizer/learning_rate")}


def test_a_resumed_cosine_job_goes_on_at_its_step_rate(tmp_path):
    """A job stopped after its step-20 checkpoint and resumed logs at step 30 the rate
    of step 30 of 40 (the step count came back with the checkpoint), not of step 10."""
    rate, steps = 0.01, 40
    first, resumed = str(tmp_path / "first"), str(tmp_path / "resumed")
    args = [*FAST, "--lr-schedule", "cosine", "--learning-rate", str(rate),
            "--train-steps", str(steps), "--log-every", "10", "--checkpoint-every", "20",
            "--eval-every", "0"]
    out = run_task([*args, "--job-dir", first])
    assert "learning_rate=0.01 lr_schedule=cosine" in out
    expected = {s: rate * (1 + math.cos(math.pi * s / steps)) / 2 for s in (10, 20, 30)}
    logged = _logged_rates(first)
    for s, value in expected.items():
        assert logged[s] == pytest.approx(value, rel=1e-4), (s, logged)
    # the same job stopped right after its step-20 checkpoint
    os.makedirs(os.path.join(resumed, "checkpoints"))
    for name in os.listdir(os.path.join(first, "checkpoints")):
        if name.startswith("ckpt-20."):
            shutil.copy(os.path.join(first, "checkpoints", name),
                        os.path.join(resumed, "checkpoints", name))
    out = run_task([*args, "--job-dir", resumed])
    assert "step=20 train_steps=40" in out
    logged = _logged_rates(resumed)
    assert 10 not in logged
    assert logged[30] == pytest.approx(expected[30], rel=1e-4), logged
