"""TF Serving's gRPC API on `--grpc-port`: `tensorflow.serving.PredictionService`
(Predict, GetModelMetadata, Classify) and `ModelService.GetModelStatus`.

The messages and service stubs are TF Serving's own, from the `tensorflow-serving-api`
package. That package requires the full `tensorflow` distribution, which would lay a
second TensorFlow over `tensorflow-cpu`, so it is installed without its dependencies
(`pip install --no-deps tensorflow-serving-api`): everything else it needs (grpcio,
protobuf, TensorFlow's own protos) is already there.

Requests go through the same repository, checks and predict loop as REST, so both
APIs give the same answers and the same errors (as gRPC status codes: NOT_FOUND for an
unknown model, version or label, INVALID_ARGUMENT for a bad request).

Classify, "where the signature allows": a signature whose outputs include `scores`
([batch, K]) answers it. Each `tf.train.Example` of the request's `input` becomes one
instance (features named after the signature's inputs, as `predict batch` reads
TFRecords), and its result lists K classes labelled "0".."K-1" with their scores.
"""
from __future__ import annotations

import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np

from predict import decode, loop, records
from predict.errors import InputError, InstanceError, UsageError, clip, shown
from predict.repository import NotFoundError

log = logging.getLogger("predict.grpc")

_SERVING_API = ("gRPC needs TF Serving's API protos: pip install --no-deps "
                "tensorflow-serving-api (without --no-deps it pulls a second TensorFlow)")
_CODE_NAMES = {grpc.StatusCode.OK: "OK", grpc.StatusCode.NOT_FOUND: "NOT_FOUND",
               grpc.StatusCode.INVALID_ARGUMENT: "INVALID_ARGUMENT",
               grpc.StatusCode.INTERNAL: "INTERNAL"}


def _apis():
    try:
        from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2,
                                             get_model_status_pb2, model_service_pb2_grpc,
                                             predict_pb2, prediction_service_pb2_grpc)
    except ImportError:
        raise UsageError(_SERVING_API) from None
    return (classification_pb2, get_model_metadata_pb2, get_model_status_pb2,
            model_service_pb2_grpc, predict_pb2, prediction_service_pb2_grpc)


def start(service, host: str, port: int, *, threads: int = 4):
    """Start the gRPC server beside the REST one; returns (server, bound port)."""
    (_, _, _, model_service_grpc, _, prediction_service_grpc) = _apis()
    server = grpc.server(ThreadPoolExecutor(max_workers=threads,
                                            thread_name_prefix="grpc"),
                         options=[("grpc.max_receive_message_length",
                                   service.max_body_bytes)])
    api = GrpcApi(service)
    prediction_service_grpc.add_PredictionServiceServicer_to_server(api, server)
    model_service_grpc.add_ModelServiceServicer_to_server(api, server)
    shown = f"[{host}]" if ":" in host else host
    try:
        bound = server.add_insecure_port(f"{shown}:{port}")
    except RuntimeError:
        bound = 0
    if not bound:
        raise UsageError(f"cannot listen on {host}:{port} for gRPC; pick another "
                         "--grpc-port")
    server.start()
    return server, bound


