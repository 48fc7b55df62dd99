"""Every private Keras name mljob uses (mljob/training/keras_private.py), reached on real
Keras objects: a Keras release that moves one fails here, naming it, instead of deep in
a training run. `setup.py` pins `keras` to the minor range this passes with."""
from __future__ import annotations

import importlib
import inspect

import pytest

tf = pytest.importorskip("tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

MODULES = ["keras.src.tree", "keras.src.backend.common.global_state",
           "keras.src.losses.loss", "keras.src.losses.losses",
           "keras.src.trainers.compile_utils", "keras.src.utils.naming",
           "keras.src.trainers.data_adapters.array_slicing",
           "keras.src.trainers.data_adapters.tf_dataset_adapter",
           "keras.src.utils.python_utils"]


@pytest.mark.parametrize("module", MODULES)
def test_each_private_module_imports(module):
    try:
        importlib.import_module(module)
    except ImportError as exc:
        pytest.fail(f"Keras moved {module} ({exc}): update mljob/training/keras_private.py")


def _adam():
    weight = keras.Variable(np.ones((2, 3), np.float32), name="w")
    optimizer = keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(
        0.1, 10, 0.5))
    optimizer.build([weight])
    return optimizer, weight


def _model():
    inputs = keras.Input((3,))
    outputs = keras.layers.Dense(2, kernel_regularizer=keras.regularizers.L2(0.1))(inputs)
    return keras.Model(inputs, outputs)


def _compiled_parts():
    from mljob.training.keras_private import compile_utils
    y_true, y_pred = keras.KerasTensor((None, 2)), keras.KerasTensor((None, 2))
    loss = compile_utils.CompileLoss("mse", None)
    loss.build(y_true, y_pred)
    metrics = compile_utils.CompileMetrics(["mae"], ["mse"])
    metrics.build(y_true, y_pred)
    return loss, metrics


def _check(name: str):
    from mljob.training import keras_private as kp
    if name == "adam_slots":
        optimizer, weight = _adam()
        moments, velocities = kp.adam_slots(optimizer, [weight])
        assert moments[0].shape == velocities[0].shape == (2, 3)
    elif name == "learning_rate_setting":
        optimizer, _ = _adam()
        assert isinstance(kp.learning_rate_setting(optimizer),
                          keras.optimizers.schedules.LearningRateSchedule)
    elif name == "flat_losses":
        loss, _ = _compiled_parts()
        (path, fn, weight, output), = kp.flat_losses(loss)
        assert isinstance(fn, keras.losses.Loss)
    elif name == "flat_metrics":
        _, metrics = _compiled_parts()
        plain, weighted = kp.flat_metrics(metrics)
        assert plain[0].metrics and weighted[0].metrics
    elif name == "auc_from_logits":
        assert kp.auc_from_logits(keras.metrics.AUC(from_logits=True))
        assert not kp.auc_from_logits(keras.metrics.AUC())
    elif name == "all_layers":
        model = _model()
        assert model in kp.all_layers(model) and len(kp.all_layers(model)) == 3
    elif name == "regularization_losses":
        assert len(kp.regularization_losses(_model())) == 1
    elif name == "initial_epoch":
        assert kp.initial_epoch(_model()) is None
    elif name == "tensorboard_profiles":
        assert kp.tensorboard_profiles(keras.callbacks.TensorBoard(profile_batch=2))
        assert not kp.tensorboard_profiles(keras.callbacks.TensorBoard())
    elif name == "fresh_object_names":
        keras.layers.Dense(1)
        with kp.fresh_object_names():
            assert keras.layers.Dense(1).name == "dense"
    elif name == "loss_functions":
        wrapped = kp.LossFunctionWrapper(lambda t, p: (t - p) ** 2,
                                         name=kp.get_object_name(lambda: 0))
        assert float(wrapped(np.zeros(4), np.ones((4, 1)))) == 1.0
        assert float(kp.unscale_loss_for_distribution(
            kp.scale_loss_for_distribution(2.0))) == 2.0
        assert kp.tree.flatten({"a": [1, 2]}) == [1, 2]
    elif name in ("make_function", "model_strategy", "symbolic_build",
                  "replace_symbolic_build"):
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
        with strategy.scope():
            model = _model()
            model.compile("sgd", "mse")
        assert kp.model_strategy(model) is strategy
        assert callable(kp.make_function(model, model.train_step))
        kp.symbolic_build(model, (np.zeros((2, 3), np.float32), np.zeros((2, 2), np.float32)))
        assert model.optimizer.built
        built = []
        kp.replace_symbolic_build(model, lambda **kw: built.append(kw))
        model._maybe_symbolic_build(data_batch=None)
        assert built == [{"data_batch": None}]
    elif name == "fit_data":
        (x,), (vx,) = kp.train_validation_split((np.arange(10),), validation_split=0.2)
        assert len(x) == 8 and len(vx) == 2
        mapped = kp.make_class_weight_map_fn({0: 1.0, 1: 3.0})(
            tf.zeros((2, 1)), tf.constant([0, 1]))
        assert list(np.asarray(mapped[2])) == [1.0, 3.0]
        assert kp.pythonify_logs({"a": {"b": np.float32(1)}}) == {"b": 1.0}
    elif name == "ps_workers":
        from tensorflow.python.distribute import parameter_server_strategy_v2 as ps
        assert "self._num_workers =" in inspect.getsource(
            ps.ParameterServerStrategyV2Extended)
    else:
        raise AssertionError(name)


