"""A plain loss function is called as `model.compile`'s wrapper calls it: keras.io's
Siamese network, whose contrastive loss takes `(batch,)` labels against `(batch, 1)`
outputs. Called on the labels as the dataset gives them, the product broadcasts to
`(batch, batch)`: another objective (an eval loss 0.256 where `evaluate` said 0.213)."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras  # noqa: E402

from mljob.training.config import Program, RunConfig  # noqa: E402
from mljob.training.evaluator import evaluate  # noqa: E402
from mljob.training.loop import Replica  # noqa: E402
from mljob.training.losses import Objective  # noqa: E402
from tests.mljob import keras_io_models as zoo  # noqa: E402

STEPS, BATCH = 4, 16


def test_the_eval_loss_is_model_evaluate_s_on_the_same_weights():
    model = zoo.siamese()
    model.fit(zoo.siamese_dataset(BATCH), epochs=1, verbose=0)  # weights off their start
    expected = model.evaluate(zoo.siamese_dataset(BATCH), verbose=0, return_dict=True)
    loss, metrics = evaluate(model, zoo.siamese_dataset(BATCH), Objective.of(model))
    assert loss == pytest.approx(expected["loss"], rel=1e-5, abs=1e-6)
    assert metrics["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-6)


def test_training_ends_where_fit_ends():
    reference = zoo.siamese()
    reference.fit(zoo.siamese_dataset(BATCH).repeat(), steps_per_epoch=STEPS, epochs=1,
                  verbose=0, shuffle=False)
    program = Program(model_fn=zoo.siamese,
                      train_dataset_fn=lambda ctx: zoo.siamese_dataset(ctx.batch_size)
                      .repeat())
    replica = Replica(tf.distribute.get_strategy(), None, program,
                      RunConfig(job_dir="unused", train_steps=STEPS, batch_size=BATCH,
                                steps_per_execution=STEPS))
    replica.start_input(program.train_dataset_fn, seed=0)
    replica.result([replica.run_chunk(STEPS)])
    for ours, theirs in zip(replica.model.weights, reference.weights, strict=True):
        assert np.allclose(np.asarray(ours), np.asarray(theirs), atol=1e-5), ours.path


def test_a_function_s_labels_are_brought_to_the_outputs_rank():
    seen = []

    def per_example(y_true, y_pred):
        seen.append((tuple(y_true.shape), y_true.dtype))
        return keras.ops.square(y_true - y_pred)

    objective = Objective(per_example)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    spec = (tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None], tf.int64))
    objective.build(model, spec)
    y = tf.constant([0, 1, 1, 0], tf.int64)
    out = tf.constant([[0.5], [0.5], [1.5], [0.0]])
    loss, _ = objective.loss(y, out)
    assert seen[-1] == ((4, 1), tf.float32)
    assert float(loss) == pytest.approx(np.mean([0.25, 0.25, 0.25, 0.0]))
