"""`--prefer_tflite_model`: a version's `model.tflite`, beside its SavedModel, answers
its signatures with TensorFlow Lite's interpreter (ai-edge-litert, the `serve-tflite`
extra), as TF Serving's flag of that name serves it.

The file is the user's choice: converted from the SavedModel with
`python -m predict tflite` (which checks its answers against the SavedModel's before it
writes it) or by their own means. When the version loads, each signature the file holds
that the SavedModel also has must take and give the same names and dtypes: an output in
another dtype (int32 for int64, float32 for float64) fails the version's load, with the
reason in its status, rather than reach a client. The SavedModel's other signatures
(a Classify signature of serialized Examples, which TensorFlow Lite cannot parse) are
answered by TensorFlow as without the flag; so are all of them when the folder holds
no model.tflite. Each interpreter answers one call at a time: a version keeps
`--num_tflite_pools` x `--num_tflite_interpreters_per_pool` of them (TF Serving's
flags; 1 each by default), and a call waits for a free one.
"""
from __future__ import annotations

import queue

import numpy as np

from mljob import storage
from predict.errors import ModelLoadError
from predict.runtime.model import Model, SavedModel

TFLITE_FILE = "model.tflite"
MAX_BYTES = 2 << 30  # TensorFlow Lite's flatbuffers stop at 2 GB
EXTRA = "pip install 'mljob[serve-tflite]'"


def prefer(model: Model, url: str, *, interpreters: int = 1) -> Model:
    """The version's model as --prefer_tflite_model serves it: its model.tflite in front
    of the SavedModel, or the SavedModel alone when there is none."""
    path = storage.join(url, TFLITE_FILE)
    if not isinstance(model, SavedModel) or not storage.exists(path):
        return model
    try:
        content = storage.read_bytes(path, limit=MAX_BYTES)
    except storage.StorageError as exc:
        raise ModelLoadError(f"{TFLITE_FILE}: {exc}") from None
    return LiteModel(model, content, interpreters=interpreters, where=path)


def interpreter_class():
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        raise ModelLoadError(f"--prefer_tflite_model needs TensorFlow Lite's "
                             f"interpreter: {EXTRA}") from None
    return Interpreter


class LiteModel(Model):
    """A SavedModel whose signatures found in its model.tflite run there."""

    format = "tflite"

    def __init__(self, saved: SavedModel, content: bytes, *, interpreters: int = 1,
                 where: str = TFLITE_FILE):
        interpreter = interpreter_class()
        try:
            made = [interpreter(model_content=content, num_threads=1)
                    for _ in range(interpreters)]
            listed = made[0].get_signature_list()
        except (ValueError, RuntimeError) as exc:
            raise ModelLoadError(f"{where} is not a TensorFlow Lite model: "
                                 f"{str(exc).strip().splitlines()[0][:200]}") from None
        self.saved = saved
        self.lite = {name: _dtypes(made[0], name) for name in listed
                     if name in saved.signatures}
        for name, (ins, outs) in self.lite.items():
            check(saved.signatures[name], ins, outs, where)
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for one in made:
            self._free.put({name: one.get_signature_runner(name) for name in self.lite})
        super().__init__(saved.source, saved.signatures)

    def predict(self, batch: dict, signature_name: str | None = None) -> dict:
        sig = self.signature(signature_name)
        dtypes = self.lite.get(sig.name)
        if dtypes is None:
            return self.saved.predict(batch, sig.name)
        ins, _ = dtypes
        runners = self._free.get()
        try:
            out = runners[sig.name](**{name: np.asarray(batch[name], ins[name])
                                       for name in sig.inputs})
        finally:
            self._free.put(runners)
        return {name: np.asarray(out[name]) for name in sig.outputs}

    def close(self) -> None:
        self.saved.close()


def _dtypes(interpreter, name: str) -> tuple[dict, dict]:
    runner = interpreter.get_signature_runner(name)
    ins = {k: np.dtype(v["dtype"]) for k, v in runner.get_input_details().items()}
    outs = {k: np.dtype(v["dtype"]) for k, v in runner.get_output_details().items()}
    return ins, outs


