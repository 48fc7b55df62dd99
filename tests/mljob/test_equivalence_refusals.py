"""Where a strategy cannot do what Keras's `fit` does, the run is refused before its
first step, in one line that names the feature, the strategy and what works instead; and
the export takes the trained weights by variable path, so a serving model that holds
more than the trained one (keras.io's FeatureSpace) exports, and one that cannot take
them fails before training."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from mljob.training import own_steps  # noqa: E402
from mljob.training.config import Program, RunConfig, Serving  # noqa: E402
from mljob.training.errors import TrainingError, UsageError  # noqa: E402
from mljob.training.loop import Replica, steps_per_execution  # noqa: E402
from tests.mljob import equivalence_models as zoo  # noqa: E402


class _Coordinator:
    """Stands for a ps run's coordinator: the refusals come before it is used."""


def _replica(model_fn, coordinator=None, **program):
    return Replica(tf.distribute.get_strategy(), coordinator,
                   Program(model_fn=model_fn, train_dataset_fn=lambda c: None, **program),
                   RunConfig(job_dir="unused", train_steps=4, batch_size=8))


def test_a_model_s_own_train_step_is_refused_under_ps_naming_multiworker():
    with pytest.raises(UsageError) as info:
        _replica(zoo.model_fn("custom_train_step"), _Coordinator())
    message = str(info.value)
    assert "\n" not in message and "train_step" in message
    assert "parameter servers" in message and "MultiWorkerMirroredStrategy" in message


def test_fit_arguments_a_custom_step_would_ignore_are_refused():
    with pytest.raises(UsageError, match="compile the model in model_fn with them"):
        _replica(zoo.model_fn("custom_train_step"), loss="mae")


def test_an_unbuilt_second_optimizer_is_refused_for_several_replicas():
    model = zoo.model_fn("gan")()
    model.g_optimizer = type(model.g_optimizer)(0.01)  # not built, as keras.io leaves it
    program = Program(model_fn=lambda: model, train_dataset_fn=lambda c: None)
    with pytest.raises(UsageError, match="not built"):
        own_steps.check(model, program, parameter_servers=False, replicas=2)
    own_steps.check(model, program, parameter_servers=False, replicas=1)  # one node: fine


@pytest.mark.parametrize("options", [{"clipnorm": 1.0}, {"weight_decay": 0.01},
                                     {"clipvalue": 0.5}, {"amsgrad": True}])
def test_local_steps_asked_for_an_optimizer_they_cannot_run_exactly_are_refused(options):
    import keras

    def model_fn():
        model = zoo.model_fn("sgd-none")()
        model.compile(optimizer=keras.optimizers.Adam(0.01, **options), loss="mse")
        return model
    program = Program(model_fn=model_fn, train_dataset_fn=lambda c: None)
    with pytest.raises(UsageError) as info:
        Replica(tf.distribute.get_strategy(), _Coordinator(), program,
                RunConfig(job_dir="unused", ps_local_steps=True))
    assert next(iter(options)) in str(info.value) and "turn it off" in str(info.value)


@pytest.mark.parametrize("option", [{"use_ema": True}, {"gradient_accumulation_steps": 2}])
def test_ema_and_accumulation_are_refused_under_ps(option):
    import keras

    def model_fn():
        model = zoo.model_fn("sgd-none")()
        model.compile(optimizer=keras.optimizers.SGD(0.01, **option), loss="mse")
        return model
    with pytest.raises(UsageError) as info:
        _replica(model_fn, _Coordinator())
    assert f"{next(iter(option))} cannot run under parameter servers" in str(info.value)


def test_compile_steps_per_execution_is_honoured_unless_the_config_sets_its_own():
    model = zoo.model_fn("sgd-none")()
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=7)
    assert steps_per_execution(model, RunConfig()) == 7
    assert steps_per_execution(model, RunConfig(steps_per_execution=3)) == 3


# ---- the export, by variable path -------------------------------------------------


def _feature_space_models():
    """keras.io's "Structured data classification with FeatureSpace": training on the
    encoded features, exporting keras.Model(raw inputs, model(feature_space(inputs)))."""
    import keras
    rows = {"age": np.array([20., 35., 50., 65., 80.], "float32"),
            "city": np.array(["a", "b", "a", "c", "b"])}
    space = keras.utils.FeatureSpace(
        features={"age": keras.utils.FeatureSpace.float_normalized(),
                  "city": keras.utils.FeatureSpace.string_categorical(num_oov_indices=0)},
        output_mode="concat")
    space.adapt(tf.data.Dataset.from_tensor_slices(rows).batch(5))

    def predictions(encoded):
        hidden = keras.layers.Dense(4, activation="relu", name="hidden")(encoded)
        return keras.layers.Dense(1, activation="sigmoid", name="out")(hidden)

    def model_fn():  # keras.io's training_model
        encoded = space.get_encoded_features()
        return keras.Model(encoded, predictions(encoded))

    def serving_fn():  # keras.io's inference_model
        return keras.Model(space.get_inputs(), predictions(space.get_encoded_features()))
    return model_fn, serving_fn, space, rows


