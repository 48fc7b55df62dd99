"""Small calls compiled (predict.compiled, the server's --compile_small_calls): a shape
seen twice is compiled in the background, by TensorFlow Lite's interpreter where the
graph converts and otherwise by XLA, and then answers, within the tolerance, as
TensorFlow's executor did, for the bundled export and for users' Keras models
(preprocessing layer, custom layer, two outputs; convolutions); a graph TensorFlow
Lite cannot run, answers otherwise or more slowly goes to XLA; graphs neither can
compile, answers that differ, large calls and large batches stay with the executor."""
import logging
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from predict import compiled, model as models, serving
from tests.support.predict_models import images, saved_model_export


class Scale(keras.layers.Layer):
    """A user's custom layer: one weight per feature."""

    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1],), initializer="ones")

    def call(self, x):
        return x * self.w


@pytest.fixture(scope="module")
def user_export(tmp_path_factory):
    """A model written the way keras.io writes one, exported with Keras's own export."""
    rows = np.random.default_rng(3).random((200, 6)).astype("float32") * 50
    norm = keras.layers.Normalization()
    norm.adapt(rows)
    inputs = keras.Input((6,), name="features")
    x = keras.layers.Dense(16, activation="relu")(Scale()(norm(inputs)))
    model = keras.Model(inputs, {"kind": keras.layers.Dense(3, activation="softmax",
                                                            name="kind")(x),
                                 "price": keras.layers.Dense(1, name="price")(x)})
    path = str(tmp_path_factory.mktemp("user") / "model")
    model.export(path, format="tf_saved_model", verbose=False)
    return path, rows


@pytest.fixture(scope="module")
def bundled_export(tmp_path_factory):
    return saved_model_export(str(tmp_path_factory.mktemp("bundled") / "model"), seed=4)


def _executor_answer(path, batch):
    fn = tf.saved_model.load(path).signatures["serving_default"]
    return {k: v.numpy() for k, v in fn(**{k: tf.constant(v) for k, v in batch.items()})
            .items()}


def _served(path):
    model = serving._load(path, tags=None, compile_small_calls=True)
    model._compiled["serving_default"]._small_call_s = 10.0  # a loaded machine is slow
    return model


def _twice_then_compiled(model, batch):
    answers = [model.predict(batch) for _ in range(2)]
    compiled.drain()
    return answers


def _close(got, want):
    assert set(got) == set(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        if value.dtype.kind == "f":
            np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-6)
        else:
            np.testing.assert_array_equal(got[name], value)


@pytest.mark.parametrize("rows", [1, 5])
def test_a_user_models_shape_seen_twice_is_compiled_and_answers_the_same(user_export,
                                                                         rows):
    path, data = user_export
    model = _served(path)
    calls = model._compiled["serving_default"]
    batch = {"features": data[:rows]}
    for answer in _twice_then_compiled(model, batch):
        _close(answer, _executor_answer(path, batch))
    assert calls.off is None and calls.call(((rows, 6),)) is not None
    assert calls.engines == {((rows, 6),): compiled.LITE} and calls.lite_off is None
    other = {"features": data[50:50 + rows]}  # new values through the compiled call
    _close(model.predict(other), _executor_answer(path, other))
    assert calls.call(((rows + 1, 6),)) is None  # only the shape seen twice


def test_the_bundled_exports_compiled_call_keeps_the_key_and_classes(bundled_export):
    model = _served(bundled_export)
    imgs, keys = images(3, seed=8), np.array([7, 8, 9], np.int64)
    batch = {"image": imgs, "key": keys}
    _twice_then_compiled(model, batch)
    calls = model._compiled["serving_default"]
    fast = calls.call(((3, 784), (3,)))
    assert fast is not None and calls.engines[((3, 784), (3,))] == compiled.LITE
    got = fast([batch[n] for n in calls._names])  # arrays in, arrays out
    want = _executor_answer(bundled_export, batch)
    _close(got, want)
    assert got["key"].tolist() == [7, 8, 9]
    other = {"image": images(3, seed=9), "key": np.array([1, 2, 3], np.int64)}
    _close(model.predict(other), _executor_answer(bundled_export, other))


def test_a_shape_seen_once_or_a_large_batch_or_a_slow_call_is_not_compiled(user_export,
                                                                          monkeypatch):
    path, data = user_export
    model = _served(path)
    calls = model._compiled["serving_default"]
    model.predict({"features": data[:2]})
    monkeypatch.setattr(compiled, "MAX_ROWS", 3)
    _twice_then_compiled(model, {"features": data[:4]})
    calls._small_call_s = 0.0  # every call is "large"
    _twice_then_compiled(model, {"features": data[:3]})
    assert calls._calls == {} and calls.off is None
    # a stream of ever new shapes is counted up to a bound, never without end
    calls._small_call_s = 10.0
    monkeypatch.setattr(compiled, "MAX_COUNTED", 3)
    for width in range(7, 14):
        calls.seen(((1, width),), [], {}, 0.0)
    assert len(calls._counts) == 3 and ((1, 9),) not in calls._counts


