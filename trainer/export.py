"""The chief's export: a single-node SavedModel under `<job-dir>/model/`, published whole.

The export is rebuilt from a fresh model and the trained weights as numpy arrays rather
than saved from the training model: under ParameterServerStrategy the training
variables live on parameter servers (possibly sharded), and a SavedModel of those
carries device placements and sharded variables that `tf.saved_model.load` and
TensorFlow Serving cannot use. The fresh model is built on a helper thread, because
TensorFlow keeps the strategy scope and device scope per thread: the export is then
free of both, whatever scope the caller is in.

Signatures (the seeds' contract, which the predictor and `saved_model_cli` use):
- `serving_default`: image float32 [None, 784], key int64 [None]
  -> key int64 [None], scores float32 [None, 10] (softmax), classes int64 [None];
- `predict_images`: image -> scores, classes.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
from typing import Sequence

import numpy as np
import tensorflow as tf

from trainer import model as models
from mljob import contracts, storage
from trainer.errors import TrainerError, UsageError

MARKER = contracts.SAVED_MODEL_MARKER  # what a reader looks for; published last


def export(model_name: str, weights: Sequence[np.ndarray], url: str, *,
           hidden_units: int | None = None) -> str:
    """Write the SavedModel of `model_name` (of `hidden_units`, None the default) with
    `weights` (in `get_weights()` order) to URL, replacing any previous export there
    whole. Returns URL."""
    tmp = tempfile.mkdtemp(prefix="mljob-export-")
    try:
        saved = os.path.join(tmp, "model")
        _on_clean_thread(lambda: _save(model_name, [np.asarray(w) for w in weights],
                                       saved, hidden_units))
        storage.publish_dir(saved, url, marker=MARKER)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return url


def _save(model_name: str, weights: list[np.ndarray], path: str,
          hidden_units: int | None = None) -> None:
    keras_model = models.build(model_name, hidden_units=hidden_units)
    expected = [tuple(w.shape) for w in keras_model.weights]
    got = [tuple(w.shape) for w in weights]
    if expected != got:
        raise TrainerError(f"the weights do not fit model {model_name!r} (shapes {got}, "
                           f"expected {expected}); export the weights of the same model")
    keras_model.set_weights(weights)
    module = ServingModule(keras_model)
    signatures = {
        "serving_default": module.serve.get_concrete_function(),
        "predict_images": module.predict_images.get_concrete_function(),
    }
    # experimental_io_device=None and no device scope: the graph names no devices, so it
    # loads on any machine and in TensorFlow Serving.
    tf.saved_model.save(module, path, signatures=signatures,
                        options=tf.saved_model.SaveOptions(experimental_io_device=None))


_IMAGE = tf.TensorSpec([None, models.IMAGE_PIXELS], tf.float32, name="image")
_KEY = tf.TensorSpec([None], tf.int64, name="key")


class ServingModule(tf.Module):
    """A built Keras model's variables and the serving functions; the export's root.

    Only the tf.Variables under the Keras variables are tracked, not the Keras model or
    its variables: a Keras 3 variable saves as a copy of its tf.Variable, so the saver
    would restore into handles the serving functions never read. TensorFlow 2's loader
    maps them, but the TF1 loader (`saved_model_cli run`, TensorFlow Serving) then
    fails with "Could not find variable".
    """

    def __init__(self, keras_model):
        super().__init__(name="serving")
        self.model_variables = [v.value for v in keras_model.variables]

        def outputs(image):
            logits = keras_model(image, training=False)
            return {"scores": tf.nn.softmax(logits, name="scores"),
                    "classes": tf.argmax(logits, axis=1, output_type=tf.int64,
                                         name="classes")}

        @tf.function(input_signature=[_IMAGE, _KEY])
        def serve(image, key):
            result = outputs(image)
            result["key"] = tf.identity(key, name="key")  # lets clients match answers
            return result

        @tf.function(input_signature=[_IMAGE])
        def predict_images(image):
            return outputs(image)

        self.serve = serve
        self.predict_images = predict_images


def load(url: str):
    """The export at URL, loaded with `tf.saved_model.load` (signatures in
    `.signatures`). Remote exports are downloaded to a temporary folder first."""
    if not _exists(storage.join(url, MARKER)):
        raise UsageError(f"no SavedModel at {url} ({MARKER} is missing); point at a "
                         "job's model/ folder, written when training finishes")
    if storage.is_local(url):
        return tf.saved_model.load(storage.local_path(url))
    tmp = tempfile.mkdtemp(prefix="mljob-model-")
    try:
        storage.download_tree(url, tmp)
        # Loading restores every variable into memory, so the copy can go right after.
        return tf.saved_model.load(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _exists(url: str) -> bool:
    try:
        return storage.exists(url)
    except storage.StorageError as exc:
        raise UsageError(str(exc)) from None


def _on_clean_thread(fn) -> None:
    """Run fn on a new thread (no strategy or device scope there) and re-raise its error."""
    errors: list[BaseException] = []

    def run():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="mljob-export")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


__all__ = ["export", "load", "ServingModule", "MARKER"]
