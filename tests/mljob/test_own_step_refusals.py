"""A model that brings its own `train_step` (keras.io's "Customizing what happens in
fit()") trains with what its `compile` gave it: `fit`'s `class_weight`, like its
`loss=`, `optimizer=` and `metrics=`, would be silently ignored, so it is refused before
training, in one line naming it."""
from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

from mljob import cluster, training  # noqa: E402
from tests.mljob import equivalence_models as zoo  # noqa: E402


def _fit(tmp_path, **kwargs):
    x, y, _ = zoo.data("custom_train_step")
    return training.fit(
        zoo.model_fn("custom_train_step"),
        lambda ctx: tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat(),
        info=cluster.from_environment({}),
        config=training.RunConfig(job_dir=str(tmp_path / "job"), train_steps=2,
                                  batch_size=8, eval_every=0), **kwargs)


def test_class_weight_with_a_model_s_own_train_step_is_refused_in_one_line(tmp_path):
    with pytest.raises(training.UsageError) as info:
        _fit(tmp_path, class_weight={0: 1.0, 1: 2.0})
    message = str(info.value)
    assert "\n" not in message
    assert "CustomModel" in message and "class_weight=" in message
    assert not (tmp_path / "job" / "checkpoints").exists()  # refused before training


def test_without_class_weight_the_same_model_trains(tmp_path):
    assert _fit(tmp_path) == 0