def test_the_server_flag_turns_it_off_and_local_predictions_never_compile(user_export):
    path, _ = user_export
    assert not serving._load(path, tags=None, compile_small_calls=False)._compiled
    assert not models.load(path)._compiled  # predict local / batch: the executor only
    from predict import flags
    assert flags.parse(["--model_dir=x"]).compile_small_calls is True
    assert flags.parse(["--model_dir=x", "--compile_small_calls=false"]) \
        .compile_small_calls is False


def test_a_graph_neither_can_compile_stays_with_the_executor(tmp_path, caplog):
    class Described(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def serve(self, x):
            return {"text": tf.strings.as_string(x), "total": tf.reduce_sum(x, axis=1)}

    module = Described()
    tf.saved_model.save(module, str(tmp_path), signatures={"serving_default": module.serve})
    model = _served(str(tmp_path))
    batch = {"x": np.array([[1.5, 2.0]], np.float32)}
    with caplog.at_level(logging.INFO, logger="predict.compiled"):
        answers = _twice_then_compiled(model, batch)
        answers.append(model.predict(batch))
    calls = model._compiled["serving_default"]
    assert calls.off is not None and calls.off.startswith("XLA cannot compile it")
    assert "; TensorFlow Lite: TensorFlow Lite cannot convert it" in calls.off
    assert [a["total"].tolist() for a in answers] == [[3.5]] * 3
    assert answers[-1]["text"].tolist() == [[b"1.500000", b"2.000000"]]
    lines = [r.getMessage() for r in caplog.records if r.name == "predict.compiled"]
    assert len(lines) == 1 and "left to TensorFlow's executor" in lines[0]


def test_a_graph_tensorflow_lite_cannot_run_is_compiled_with_xla(tmp_path, caplog):
    """A cumulative product has no TensorFlow Lite built-in op; XLA compiles it."""
    class Products(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
        def serve(self, x):
            return {"y": tf.math.cumprod(x, axis=1)}

    module = Products()
    tf.saved_model.save(module, str(tmp_path), signatures={"serving_default": module.serve})
    model = _served(str(tmp_path))
    batch = {"x": np.array([[1.5, 2.0, 3.0]], np.float32)}
    with caplog.at_level(logging.INFO, logger="predict.compiled"):
        _twice_then_compiled(model, batch)
    calls = model._compiled["serving_default"]
    assert calls.off is None and calls.engines == {((1, 3),): "XLA"}
    assert calls.lite_off.startswith("TensorFlow Lite cannot convert it")
    np.testing.assert_allclose(model.predict(batch)["y"], [[1.5, 3.0, 9.0]])
    lines = [r.getMessage() for r in caplog.records if r.name == "predict.compiled"]
    assert len(lines) == 1 and "compiled with XLA, not TensorFlow Lite" in lines[0]


def test_tensorflow_lite_answering_otherwise_or_slower_or_missing_leaves_it_to_xla(
        user_export, monkeypatch):
    path, data = user_export
    batch = {"features": data[:2]}
    model = _served(path)
    calls = model._compiled["serving_default"]
    build = calls._build_lite

    def off_by_a_little(arrays):
        call = build(arrays)
        return lambda inputs: {k: v * 1.001 if v.dtype.kind == "f" else v
                               for k, v in call(inputs).items()}
    monkeypatch.setattr(calls, "_build_lite", off_by_a_little)
    _twice_then_compiled(model, batch)
    assert calls.engines == {((2, 6),): "XLA"} and "off by up to" in calls.lite_off
    _close(model.predict(batch), _executor_answer(path, batch))
    _twice_then_compiled(model, {"features": data[:3]})  # the signature's, every shape
    assert calls.engines[((3, 6),)] == "XLA"

    model = _served(path)
    calls = model._compiled["serving_default"]
    monkeypatch.setattr(compiled, "LITE_SLOWER", 0.0)  # any call is slower than that
    _twice_then_compiled(model, batch)
    assert calls.engines == {((2, 6),): "XLA"}
    assert "a call against the executor's" in calls.lite_off

    for module in ("ai_edge_litert", "ai_edge_litert.interpreter"):  # not installed
        monkeypatch.setitem(sys.modules, module, None)
    model = _served(path)
    calls = model._compiled["serving_default"]
    _twice_then_compiled(model, batch)
    assert calls.engines == {((2, 6),): "XLA"}
    assert calls.lite_off == "TensorFlow Lite cannot convert it (ai-edge-litert is not " \
                             "installed)"
    _close(model.predict(batch), _executor_answer(path, batch))


def test_a_keras_convolutional_model_runs_on_tensorflow_lite(tmp_path):
    """keras.io's MNIST convnet: rescaling, convolutions, pooling, dropout."""
    model = keras.Sequential([
        keras.Input((28, 28, 1), name="pixels"),
        keras.layers.Rescaling(1 / 255),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(10, activation="softmax")])
    path = str(tmp_path / "model")
    model.export(path, format="tf_saved_model", verbose=False)
    served = _served(path)
    pixels = np.random.default_rng(5).integers(0, 256, (2, 28, 28, 1)).astype("float32")
    batch = {"pixels": pixels}
    _twice_then_compiled(served, batch)
    calls = served._compiled["serving_default"]
    assert calls.engines == {((2, 28, 28, 1),): compiled.LITE}, calls.lite_off
    other = {"pixels": pixels[::-1].copy()}
    _close(served.predict(other), _executor_answer(path, other))


def test_a_compiled_call_that_answers_otherwise_is_never_used(user_export, monkeypatch):
    path, data = user_export
    model = _served(path)
    calls = model._compiled["serving_default"]
    for name in ("_build_lite", "_build"):
        build = getattr(calls, name)

        def off_by_a_little(arrays, build=build):
            call = build(arrays)
            return lambda inputs: {k: v * 1.001 if v.dtype.kind == "f" else v
                                   for k, v in call(inputs).items()}
        monkeypatch.setattr(calls, name, off_by_a_little)
    batch = {"features": data[:2]}
    _twice_then_compiled(model, batch)
    assert calls.off is not None and "off by up to" in calls.off
    assert calls.call(((2, 6),)) is None and calls.engines == {}
    _close(model.predict(batch), _executor_answer(path, batch))


def test_answers_stay_right_while_a_compile_runs_beside_them(user_export):
    """Requests from several threads, the compile starting in their middle."""
    from concurrent.futures import ThreadPoolExecutor
    path, data = user_export
    model = _served(path)
    batches = [{"features": data[i:i + 2]} for i in range(0, 40, 2)]
    wants = [_executor_answer(path, b) for b in batches]
    with ThreadPoolExecutor(4) as pool:
        gots = list(pool.map(model.predict, batches * 3))
    compiled.drain()
    for got, want in zip(gots, wants * 3, strict=True):
        _close(got, want)
    assert model._compiled["serving_default"].call(((2, 6),)) is not None


def test_a_signature_that_changes_state_or_draws_random_numbers_is_never_compiled(
        tmp_path):
    """The check runs the asking request a second time: a signature that counts its
    calls, or samples, is left to the executor from the start."""
    class Counting(tf.Module):
        def __init__(self):
            super().__init__()
            self.calls = tf.Variable(0, dtype=tf.int64)

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def serve(self, x):
            self.calls.assign_add(1)
            return {"y": x * 2.0, "calls": tf.identity(self.calls) + 0 * tf.shape(
                x, out_type=tf.int64)[0]}

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def sample(self, x):
            return {"y": x + tf.random.uniform(tf.shape(x))}

    module = Counting()
    tf.saved_model.save(module, str(tmp_path), signatures={
        "serving_default": module.serve, "sample": module.sample})
    model = serving._load(str(tmp_path), tags=None, compile_small_calls=True)
    assert model._compiled == {}
    batch = {"x": np.ones((1, 2), np.float32)}
    counts = [int(model.predict(batch)["calls"]) for _ in range(4)]
    compiled.drain()
    assert counts == [1, 2, 3, 4] and int(model.predict(batch)["calls"]) == 5
    assert compiled.state_changes(model._functions["serving_default"]) == \
        "AssignAddVariableOp"


def test_a_compiled_call_that_fails_leaves_the_request_to_the_executor(user_export,
                                                                       caplog):
    path, data = user_export
    model = _served(path)
    batch = {"features": data[:2]}
    _twice_then_compiled(model, batch)
    calls = model._compiled["serving_default"]

    def broken(inputs):
        raise RuntimeError("the executable went away")
    calls._calls[((2, 6),)] = broken
    with caplog.at_level(logging.INFO, logger="predict.compiled"):
        _close(model.predict(batch), _executor_answer(path, batch))
    assert calls.off == "a compiled call failed (the executable went away)"
    assert calls.call(((2, 6),)) is None


def _merged_rounds(model, data, rounds: int, offset: int = 0, clients: int = 4) -> list:
    """`clients` clients at once through a batcher, `rounds` times: [(row, answer)]."""
    import threading

    from predict import batching
    batcher = batching.Batcher(max_batch_size=8, timeout_s=0.2)
    wrapped = batcher.wrap(model, "m")
    answers: dict = {}
    start = threading.Barrier(clients)

    def client(i):
        for round_ in range(rounds):
            start.wait()
            at = offset + 10 * i + round_
            answers[i, round_] = (data[at:at + 1], wrapped.predict({"features":
                                                                    data[at:at + 1]}))
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return list(answers.values())


def _each_its_own_rows(path, rows: list) -> None:
    want = _executor_answer(path, {"features": np.concatenate([row for row, _ in rows])})
    for i, (_, answer) in enumerate(rows):
        _close(answer, {name: value[i:i + 1] for name, value in want.items()})


def test_merged_batches_run_on_tensorflow_lite_once_their_row_count_answered_right(
        user_export):
    """With --enable_batching a merged batch holds as many rows as the queue had, one
    count of many: XLA compiling each count cost a fresh server seconds of CPU, so
    merged batches are never XLA's. A row count's first merged batch is the executor's
    and is checked on TensorFlow Lite (one interpreter resized to each count); once it
    answered as the executor did, that count's merged batches run there, each request
    answered its own rows."""
    path, data = user_export
    model = _served(path)
    calls = model._compiled["serving_default"]
    merged = []
    predict_merged = model.predict_merged

    def counted(batch, signature_name=None):
        merged.append(len(batch["features"]))
        return predict_merged(batch, signature_name)
    model.predict_merged = counted
    first = _merged_rounds(model, data, 3)
    compiled.drain()
    assert merged and max(merged) > 1  # requests were merged
    assert all(key[0][0] == 1 for key in calls._counts), calls._counts  # never XLA's
    assert calls._merged_ok and all(key[0][0] > 1 for key in calls._merged_ok)
    _each_its_own_rows(path, first)

    lite = calls._merged_call
    used = []

    def watched(inputs):
        used.append(len(inputs[0]))
        return lite(inputs)
    calls._merged_call = watched
    merged.clear()
    ok = {key[0][0] for key in calls._merged_ok}
    second = _merged_rounds(model, data, 3, offset=100)
    assert [n for n in used if n in ok] == [n for n in merged if n in ok]
    assert any(n in ok for n in used)
    _each_its_own_rows(path, second)
    third = _merged_rounds(model, data, 3, offset=50, clients=2)  # another row count
    compiled.drain()
    _each_its_own_rows(path, third)
    assert {((4, 6),), ((2, 6),)} <= calls._merged_ok, calls._merged_ok
    assert calls.off is None and calls.merged_off is None


def test_merged_batches_tensorflow_lite_answers_otherwise_or_more_slowly_stay_executors(
        user_export, monkeypatch):
    path, data = user_export
    model = _served(path)
    calls = model._compiled["serving_default"]
    build = calls._build_lite

    def off_by_a_little(arrays, resizes=False):
        call = build(arrays, resizes)
        return lambda inputs: {k: v * 1.001 if v.dtype.kind == "f" else v
                               for k, v in call(inputs).items()}
    monkeypatch.setattr(calls, "_build_lite", off_by_a_little)
    rows = _merged_rounds(model, data, 2)
    compiled.drain()
    assert "off by up to" in calls.merged_off and not calls._merged_ok
    _each_its_own_rows(path, rows)
    _each_its_own_rows(path, _merged_rounds(model, data, 2, offset=100))

    model = _served(path)  # a later row count that answers otherwise: none is used
    calls = model._compiled["serving_default"]
    wrong = []

    def off_when_told(arrays, resizes=False):
        call = build(arrays, resizes)
        return lambda inputs: {k: v * 1.001 if v.dtype.kind == "f" and wrong else v
                               for k, v in call(inputs).items()}
    monkeypatch.setattr(calls, "_build_lite", off_when_told)
    _merged_rounds(model, data, 2)
    compiled.drain()
    assert calls.merged(((4, 6),)) is not None
    wrong.append(True)
    _each_its_own_rows(path, _merged_rounds(model, data, 2, offset=100, clients=2))
    compiled.drain()
    assert "off by up to" in calls.merged_off
    assert calls.merged(((4, 6),)) is None  # the counts checked before are left too

    model = _served(path)
    calls = model._compiled["serving_default"]
    monkeypatch.setattr(compiled, "_best_of", lambda call, arrays: float("inf"))
    _merged_rounds(model, data, 2)
    compiled.drain()
    assert calls._merged_tried and not calls._merged_ok and calls.merged_off is None
    assert calls.merged(next(iter(calls._merged_tried))) is None
