"""The bundled models' export: the original samples' serving contract, written by
`mljob.training.export`.

Signatures (which the predictor and `saved_model_cli` use):
- `serving_default`: image float32 [None, 784], key int64 [None]
  -> key int64 [None], scores float32 [None, 10] (softmax), classes int64 [None];
- `predict_images`: image -> scores, classes.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from mljob.training import Serving
from mljob.training import export as export_lib
from trainer import model as models

MARKER = export_lib.MARKER
load = export_lib.load


def _outputs(logits):
    return {"scores": tf.nn.softmax(logits, name="scores"),
            "classes": tf.argmax(logits, axis=1, output_type=tf.int64, name="classes")}


def serving(model_name: str, hidden_units: int | None = None) -> Serving:
    """The export's signatures for a bundled model (of `hidden_units`, None the model's
    own); it is built float32 whatever the training precision, so the export does not
    change with --mixed-precision."""
    return Serving(inputs={"image": tf.TensorSpec([None, models.IMAGE_PIXELS], tf.float32)},
                   outputs=_outputs, keyless_signature="predict_images",
                   model_fn=functools.partial(models.build, model_name,
                                              hidden_units=hidden_units))


def export(model_name: str, weights: Sequence[np.ndarray], url: str, *,
           hidden_units: int | None = None) -> str:
    """Write the SavedModel of `model_name` (of `hidden_units`, None the default) with
    `weights` (in `get_weights()` order) to URL, replacing any previous export there
    whole. Returns URL."""
    spec = serving(model_name, hidden_units)
    return export_lib.export(spec.model_fn, weights, url, spec)


__all__ = ["export", "load", "serving", "MARKER"]