NAMES = ["adam_slots", "learning_rate_setting", "flat_losses", "flat_metrics",
         "auc_from_logits", "all_layers", "regularization_losses", "initial_epoch",
         "tensorboard_profiles", "fresh_object_names", "loss_functions", "ps_workers",
         "make_function", "model_strategy", "symbolic_build", "replace_symbolic_build",
         "fit_data"]


@pytest.mark.parametrize("name", NAMES)
def test_each_private_name_is_where_mljob_reads_it(name):
    try:
        _check(name)
    except (AttributeError, ImportError, TypeError, ValueError, AssertionError) as exc:
        pytest.fail(f"Keras {keras.__version__} moved what keras_private.{name} reads "
                    f"({type(exc).__name__}: {exc}): update mljob/training/keras_private.py")


def test_every_helper_is_checked():
    from mljob.training import keras_private
    helpers = {n for n in keras_private.__all__
               if inspect.isfunction(getattr(keras_private, n))
               and getattr(keras_private, n).__module__ == keras_private.__name__}
    assert helpers <= set(NAMES) | {"loss_functions"}, helpers - set(NAMES)


# mljob.fitting waits for Keras's model module by its name, importing no Keras: the one
# line outside keras_private that names a private module, checked below.
MODEL_MODULE_LINE = 'MODEL_MODULE = "keras.src.models.model"'


def test_the_launcher_waits_for_the_module_keras_defines_model_in():
    from mljob import fitting
    from mljob.training import keras_private
    assert fitting.MODEL_MODULE == keras_private.MODEL_MODULE == keras.Model.__module__, (
        f"Keras {keras.__version__} defines keras.Model in {keras.Model.__module__}: "
        "update mljob/fitting/__init__.py and mljob/training/keras_private.py")


def test_no_module_of_mljob_reaches_keras_s_private_names_but_this_one():
    import pathlib
    import re
    root = pathlib.Path(__file__).resolve().parents[2]
    private = re.compile(r"keras\.src|\._(flat_losses|flat_metrics|flat_weighted_metrics|"
                         r"momentums|velocities|get_variable_index|get_regularization_losses"
                         r"|from_logits|initial_epoch|flatten_layers|start_batch|stop_batch)\b")
    found = []
    for folder in ("mljob", "trainer", "submit", "predict"):
        for path in (root / folder).rglob("*.py"):
            if path.name == "keras_private.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if private.search(code) and not code.lstrip().startswith(("`", "(")) \
                        and code.strip() != MODEL_MODULE_LINE:
                    found.append(f"{path.relative_to(root)}:{number}")
    assert not found, found