class GrpcApi:
    """Both servicers in one object; each method is a unary RPC."""

    def __init__(self, service):
        self.service = service
        (self.classification_pb2, self.metadata_pb2, self.status_pb2, _, self.predict_pb2,
         _) = _apis()

    # --- the RPCs ---------------------------------------------------------------------
    def Predict(self, request, context):
        return self._call("Predict", request, context, self._predict)

    def GetModelMetadata(self, request, context):
        return self._call("GetModelMetadata", request, context, self._metadata)

    def Classify(self, request, context):
        return self._call("Classify", request, context, self._classify)

    def GetModelStatus(self, request, context):
        return self._call("GetModelStatus", request, context, self._status)

    def Regress(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "Regress is not served; use Predict")

    def MultiInference(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED,
                      "MultiInference is not served; use Predict")

    def HandleReloadConfigRequest(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "reloading the model config is not "
                      "served; new versions under a base path are picked up by themselves")

    def _call(self, api: str, request, context, fn):
        metrics = self.service.metrics
        start = time.perf_counter()
        name = request.model_spec.name
        code, message = grpc.StatusCode.OK, ""
        try:
            return fn(request)
        except NotFoundError as exc:
            code, message = grpc.StatusCode.NOT_FOUND, clip(str(exc))
        except (InputError, InstanceError, UsageError) as exc:
            code, message = grpc.StatusCode.INVALID_ARGUMENT, clip(str(exc))
        except Exception:  # a real fault: log it, answer INTERNAL
            log.exception("gRPC %s failed", api)
            code, message = grpc.StatusCode.INTERNAL, "internal error; see the server's log"
        finally:
            if metrics is not None and name in self.service.repository.models:
                metrics.request(name, api, "GRPC", _CODE_NAMES.get(code, code.name),
                                time.perf_counter() - start)
        context.abort(code, message)

    # --- what they do -------------------------------------------------------------------
    def _served(self, spec):
        served = self.service.repository.get(spec.name)
        choice = spec.WhichOneof("version_choice")
        version = spec.version.value if choice == "version" else None
        label = spec.version_label if choice == "version_label" else None
        return served, version, label

    def _predict(self, request):
        import tensorflow as tf
        served, version, label = self._served(request.model_spec)
        with served.use(version, label) as (number, model):
            model = self.service._batched(model, served)
            sig = model.signature(request.model_spec.signature_name or None)
            arrays = {}
            for key, proto in request.inputs.items():
                _check_elements(key, proto, self.service.max_body_bytes)
                try:
                    arrays[key] = tf.make_ndarray(proto)
                except Exception as exc:  # a malformed TensorProto
                    raise InputError(f"input {shown(key)}",
                                     f"not a valid tensor: {exc}") from None
            try:
                batch = decode.check_columns(arrays, sig)
            except InstanceError as exc:
                raise InputError("inputs", str(exc)) from None
            self.service._check_count(next(iter(batch.values())).shape[0])
            outputs = model.predict(batch, sig.name)
            wanted = list(request.output_filter) or decode.shown_outputs(outputs, batch, sig)
            unknown = [n for n in wanted if n not in outputs]
            if unknown:
                raise InputError("output_filter", f"unknown output {shown(unknown[0])}; "
                                 f"{sig.name} gives {', '.join(sorted(outputs))}")
            response = self.predict_pb2.PredictResponse()
            self._spec(response.model_spec, served.name, number, sig.name)
            for name in wanted:
                response.outputs[name].CopyFrom(tf.make_tensor_proto(outputs[name]))
            return response

    def _metadata(self, request):
        fields = list(request.metadata_field)
        if fields != ["signature_def"]:
            raise InputError("metadata_field", "must be exactly [\"signature_def\"]")
        served, version, label = self._served(request.model_spec)
        with served.use(version, label) as (number, model):
            defs = self.metadata_pb2.SignatureDefMap()
            for name, sig in model.signatures.items():
                defs.signature_def[name].CopyFrom(signature_def(sig))
            response = self.metadata_pb2.GetModelMetadataResponse()
            self._spec(response.model_spec, served.name, number, None)
            response.metadata["signature_def"].Pack(defs)
            return response

    def _classify(self, request):
        served, version, label = self._served(request.model_spec)
        kind = request.input.WhichOneof("kind")
        if kind != "example_list":
            raise InputError("input", "Classify takes input.example_list (a list of "
                                      "tf.train.Example)")
        examples = request.input.example_list.examples
        if not examples:
            raise InputError("input", "example_list is empty")
        with served.use(version, label) as (number, model):
            model = self.service._batched(model, served)
            sig = model.signature(request.model_spec.signature_name or None)
            if "scores" not in sig.outputs:
                raise InputError("signature", f"{sig.name} has no 'scores' output, so it "
                                 "cannot classify; use Predict")
            self.service._check_count(len(examples))
            instances = []
            for index, example in enumerate(examples):
                try:
                    instances.append((f"example {index}", records.to_instance(
                        example.SerializeToString(), sig)))
                except InstanceError as exc:
                    raise InputError(f"example {index}", str(exc)) from None
            decoded = loop.decode_labelled(instances, sig)
            scores = model.predict(decode.stack(decoded, sig), sig.name)["scores"]
            response = self.classification_pb2.ClassificationResponse()
            self._spec(response.model_spec, served.name, number, sig.name)
            for row in np.asarray(scores):
                result = response.result.classifications.add()
                for index, score in enumerate(np.ravel(row)):
                    result.classes.add(label=str(index), score=float(score))
            return response

    def _status(self, request):
        served, version, label = self._served(request.model_spec)
        response = self.status_pb2.GetModelStatusResponse()
        states = self.status_pb2.ModelVersionStatus.State
        for entry in served.status(version, label):
            status = response.model_version_status.add()
            status.version = int(entry["version"])
            status.state = states.Value(entry["state"])
            status.status.error_code = 0 if entry["status"]["error_code"] == "OK" else 2
            status.status.error_message = entry["status"]["error_message"]
        return response

    @staticmethod
    def _spec(spec, name: str, version: int, signature_name: str | None) -> None:
        spec.name = name
        spec.version.value = version
        if signature_name:
            spec.signature_name = signature_name


def _check_elements(key: str, proto, limit: int) -> None:
    """A TensorProto's tensor_shape bounded before it is decoded: TensorFlow fills the
    elements that no value gives with the last value, so a shape of millions with one
    value allocated hundreds of megabytes. A request holds at most `limit` elements
    (--max-body-bytes: what the REST API's largest body could hold, two bytes a number
    at the least); a shape that does not fit is refused before anything is allocated."""
    dims = [d.size for d in proto.tensor_shape.dim]
    where = f"input {shown(key)}"
    if any(d < 0 for d in dims):
        raise InputError(where, f"tensor_shape has a negative dimension ({min(dims)}); "
                                "give each dimension's size")
    elements = math.prod(dims)
    if elements > limit:
        raise InputError(where, f"tensor_shape {dims[:6]}{'...' if len(dims) > 6 else ''} "
                                f"promises {_many(elements)} elements; a request holds at most "
                                f"{limit:,} (--max-body-bytes); send fewer instances a "
                                "request")


def _many(n: int) -> str:
    return f"{n:,}" if n < 10 ** 15 else f"more than 10^{len(str(n)) - 1}"


def signature_def(sig):
    """Our Signature -> TensorFlow's SignatureDef proto."""
    import tensorflow as tf
    from tensorflow.core.protobuf import meta_graph_pb2

    def fill(target, infos):
        for key, info in infos.items():
            tensor = target[key]
            tensor.name = info.tensor_name
            tensor.dtype = tf.dtypes.as_dtype(info.dtype).as_datatype_enum
            if info.shape is None:
                tensor.tensor_shape.unknown_rank = True
            else:
                for dim in info.shape:
                    tensor.tensor_shape.dim.add(size=-1 if dim is None else dim)
    proto = meta_graph_pb2.SignatureDef(method_name=sig.method_name)
    fill(proto.inputs, sig.inputs)
    fill(proto.outputs, sig.outputs)
    return proto


__all__ = ["start", "GrpcApi", "signature_def"]
