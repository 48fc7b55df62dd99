"""The chief's export: a single-node SavedModel under `<job-dir>/model/`, published whole.

The export is rebuilt from a fresh model (`model_fn()`) and the trained weights as numpy
arrays rather than saved from the training model: under ParameterServerStrategy the
training variables live on parameter servers (possibly sharded), and a SavedModel of
those carries device placements and sharded variables that `tf.saved_model.load` and
TensorFlow Serving cannot use. The fresh model is built on a helper thread, because
TensorFlow keeps the strategy scope and device scope per thread: the export is then
free of both, whatever scope the caller is in.

Signatures (from `Serving`, which the predictor and `saved_model_cli` read):
- `serving_default`: the model's inputs by name and the instance key (int64 [None],
  named `key` unless told otherwise) -> `Serving.outputs(model outputs)` and the key,
  unchanged, so a client can match answers to instances;
- optionally `Serving.keyless_signature`: the inputs -> the outputs, without the key;
- optionally (`export(..., inference_signature=...)`) TF Serving's Classify or Regress
  signature, `classification` or `regression`: serialized tf.train.Example records
  (features named after the inputs, parsed with the inputs' shapes and dtypes) -> for a
  classifier `scores` (the model's output, [batch, K]) and `classes` (the given labels,
  [batch, K] strings); for a regressor `outputs` ([batch]).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow as tf

from mljob import contracts, storage
from mljob.training.config import Serving
from mljob.training.errors import TrainingError, UsageError
from mljob.training.own_steps import overridden

MARKER = contracts.SAVED_MODEL_MARKER  # what a reader looks for; published last


def export(model_fn, weights: Sequence[np.ndarray] | Mapping[str, np.ndarray], url: str,
           serving: Serving, *, inference_signature: dict | None = None) -> str:
    """Write the SavedModel of `model_fn()` with `weights` to URL, replacing any previous
    export there whole. Returns URL. `weights`: {variable path: value} (the trained
    model's), matched into the serving model by path (`assign_by_path`), or a list in
    `get_weights()` order.

    inference_signature: also export TF Serving's tf.Example signature, either
    `{"classify": ["label 0", "label 1", ...]}` (one label per output column) or
    `{"regress": True}`."""
    extra = _inference_kind(inference_signature)
    tmp = tempfile.mkdtemp(prefix="mljob-export-")
    try:
        saved = os.path.join(tmp, "model")
        values = {k: np.asarray(v) for k, v in weights.items()} \
            if isinstance(weights, Mapping) else [np.asarray(w) for w in weights]
        _on_clean_thread(lambda: _save(model_fn, values, serving, saved, extra))
        storage.publish_dir(saved, url, marker=MARKER)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return url


def _inference_kind(spec: dict | None):
    if spec is None:
        return None
    if not isinstance(spec, dict) or len(spec) != 1 or \
            next(iter(spec)) not in ("classify", "regress"):
        raise UsageError("inference_signature must be {'classify': [labels...]} or "
                         "{'regress': True}")
    (kind, value), = spec.items()
    if kind == "classify":
        if not isinstance(value, (list, tuple)) or not value or \
                not all(isinstance(v, str) for v in value):
            raise UsageError("inference_signature {'classify': labels}: labels must be a "
                             "non-empty list of strings, one per output column")
        return kind, tuple(value)
    if value is not True:
        raise UsageError("inference_signature {'regress': True} takes True")
    return kind, None


def _example_function(keras_model, serving: Serving, kind: str, labels):
    """Serialized tf.Examples -> TF Serving's classify or regress outputs."""
    inputs = serving.inputs if serving.inputs is not None else model_inputs(keras_model)
    names = list(inputs)
    features = {n: tf.io.FixedLenFeature(inputs[n].shape[1:], inputs[n].dtype)
                for n in names}

    own_predict = overridden(keras_model, "predict_step")

    def run(examples):
        parsed = tf.io.parse_example(examples, features)
        x = parsed[names[0]] if len(names) == 1 else parsed
        # What :predict answers: the model's own predict_step where it has one.
        value = keras_model.predict_step((x,)) if own_predict else \
            keras_model(x, training=False)
        if serving.outputs is not None:  # what :predict answers (probabilities, not logits)
            value = _answer_of(serving.outputs(value), kind, labels)
        if not isinstance(value, tf.Tensor):
            raise UsageError("inference_signature needs a model with one output tensor")
        value = tf.cast(value, tf.float32)
        if kind == "regress":
            return {"outputs": tf.reshape(value, [-1])}
        if value.shape.rank != 2 or value.shape[1] != len(labels):
            raise UsageError(f"inference_signature: {len(labels)} labels for a model "
                             f"output of shape {value.shape}; give one label per column")
        batch = tf.shape(value)[0]
        classes = tf.tile(tf.constant([list(labels)]), tf.stack([batch, 1]))
        return {"scores": value, "classes": classes}

    fn = tf.function(run, input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    return fn.get_concrete_function()


def _answer_of(outputs, kind: str, labels):
    """The tensor of Serving.outputs' dict that Classify's scores (or Regress's outputs)
    are: `scores` or `probabilities` by name, else the one float tensor of the right
    shape (one column per label; one value per example)."""
    if not isinstance(outputs, dict):
        return outputs
    for name in ("scores", "probabilities", "outputs", "predictions"):
        if name in outputs:
            return outputs[name]
    width = len(labels) if kind == "classify" else 1
    fits = [v for v in outputs.values() if isinstance(v, tf.Tensor) and v.dtype.is_floating
            and (v.shape.rank == 1 and kind == "regress" or
                 v.shape.rank == 2 and v.shape[-1] == width)]
    if len(fits) != 1:
        raise UsageError(f"inference_signature: Serving.outputs gives {sorted(outputs)}; "
                         "name the tensor Classify/Regress answers 'scores' (or "
                         "'probabilities')")
    return fits[0]


def _with_method(path: str, name: str, method: str) -> None:
    """Give signature `name` TF Serving's method name (tf.saved_model.save writes
    tensorflow/serving/predict for every signature)."""
    from tensorflow.core.protobuf import saved_model_pb2
    marker = os.path.join(path, MARKER)
    proto = saved_model_pb2.SavedModel()
    with open(marker, "rb") as f:
        proto.ParseFromString(f.read())
    for graph in proto.meta_graphs:
        if name in graph.signature_def:
            graph.signature_def[name].method_name = method
    with open(marker, "wb") as f:
        f.write(proto.SerializeToString())


def assign_by_path(keras_model, weights: Mapping[str, np.ndarray], *,
                   check_only: bool = False) -> None:
    """Give the serving model the trained values: each trained variable into the serving
    model's variable of the same path (as checkpoints match them). What only the
    serving model holds keeps its own state (adapted preprocessing layers, tables), and
    it may hold a part of the trained model (a GAN's generator); but every trainable
    variable it has must have been trained. Models of the same layers whose paths differ
    (built after other models in one thread) match by position. TrainingError naming
    what does not match."""
    mine = {w.path: w for w in keras_model.weights}
    matched = [p for p in weights if p in mine]
    untrained = [w.path for w in keras_model.trainable_weights if w.path not in weights]
    if untrained or not matched:
        if [tuple(w.shape) for w in keras_model.weights] == \
                [tuple(np.shape(v)) for v in weights.values()]:
            if not check_only:
                keras_model.set_weights(list(weights.values()))
            return
        named = untrained or list(mine)
        raise TrainingError(
            f"the serving model {keras_model.name!r} has {len(named)} trainable "
            f"variable{'s' if len(named) != 1 else ''} no trained one matches by path "
            f"({', '.join(named[:4])}{', ...' if len(named) > 4 else ''}; trained: "
            f"{', '.join(list(weights)[:4])}{', ...' if len(weights) > 4 else ''}): "
            "Serving.model_fn must build the trained model's layers, with the same names, "
            "inside the model it returns (e.g. keras.Model(raw_inputs, "
            "layers(preprocess(raw_inputs))))")
    wrong = [f"{p} {tuple(np.shape(weights[p]))} against {tuple(mine[p].shape)}"
             for p in matched if tuple(np.shape(weights[p])) != tuple(mine[p].shape)]
    if wrong:
        raise TrainingError(f"the serving model {keras_model.name!r}'s variables do not "
                            f"have the trained shapes: {'; '.join(wrong[:3])}")
    if not check_only:
        for p in matched:
            mine[p].assign(weights[p])


@contextlib.contextmanager
def fresh_names():
    """Build models in here with Keras's automatic names counted from zero, whatever
    this thread built before (Keras numbers `dense`, `dense_1`... per thread): the
    training model, the evaluator's and the serving model then name their variables
    alike, and match by path (checkpoints, the export)."""
    from mljob.training.keras_private import fresh_object_names
    with fresh_object_names():
        yield


def built(model_fn):
    """model_fn() with fresh names (`fresh_names`)."""
    with fresh_names():
        return model_fn()


def check_serving_model(model_fn, shapes: Mapping[str, tuple]) -> None:
    """Build the serving model (on a clean thread, as the export will) and check that
    every trained variable has its place in it: a run fails here, before its first
    step, rather than after its last."""
    _on_clean_thread(lambda: assign_by_path(
        built(model_fn), {p: np.zeros(s, np.float32) for p, s in shapes.items()},
        check_only=True))


def _save(model_fn, weights, serving: Serving, path: str, extra=None) -> None:
    keras_model = built(model_fn)
    if isinstance(weights, Mapping):
        assign_by_path(keras_model, weights)
    else:
        expected = [tuple(w.shape) for w in keras_model.weights]
        got = [tuple(w.shape) for w in weights]
        if expected != got:
            raise TrainingError(f"the weights do not fit model {keras_model.name!r} "
                                f"(shapes {got}, expected {expected}); export the "
                                "weights of the same model")
        keras_model.set_weights(weights)
    module = ServingModule(keras_model, serving)
    # experimental_io_device=None and no device scope: the graph names no devices, so it
    # loads on any machine and in TensorFlow Serving.
    signatures = module.signatures()
    if extra is not None:
        kind, labels = extra
        name = "classification" if kind == "classify" else "regression"
        signatures[name] = _example_function(keras_model, serving, kind, labels)
    tf.saved_model.save(module, path, signatures=signatures,
                        options=tf.saved_model.SaveOptions(experimental_io_device=None))
    if extra is not None:
        _with_method(path, name, f"tensorflow/serving/{extra[0]}")


class ServingModule(tf.Module):
    """A built Keras model's variables and the serving functions; the export's root.

    Only the tf.Variables under the Keras variables are tracked, not the Keras model or
    its variables: a Keras 3 variable saves as a copy of its tf.Variable, so the saver
    would restore into handles the serving functions never read. TensorFlow 2's loader
    maps them, but the TF1 loader (`saved_model_cli run`, TensorFlow Serving) then
    fails with "Could not find variable".
    """

    def __init__(self, keras_model, serving: Serving):
        super().__init__(name="serving")
        self.model_variables = [v.value for v in keras_model.variables]
        # What else the layers hold: lookup tables (StringLookup, IntegerLookup,
        # TextVectorization) and a custom layer's own tf.Variables and resources.
        self.model_resources = held_resources(keras_model, self.model_variables)
        self._serving = serving
        inputs = serving.inputs if serving.inputs is not None else model_inputs(keras_model)
        names = list(inputs)
        specs = [_spec(inputs[n], n) for n in names]
        output_names = list(getattr(keras_model, "output_names", None) or [])
        convert = serving.outputs or (lambda outputs: _named_outputs(outputs, output_names))

        # A model's own predict_step is what it answers with, as Keras's predict (which
        # hands it a batch as the tuple `(x,)`).
        own_predict = overridden(keras_model, "predict_step")

        def outputs(*tensors):
            features = tensors[0] if len(tensors) == 1 else dict(zip(names, tensors, strict=True))
            result = convert(keras_model.predict_step((features,)) if own_predict
                             else keras_model(features, training=False))
            if not isinstance(result, dict):
                raise UsageError("Serving.outputs must return a dict of named tensors, "
                                 f"not {type(result).__name__}")
            return dict(result)

        def keyed(*tensors):
            result = outputs(*tensors[:-1])
            result[serving.key] = tf.identity(tensors[-1], name=serving.key)
            return result

        if serving.key is None:
            self.serve = tf.function(outputs, input_signature=specs)
            self.keyless = None
        else:
            key = tf.TensorSpec([None], tf.as_dtype(serving.key_dtype), name=serving.key)
            self.serve = tf.function(keyed, input_signature=[*specs, key])
            self.keyless = (tf.function(outputs, input_signature=specs)
                            if serving.keyless_signature else None)

    def signatures(self) -> dict:
        out = {"serving_default": self.serve.get_concrete_function()}
        if self.keyless is not None:
            name = self._serving.keyless_signature
            assert name is not None  # self.keyless is made only for a keyless_signature
            out[name] = self.keyless.get_concrete_function()
        return out


def _named_outputs(outputs, names: list) -> dict:
    """Serving's default outputs: a model's dict of outputs as it is, a list by the
    model's output names, a single tensor as `outputs`."""
    if isinstance(outputs, dict):
        return dict(outputs)
    if isinstance(outputs, (list, tuple)):
        if len(names) != len(outputs):
            names = [f"output_{i}" for i in range(len(outputs))]
        return dict(zip(names, outputs, strict=True))
    return {"outputs": outputs}


def model_inputs(keras_model) -> dict:
    """The model's own inputs by name, with their dtypes and shapes (what Serving's
    inputs=None exports): a functional model's Input layers."""
    inputs = getattr(keras_model, "inputs", None)
    if not inputs:
        raise UsageError(f"model {keras_model.name!r} has no Input layers to take the "
                         "serving signature from; give Serving(inputs={name: "
                         "tf.TensorSpec(...)})")
    return {t.name: tf.TensorSpec(t.shape, t.dtype, name=t.name) for t in inputs}


def _spec(spec, name):
    if isinstance(spec, tf.RaggedTensorSpec):
        return spec
    return tf.TensorSpec.from_spec(spec, name=name)


def held_resources(keras_model, variables) -> list:
    """The tf.Variables and resources (lookup tables...) the model's layers hold as
    attributes that are not among `variables`: what the serving function captures and
    the saver must track."""
    seen = {id(v) for v in variables}
    seen_handles = {id(getattr(v, "handle", None)) for v in variables}
    found: list = []

    def visit(value, depth):
        if id(value) in seen or depth > 3:
            return
        if isinstance(value, tf.Variable):
            if id(getattr(value, "handle", None)) not in seen_handles:
                seen.add(id(value))
                found.append(value)
            return
        if isinstance(value, tf.saved_model.experimental.TrackableResource):
            seen.add(id(value))
            found.append(value)
            return
        seen.add(id(value))
        if isinstance(value, dict) or type(value).__name__ == "_DictWrapper":
            for item in list(value.values()):
                visit(item, depth + 1)
        elif isinstance(value, (list, tuple)) or type(value).__name__ == "ListWrapper":
            for item in list(value):
                visit(item, depth + 1)

    from mljob.training.keras_private import all_layers
    for layer in all_layers(keras_model):
        for value in list(vars(layer).values()):
            if not isinstance(value, (str, bytes, int, float, bool, type(None))):
                visit(value, 0)
    return found


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
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name="mljob-export")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


__all__ = ["export", "assign_by_path", "check_serving_model", "fresh_names", "built", "load",
           "ServingModule", "MARKER"]
