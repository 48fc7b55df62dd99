"""--prefer_tflite_model's model.tflite, in process: `python -m predict tflite` writes one
that answers within the stated bound; a file whose signature gives an output in another
dtype than the SavedModel's (int32 for int64) fails the version's load rather than reach
a client; without the file the SavedModel answers."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from predict.errors import ModelLoadError
from predict.runtime import model as models, tflite
from tests.support.predict_models import images, saved_model_export

pytest.importorskip("ai_edge_litert")


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    return saved_model_export(str(tmp_path_factory.mktemp("lite") / "1"), seed=4)


def test_the_converted_file_answers_within_the_bound(export_dir):
    saved = models.load(export_dir)
    content, names = tflite.convert(saved, export_dir)
    assert names == ["serving_default"]
    lite = tflite.LiteModel(saved, content)
    for rows in (1, 4, 1):
        batch = {"image": images(rows, seed=rows), "key": np.arange(rows, dtype=np.int64)}
        want, got = saved.predict(batch), lite.predict(batch)
        assert {k: v.dtype for k, v in got.items()} == {k: v.dtype for k, v in want.items()}
        assert tflite.difference(want, got) is None
        np.testing.assert_array_equal(got["classes"], want["classes"])


def _lite_of(fn_outputs) -> bytes:
    """A TensorFlow Lite file with the export's signature names but its own outputs."""
    class Module(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 784], tf.float32, name="image"),
                                      tf.TensorSpec([None], tf.int64, name="key")])
        def serve(self, image, key):
            return fn_outputs(image, key)
    module = Module()
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [module.serve.get_concrete_function()], module)
    return converter.convert()


def test_an_output_in_another_dtype_fails_the_load(export_dir):
    """The export answers classes as int64: a file answering them as int32 is refused
    when the version loads, naming the output and both dtypes."""
    saved = models.load(export_dir)

    def outputs(image, key):
        scores = tf.nn.softmax(image[:, :10])
        return {"classes": tf.argmax(scores, axis=1, output_type=tf.int32),
                "scores": scores, "key": key}
    with pytest.raises(ModelLoadError, match="output 'classes' is int32, the SavedModel's "
                                             "is int64"):
        tflite.LiteModel(saved, _lite_of(outputs))

    def renamed(image, key):
        scores = tf.nn.softmax(image[:, :10])
        return {"labels": tf.argmax(scores, axis=1), "scores": scores, "key": key}
    with pytest.raises(ModelLoadError, match="has outputs"):
        tflite.LiteModel(saved, _lite_of(renamed))


def test_without_the_file_the_saved_model_answers(export_dir, tmp_path):
    saved = models.load(export_dir)
    assert tflite.prefer(saved, export_dir) is saved
    (tmp_path / "model.tflite").write_bytes(b"not a flatbuffer")
    with pytest.raises(ModelLoadError, match="is not a TensorFlow Lite model"):
        tflite.prefer(saved, str(tmp_path))
