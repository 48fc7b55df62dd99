"""Small exports with TF Serving's classify and regress signatures, written by the
library's own exporter (`mljob.training.export`), and warmup files of PredictionLog
records, for the TF Serving contract tests."""
from __future__ import annotations

import numpy as np

LABELS = ["setosa", "versicolor", "virginica"]


def _serving():
    import tensorflow as tf
    from mljob.training.config import Serving
    return Serving(inputs={"x": tf.TensorSpec([None, 4], tf.float32)}, key=None)


def classifier_export(path: str, seed: int = 0) -> str:
    """Four float features -> softmax over three labelled classes, with a
    `classification` signature (tf.Example in) beside serving_default."""
    import keras
    from mljob.training.export import export

    def build():
        keras.utils.set_random_seed(seed)
        inputs = keras.Input((4,), name="x")
        hidden = keras.layers.Dense(8, activation="relu")(inputs)
        return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(hidden))
    export(build, build().get_weights(), path, _serving(),
           inference_signature={"classify": LABELS})
    return path


def regressor_export(path: str, seed: int = 0) -> str:
    """Four float features -> one value, with a `regression` signature."""
    import keras
    from mljob.training.export import export

    def build():
        keras.utils.set_random_seed(seed)
        inputs = keras.Input((4,), name="x")
        return keras.Model(inputs, keras.layers.Dense(1)(inputs))
    export(build, build().get_weights(), path, _serving(), inference_signature={"regress": True})
    return path


def example(values) -> bytes:
    import tensorflow as tf
    proto = tf.train.Example()
    proto.features.feature["x"].float_list.value.extend(float(v) for v in values)
    return proto.SerializeToString()


def features(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 4)).round(3).astype(np.float32)


def warmup_file(path: str, rows: np.ndarray, *, bad: bool = False) -> str:
    """A TFRecord file of PredictionLog records: one predict_log and one classify_log
    for `rows` (with `bad`, the predict request names an input the model lacks)."""
    import tensorflow as tf
    from predict.serving_api.apis import prediction_log_pb2
    from predict.runtime.records import write_tfrecords
    predict_log = prediction_log_pb2.PredictionLog()
    request = predict_log.predict_log.request
    request.model_spec.name = "m"
    request.inputs["nope" if bad else "x"].CopyFrom(tf.make_tensor_proto(rows))
    classify_log = prediction_log_pb2.PredictionLog()
    classify_request = classify_log.classify_log.request
    classify_request.model_spec.signature_name = "classification"
    for row in rows:
        classify_request.input.example_list.examples.add().ParseFromString(example(row))
    with open(path, "wb") as f:
        write_tfrecords(f, [predict_log.SerializeToString(),
                            classify_log.SerializeToString()])
    return path