def _on_a_thread(fn):
    from mljob.training.export import _on_clean_thread
    out = []
    _on_clean_thread(lambda: out.append(fn()))
    return out[0]


def test_a_feature_space_serving_model_exports_the_trained_weights(tmp_path):
    from mljob.training import export as export_lib
    model_fn, serving_fn, space, rows = _feature_space_models()
    trained = _on_a_thread(model_fn)
    for w in trained.weights:
        w.assign(np.random.default_rng(1).normal(size=w.shape).astype("float32"))
    weights = {w.path: np.asarray(w.numpy()) for w in trained.weights}
    export_lib.check_serving_model(serving_fn, {p: v.shape for p, v in weights.items()})
    url = export_lib.export(serving_fn, weights, str(tmp_path / "model"),
                            Serving(key=None))
    loaded = export_lib.load(url)
    got = loaded.signatures["serving_default"](age=tf.constant([[50.]]),
                                               city=tf.constant([["a"]]))
    encoded = space({"age": np.array([[50.]], "float32"), "city": np.array([["a"]])})
    want = trained(encoded)
    np.testing.assert_allclose(np.asarray(next(iter(got.values()))), np.asarray(want),
                               rtol=1e-5)


def test_a_serving_model_without_the_trained_variables_fails_before_training():
    import keras
    from mljob.training import export as export_lib

    def other():
        inputs = keras.Input((3,))
        return keras.Model(inputs, keras.layers.Dense(2, name="elsewhere")(inputs))
    with pytest.raises(TrainingError) as info:
        export_lib.check_serving_model(other, {"hidden/kernel": (3, 4),
                                               "hidden/bias": (4,)})
    assert "elsewhere/kernel" in str(info.value) and "\n" not in str(info.value)
    assert "hidden/kernel" in str(info.value)  # what was trained, to compare


def test_a_serving_model_may_hold_a_part_of_the_trained_one():
    """A GAN trains a generator and a discriminator and serves the generator."""
    from mljob.training import export as export_lib
    gan = export_lib.built(zoo.model_fn("gan"))  # named as a run names it
    shapes = {w.path: tuple(w.shape) for w in gan.weights}
    export_lib.check_serving_model(lambda: zoo.model_fn("gan")().generator, shapes)


def test_classify_answers_what_predict_answers_after_serving_outputs(tmp_path):
    """A model that outputs logits, served as probabilities (Serving.outputs): TF
    Serving's Classify scores are those probabilities, as :predict's are."""
    import keras
    from mljob.training import export as export_lib
    from tests.support.tf_serving import LABELS, example, features

    def build():
        keras.utils.set_random_seed(2)
        inputs = keras.Input((4,), name="x")
        return keras.Model(inputs, keras.layers.Dense(3, name="logits")(inputs))
    serving = Serving(inputs={"x": tf.TensorSpec([None, 4], tf.float32)}, key=None,
                      outputs=lambda logits: {"probabilities": tf.nn.softmax(logits)},
                      inference_signature={"classify": LABELS})
    model = build()
    url = export_lib.export(build, {w.path: w.numpy() for w in model.weights},
                            str(tmp_path / "model"), serving,
                            inference_signature=dict(serving.inference_signature))
    loaded = export_lib.load(url)
    rows = features(3)
    predicted = loaded.signatures["serving_default"](x=tf.constant(rows))["probabilities"]
    classified = loaded.signatures["classification"](
        inputs=tf.constant([example(r) for r in rows]))["scores"]
    np.testing.assert_allclose(np.asarray(classified), np.asarray(predicted), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(classified).sum(axis=1), 1.0, rtol=1e-5)


def test_a_model_s_own_predict_step_is_what_the_export_answers(tmp_path):
    import keras
    from mljob.training import export as export_lib

    class Calibrated(keras.Model):
        def predict_step(self, data):
            x = data[0] if isinstance(data, tuple) else data
            return tf.sigmoid(self(x, training=False) * 2.0)

    def build():
        keras.utils.set_random_seed(5)
        inputs = keras.Input((4,), name="x")
        return Calibrated(inputs, keras.layers.Dense(1, name="out")(inputs))
    model = build()
    url = export_lib.export(build, {w.path: w.numpy() for w in model.weights},
                            str(tmp_path / "model"), Serving(key=None),
                            inference_signature={"regress": True})
    rows = np.ones((3, 4), np.float32)
    loaded = export_lib.load(url)
    got = loaded.signatures["serving_default"](x=tf.constant(rows))
    want = np.asarray(model.predict(rows, verbose=0))
    np.testing.assert_allclose(np.asarray(got["outputs"]), want, rtol=1e-5)
    # TF Serving's Regress answers the same (a tf.Example a row).
    from tests.support.tf_serving import example
    regressed = loaded.signatures["regression"](
        inputs=tf.constant([example(r) for r in rows]))["outputs"]
    np.testing.assert_allclose(np.asarray(regressed), want.reshape(-1), rtol=1e-5)
