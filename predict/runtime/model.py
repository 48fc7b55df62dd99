"""Both export formats behind one small interface.

- the trainer's SavedModel (`saved_model.pb` + `variables/`), loaded with
  `tf.saved_model.load`; signatures are read from the SignatureDefs in saved_model.pb,
  so dtypes, shapes and tensor names are exactly what `saved_model_cli show` prints;
- the seeds' TF1 export (`export.meta` + checkpoint `export.index`/`export.data-*`),
  whose graph holds JSON collections `inputs` and `outputs` mapping names to tensor
  names. `import_meta_graph` needs graph mode, so it gets its own `tf.Graph` and
  `tf.compat.v1.Session`; it answers as a single `serving_default` signature.

Models at other URLs (gs://, memory://) are downloaded to a temporary folder first:
TensorFlow reads only local paths here. Both backends are safe to call from several
threads at once (a signature call and `Session.run` release the GIL while they run).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass

import numpy as np

from predict.errors import ModelLoadError, UsageError, shown
from mljob import contracts, storage
from mljob.errors import first_line

DEFAULT_SIGNATURE = "serving_default"
SAVED_MODEL_MARKER = contracts.SAVED_MODEL_MARKER
LEGACY_MARKER = contracts.LEGACY_EXPORT_MARKER


@dataclass(frozen=True)
class TensorInfo:
    """One named input or output of a signature; shape includes the batch dimension
    (None where unknown)."""

    dtype: np.dtype
    shape: tuple | None  # None: unknown rank
    tensor_name: str

    @property
    def dtype_enum_name(self) -> str:
        import tensorflow as tf
        from tensorflow.core.framework import types_pb2
        return types_pb2.DataType.Name(tf.dtypes.as_dtype(self.dtype).as_datatype_enum)


@dataclass(frozen=True)
class Signature:
    name: str
    inputs: dict
    outputs: dict
    method_name: str = "tensorflow/serving/predict"


class Model:
    """A loaded export: `signature(name)` describes it, `predict(batch)` runs it."""

    format = "unknown"

    def __init__(self, source: str, signatures: dict):
        self.source = source
        self.signatures = signatures

    def signature(self, name: str | None = None) -> Signature:
        name = name or DEFAULT_SIGNATURE
        try:
            return self.signatures[name]
        except KeyError:
            raise UsageError(f"the model has no signature {shown(name)}; it has "
                             f"{', '.join(sorted(self.signatures))}") from None

    def predict(self, batch: dict, signature_name: str | None = None) -> dict:
        """Column arrays (one per input, equal first dimensions) -> column arrays."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class SavedModel(Model):
    format = "saved_model"

    def __init__(self, source: str, local_dir: str, tags=None):
        import tensorflow as tf
        from tensorflow.core.protobuf import saved_model_pb2

        from google.protobuf.message import DecodeError

        proto = saved_model_pb2.SavedModel()
        with open(os.path.join(local_dir, SAVED_MODEL_MARKER), "rb") as f:
            try:
                proto.ParseFromString(f.read())
            except DecodeError:
                raise ModelLoadError(f"{source}/{SAVED_MODEL_MARKER} is not a SavedModel "
                                     "(damaged or another file); export the model again")\
                    from None
        if not proto.meta_graphs:
            raise ModelLoadError(f"{source}/{SAVED_MODEL_MARKER} holds no graph; export "
                                 "the model again")
        graph = proto.meta_graphs[0]
        if tags is not None:  # TF Serving's --saved_model_tags: the graph with that set
            graph = next((g for g in proto.meta_graphs
                          if set(g.meta_info_def.tags) == set(tags)), None)
            if graph is None:
                have = [",".join(g.meta_info_def.tags) for g in proto.meta_graphs]
                raise ModelLoadError(f"the SavedModel at {source} has no MetaGraph tagged "
                                     f"{','.join(tags)!r} (--saved_model_tags); it has "
                                     f"{'; '.join(have)}")
        defs = graph.signature_def
        signatures = {name: _from_signature_def(name, sig) for name, sig in defs.items()
                      if not name.startswith("__")}
        try:
            self._loaded = tf.saved_model.load(local_dir, tags=tags)
        except Exception as exc:  # TF raises many types for bad exports
            raise ModelLoadError(f"cannot load the SavedModel at {source}: "
                                 f"{first_line(exc)}") from None
        self._functions = {name: self._loaded.signatures[name] for name in signatures}
        super().__init__(source, signatures)

    def predict(self, batch: dict, signature_name: str | None = None) -> dict:
        """The signature called by TensorFlow, as `saved_model_cli run` and TF Serving
        call it: each input a tensor of the signature's dtype, by its name."""
        import tensorflow as tf
        sig = self.signature(signature_name)
        args = {name: tf.convert_to_tensor(batch[name], dtype=info.dtype)
                for name, info in sig.inputs.items()}
        out = self._functions[sig.name](**args)
        return {name: out[name].numpy() for name in sig.outputs}