def check(sig, ins: dict, outs: dict, where: str) -> None:
    """The TensorFlow Lite signature takes and gives what the SavedModel's does: the
    same input and output names, each of the same dtype (ModelLoadError otherwise)."""
    for kind, lite, saved in (("inputs", ins, sig.inputs), ("outputs", outs, sig.outputs)):
        if set(lite) != set(saved):
            raise ModelLoadError(f"{where}: signature {sig.name!r} has {kind} "
                                 f"{sorted(lite)}, the SavedModel's has {sorted(saved)}; "
                                 "convert it from this SavedModel (python -m predict "
                                 "tflite)")
        for key, dtype in lite.items():
            want = np.dtype(saved[key].dtype)
            if dtype != want:
                raise ModelLoadError(f"{where}: signature {sig.name!r} {kind[:-1]} {key!r} "
                                     f"is {dtype}, the SavedModel's is {want}; convert it "
                                     "from this SavedModel (python -m predict tflite)")




RTOL, ATOL = 1e-4, 1e-5  # the bound `python -m predict tflite` checks floats within


def convert(model: SavedModel, local_dir: str) -> tuple[bytes, list]:
    """The SavedModel's signatures of numeric inputs converted to TensorFlow Lite's
    built-in ops, and checked: (the file's bytes, the signatures it holds). Each
    converted signature is called both ways on random inputs of 1 and 3 rows; an
    output of another dtype or shape, or a float past RTOL/ATOL, refuses the file."""
    import tensorflow as tf
    keys = [name for name, sig in model.signatures.items()
            if sig.inputs and all(np.dtype(i.dtype).kind in "fiub" and i.shape
                                  for i in sig.inputs.values())]
    if not keys:
        raise ModelLoadError("no signature of this SavedModel takes numeric tensors only; "
                             "TensorFlow Lite cannot serve it")
    try:
        converter = tf.lite.TFLiteConverter.from_saved_model(local_dir, signature_keys=keys)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        content = converter.convert()
    except Exception as exc:  # the converter raises many types for graphs it refuses
        first = str(exc).strip().splitlines()
        raise ModelLoadError(f"TensorFlow Lite cannot convert this SavedModel: "
                             f"{first[0][:200] if first else type(exc).__name__}") from None
    lite = LiteModel(model, content, where="the converted model")
    rng = np.random.default_rng(0)
    for name in lite.lite:
        sig = model.signatures[name]
        for rows in (1, 3):
            batch = {k: _random(info, rows, rng) for k, info in sig.inputs.items()}
            differs = difference(model.predict(batch, name), lite.predict(batch, name))
            if differs:
                raise ModelLoadError(f"the converted signature {name!r} answers {differs} "
                                     f"on {rows} random rows; serve the SavedModel")
    return content, sorted(lite.lite)


def _random(info, rows: int, rng) -> np.ndarray:
    shape = tuple(rows if i == 0 or d is None else d for i, d in enumerate(info.shape))
    dtype = np.dtype(info.dtype)
    if dtype.kind == "f":
        return rng.random(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    return rng.integers(0, 10, shape).astype(dtype)


def difference(want: dict, got: dict) -> str | None:
    """None when got answers as want: the same outputs, dtypes and shapes, floats within
    RTOL/ATOL, the rest equal; else what differs."""
    if set(want) != set(got):
        return f"outputs {sorted(got)}, not {sorted(want)}"
    for name, a in want.items():
        b = np.asarray(got[name])
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{name} as {b.dtype}{list(b.shape)}, not {a.dtype}{list(a.shape)}"
        if a.dtype.kind in "fc":
            if not np.allclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True):
                return f"{name} off by up to {float(np.nanmax(np.abs(a - b))):.3g}"
        elif not np.array_equal(a, b):
            return f"{name} with other values"
    return None


__all__ = ["prefer", "LiteModel", "check", "convert", "difference", "TFLITE_FILE",
           "RTOL", "ATOL"]
