"""Adam's update fused by XLA (`mljob.training.updates`): the single node's steps with it
end with the same weights, moments and step count as Keras's own update, and every
optimizer setting it does not implement keeps Keras's update."""
from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from mljob.training import updates


def _model(seed=3):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(3)(hidden))


def _train(fused: bool, steps: int = 6, learning_rate=1e-2):
    model = _model()
    opt = keras.optimizers.Adam(learning_rate)
    opt.build(model.trainable_variables)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(steps, 16, 6)), tf.float32)
    y = tf.constant(rng.integers(0, 3, size=(steps, 16)))

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                yb, model(xb, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        if not (fused and updates.apply_adam(opt, model.trainable_variables, grads)):
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    for i in range(steps):
        step(x[i], y[i])
    return model, opt


@pytest.mark.parametrize("learning_rate", [1e-2, keras.optimizers.schedules.ExponentialDecay(
    1e-2, decay_steps=2, decay_rate=0.5)])
def test_fused_steps_equal_keras_steps(learning_rate):
    keras_model, keras_opt = _train(False, learning_rate=learning_rate)
    fused_model, fused_opt = _train(True, learning_rate=learning_rate)
    assert int(fused_opt.iterations) == int(keras_opt.iterations) == 6
    for a, b in zip(fused_model.get_weights(), keras_model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(fused_opt.variables, keras_opt.variables, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
    # and the weights moved: the comparison is not of two untrained models
    assert not np.allclose(fused_model.get_weights()[0], _model().get_weights()[0])


@pytest.mark.parametrize("make", [
    lambda: keras.optimizers.Adam(amsgrad=True),
    lambda: keras.optimizers.Adam(weight_decay=1e-4),
    lambda: keras.optimizers.Adam(clipnorm=1.0),
    lambda: keras.optimizers.Adam(global_clipnorm=1.0),
    lambda: keras.optimizers.Adam(use_ema=True),
    lambda: keras.optimizers.Adam(gradient_accumulation_steps=2),
    lambda: keras.optimizers.AdamW(),
    lambda: keras.optimizers.SGD(),
])
def test_what_it_does_not_implement_keeps_keras_update(make):
    model = _model()
    assert updates.fusable(keras.optimizers.Adam(), model.trainable_variables)
    assert not updates.fusable(make(), model.trainable_variables)


def test_a_constrained_variable_keeps_keras_update():
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(2, kernel_constraint=keras.constraints.NonNeg())(inputs)
    model = keras.Model(inputs, outputs)
    assert not updates.fusable(keras.optimizers.Adam(), model.trainable_variables)
