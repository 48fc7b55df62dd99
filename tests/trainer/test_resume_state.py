"""A resume restores the whole training state, not only the step: the model's weights
and Adam's state (iteration count and both moments) continue from the checkpoint's.

Training 30 steps, then resuming for one more, gives ckpt-30 and ckpt-31; one Adam step
bounds how far ckpt-31 may be from ckpt-30, which a resume from freshly initialised
weights or a fresh optimizer cannot meet."""
from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from tests.support.trainer_runs import FAST, run_task

LEARNING_RATE = 1e-3
BETA_2 = 0.999  # Keras's Adam default, as the trainer builds it


def _variables(job: str, step: int) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(os.path.join(job, "checkpoints", f"ckpt-{step}"))
    return {name.split("/.ATTRIBUTES")[0]: reader.get_tensor(name)
            for name in reader.get_variable_to_shape_map() if "/.ATTRIBUTES/" in name}


def test_resume_continues_the_weights_and_the_optimizer_state(tmp_path):
    job = str(tmp_path / "job")
    args = [*FAST, "--job-dir", job, "--checkpoint-every", "30", "--log-every", "30",
            "--eval-every", "0", "--learning-rate", str(LEARNING_RATE),
            "--lr-schedule", "constant"]  # Adam's slots from 2 (1 is its rate variable)
    run_task([*args, "--train-steps", "30"])
    out = run_task([*args, "--train-steps", "31"])
    assert "training started: strategy=single step=30 train_steps=31" in out
    before, after = _variables(job, 30), _variables(job, 31)

    assert int(before["step"]) == 30 and int(after["step"]) == 31
    # Adam's first variable counts its updates: 31 only if the count was restored.
    assert int(before["optimizer/0"]) == 30 and int(after["optimizer/0"]) == 31

    weights = sorted(k for k in before if k.startswith("model/"))
    assert len(weights) == 4
    for name in weights:
        moved = np.abs(after[name] - before[name]).max()
        # One Adam step moves a weight by at most about the learning rate; 30 steps
        # from the initial weights moved them much further than that.
        assert moved <= 2 * LEARNING_RATE, (name, moved)

    # Slots 2.. are (m, v) per weight; v_31 = beta_2 * v_30 + (1 - beta_2) * g^2 is at
    # least beta_2 * v_30 everywhere only when v_30 was restored.
    second_moments = [k for k in before if k.startswith("optimizer/")
                      and int(k.split("/")[1]) >= 2 and int(k.split("/")[1]) % 2 == 1]
    assert len(second_moments) == 4
    for name in second_moments:
        assert before[name].max() > 0, name
        np.testing.assert_array_less(BETA_2 * before[name] - 1e-12, after[name] + 1e-12)