class LegacyExport(Model):
    """The seeds' `export.meta` + checkpoint, run in its own graph and session."""

    format = "legacy"

    def __init__(self, source: str, local_dir: str):
        import tensorflow as tf
        v1 = tf.compat.v1
        self._graph = tf.Graph()
        with self._graph.as_default():
            try:
                saver = v1.train.import_meta_graph(os.path.join(local_dir, LEGACY_MARKER),
                                                   clear_devices=True)
            except Exception as exc:
                raise ModelLoadError(f"cannot import {LEGACY_MARKER} from {source}: "
                                     f"{first_line(exc)}") from None
            inputs = self._collection("inputs", source)
            outputs = self._collection("outputs", source)
            self._session = v1.Session(graph=self._graph)
            prefix = _checkpoint_prefix(local_dir)
            if saver is not None:
                try:
                    saver.restore(self._session, prefix)
                except Exception as exc:
                    self._session.close()
                    raise ModelLoadError(f"cannot restore the checkpoint of {source}: "
                                         f"{first_line(exc)}") from None
        self._inputs = inputs
        self._outputs = outputs
        signature = Signature(DEFAULT_SIGNATURE,
                              {k: _tensor_info(t) for k, t in inputs.items()},
                              {k: _tensor_info(t) for k, t in outputs.items()})
        super().__init__(source, {DEFAULT_SIGNATURE: signature})

    def _collection(self, key: str, source: str) -> dict:
        values = self._graph.get_collection(key)
        if len(values) != 1:
            raise ModelLoadError(f"{source}/{LEGACY_MARKER} must hold one JSON string in "
                                 f"collection {key!r}, found {len(values)}")
        raw = values[0]
        try:
            names = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
            return {k: self._graph.get_tensor_by_name(v) for k, v in names.items()}
        except (ValueError, KeyError, AttributeError, TypeError) as exc:
            raise ModelLoadError(f"collection {key!r} of {source}/{LEGACY_MARKER} is not "
                                 f"a JSON map of tensor names: {first_line(exc)}") from None

    def predict(self, batch: dict, signature_name: str | None = None) -> dict:
        sig = self.signature(signature_name)
        feed = {self._inputs[name]: np.asarray(batch[name], dtype=info.dtype)
                for name, info in sig.inputs.items()}
        names = list(sig.outputs)
        values = self._session.run([self._outputs[n] for n in names], feed_dict=feed)
        return dict(zip(names, values, strict=True))

    def close(self) -> None:
        self._session.close()


def detect_format(local_dir: str) -> str:
    if os.path.isfile(os.path.join(local_dir, SAVED_MODEL_MARKER)):
        return SavedModel.format
    if os.path.isfile(os.path.join(local_dir, LEGACY_MARKER)):
        return LegacyExport.format
    return "unknown"


def load(url: str, tags=None) -> Model:
    """Load the export at URL (a local path or any fsspec URL); `tags` picks a
    SavedModel's MetaGraph (default: its first)."""
    if storage.is_local(url):
        return _load_local(url, storage.local_path(url), tags)
    scratch = tempfile.mkdtemp(prefix="mljob-model-")
    try:
        try:
            storage.download_tree(url, scratch)
        except FileNotFoundError:
            raise ModelLoadError(f"model dir {url} does not exist; pass the export "
                                 "folder (<job-dir>/model) as --model-dir") from None
        except storage.StorageError as exc:
            raise ModelLoadError(str(exc)) from None
        return _load_local(url, scratch, tags)
    finally:
        # Both backends have read everything they need by the time they return.
        shutil.rmtree(scratch, ignore_errors=True)


def _load_local(url: str, path: str, tags=None) -> Model:
    if not os.path.isdir(path):
        raise ModelLoadError(f"model dir {url} does not exist; pass the export folder "
                             "(<job-dir>/model) as --model-dir")
    fmt = detect_format(path)
    if fmt == SavedModel.format:
        return SavedModel(url, path, tags)
    if fmt == LegacyExport.format:
        return LegacyExport(url, path)
    raise ModelLoadError(f"{url} holds no export: looked for {SAVED_MODEL_MARKER} "
                         f"(a SavedModel) and {LEGACY_MARKER} (a TF1 meta graph export)")


def _from_signature_def(name: str, sig) -> Signature:
    return Signature(name, {k: _proto_info(v) for k, v in sig.inputs.items()},
                     {k: _proto_info(v) for k, v in sig.outputs.items()},
                     sig.method_name or "tensorflow/serving/predict")


def _proto_info(info) -> TensorInfo:
    import tensorflow as tf
    shape = None if info.tensor_shape.unknown_rank else tuple(
        None if d.size < 0 else int(d.size) for d in info.tensor_shape.dim)
    return TensorInfo(tf.dtypes.as_dtype(info.dtype).as_numpy_dtype, shape, info.name)


def _tensor_info(tensor) -> TensorInfo:
    dims = tensor.shape.as_list() if tensor.shape.rank is not None else None
    return TensorInfo(tensor.dtype.as_numpy_dtype,
                      None if dims is None else tuple(dims), tensor.name)


def _checkpoint_prefix(local_dir: str) -> str:
    """`export` beside export.meta; the `checkpoint` file's own path is not trusted (it
    is often an absolute path on the machine that trained)."""
    prefix = os.path.join(local_dir, "export")
    if os.path.exists(prefix + ".index"):
        return prefix
    import tensorflow as tf
    latest = tf.train.latest_checkpoint(local_dir)
    if latest and os.path.exists(latest + ".index"):
        return latest
    raise ModelLoadError(f"{local_dir} has {LEGACY_MARKER} but no checkpoint "
                         "(export.index and export.data-*)")



__all__ = ["Model", "SavedModel", "LegacyExport", "Signature", "TensorInfo", "load",
           "detect_format", "DEFAULT_SIGNATURE"]
