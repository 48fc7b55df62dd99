"""TF Serving's gRPC API on `--port`: `tensorflow.serving.PredictionService`
(Predict, GetModelMetadata, Classify, Regress, MultiInference), `ModelService`
(GetModelStatus, HandleReloadConfigRequest) and `grpc.health.v1.Health`.

The messages and service stubs are TF Serving's own, generated from its release's .proto
files and vendored in `predict.serving_api` (the `tensorflow-serving-api` package is not
needed: it requires the full `tensorflow` distribution, which would lay a second
TensorFlow over `tensorflow-cpu`).

Requests go through the same repository, checks and predict loop as REST, so both
APIs give the same answers and the same errors (as gRPC status codes: NOT_FOUND for an
unknown model, version or label, INVALID_ARGUMENT for a bad request, UNAVAILABLE when
the batch queue is full). Classify, Regress and MultiInference need signatures that
declare them (predict.runtime.inference).
"""
from __future__ import annotations

import logging
import time

import grpc

from predict.runtime import inference, tensors
from predict.runtime.batching import Unavailable
from predict.errors import InputError, InstanceError, UsageError, clip
from predict.models.repository import NotFoundError

log = logging.getLogger("predict.grpc")

_CODE_NAMES = {grpc.StatusCode.OK: "OK", grpc.StatusCode.NOT_FOUND: "NOT_FOUND",
               grpc.StatusCode.INVALID_ARGUMENT: "INVALID_ARGUMENT",
               grpc.StatusCode.INTERNAL: "INTERNAL",
               grpc.StatusCode.UNAVAILABLE: "UNAVAILABLE"}


_LOG_KINDS = {"Predict": "predict_log", "Classify": "classify_log", "Regress": "regress_log",
              "MultiInference": "multi_inference_log"}


def _apis():
    from predict.serving_api import missing
    reason = missing()
    if reason is not None:
        raise UsageError(reason)
    from predict.serving_api.apis import (classification_pb2, get_model_metadata_pb2,
                                          get_model_status_pb2, model_service_pb2_grpc,
                                          predict_pb2, prediction_service_pb2_grpc)
    return (classification_pb2, get_model_metadata_pb2, get_model_status_pb2,
            model_service_pb2_grpc, predict_pb2, prediction_service_pb2_grpc)


def start(service, host: str, port: int, *, reload=None, health=None):
    """Start grpcio's server beside the REST one, its calls on the threads
    predict.runtime.calls gives them; returns (server, bound port). `reload(configs)` answers
    HandleReloadConfigRequest; `health` is a grpc_health HealthServicer to register."""
    (_, _, _, model_service_grpc, _, prediction_service_grpc) = _apis()
    server = grpc.server(service.calls.grpc_pool(), options=[
        ("grpc.max_receive_message_length", service.max_body_bytes)])
    api = GrpcApi(service, reload)
    prediction_service_grpc.add_PredictionServiceServicer_to_server(api, server)
    model_service_grpc.add_ModelServiceServicer_to_server(api, server)
    if health is not None:
        from grpc_health.v1 import health_pb2_grpc
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
    shown = f"[{host}]" if ":" in host else host
    try:
        bound = server.add_insecure_port(f"{shown}:{port}")
    except RuntimeError:
        bound = 0
    if not bound:
        raise UsageError(f"cannot listen on {host}:{port} for gRPC; pick another "
                         "--port")
    server.start()
    return server, bound


class GrpcApi:
    """Both servicers in one object; each method is a unary RPC."""

    def __init__(self, service, reload=None):
        self.service = service
        self._reload = reload
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
        return self._call("Regress", request, context, self._regress)

    def MultiInference(self, request, context):
        return self._call("MultiInference", request, context, self._multi)

    def HandleReloadConfigRequest(self, request, context):
        from predict.serving_api.apis import model_management_pb2
        if self._reload is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this server serves a --model_dir "
                          "and takes no config; start it with --model_config_file or "
                          "--model_base_path")
        try:
            self._reload(request.config)
        except UsageError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except Exception:
            log.exception("HandleReloadConfigRequest failed")
            context.abort(grpc.StatusCode.INTERNAL, "internal error; see the server's log")
        return model_management_pb2.ReloadConfigResponse()

    def _call(self, api: str, request, context, fn):
        metrics = self.service.metrics
        start = time.perf_counter()
        if hasattr(request, "tasks"):  # MultiInference names its model in each task
            name = request.tasks[0].model_spec.name if request.tasks else ""
        else:
            name = request.model_spec.name
        code, message = grpc.StatusCode.OK, ""
        try:
            response = fn(request)
            self._log(api, name, request, response)
            return response
        except NotFoundError as exc:
            code, message = grpc.StatusCode.NOT_FOUND, clip(str(exc))
        except Unavailable as exc:
            code, message = grpc.StatusCode.UNAVAILABLE, clip(str(exc))
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

    def _log(self, api: str, name: str, request, response) -> None:
        """A sampled request and its response into the model's logging_config log."""
        kind = _LOG_KINDS.get(api)
        served = self.service.repository.models.get(name)
        if kind is None or served is None:
            return
        logger = self.service.loggers.get(served)
        if logger is None or not logger.sampled():
            return
        spec = response.results[0].model_spec if api == "MultiInference" \
            else response.model_spec
        try:
            logger.write(kind, spec, request, response)
        except Exception:  # a full disk must not fail the request
            log.exception("cannot write the request log %s", logger.path)

    # --- what they do -------------------------------------------------------------------
    def _served(self, spec):
        served = self.service.repository.get(spec.name)
        choice = spec.WhichOneof("version_choice")
        version = spec.version.value if choice == "version" else None
        label = spec.version_label if choice == "version_label" else None
        return served, version, label

    def _predict(self, request):
        served, version, label = self._served(request.model_spec)
        with served.use(version, label) as (number, model):
            model = self.service._batched(model, served, number)
            response = tensors.predict_response(self.predict_pb2, model, request,
                                                self.service._check_count,
                                                self.service.max_body_bytes)
            self._spec(response.model_spec, served.name, number,
                       response.model_spec.signature_name)
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
        records = inference.serialized(request.input, self.service.max_instances)
        with served.use(version, label) as (number, model):
            model = self.service._batched(model, served, number)
            name, rows = inference.classify(model, request.model_spec.signature_name,
                                            records)
            response = self.classification_pb2.ClassificationResponse()
            self._spec(response.model_spec, served.name, number, name)
            inference.fill_classification(response.result, rows)
            return response

    def _regress(self, request):
        from predict.serving_api.apis import regression_pb2
        served, version, label = self._served(request.model_spec)
        records = inference.serialized(request.input, self.service.max_instances)
        with served.use(version, label) as (number, model):
            model = self.service._batched(model, served, number)
            name, values = inference.regress(model, request.model_spec.signature_name,
                                             records)
            response = regression_pb2.RegressionResponse()
            self._spec(response.model_spec, served.name, number, name)
            inference.fill_regression(response.result, values)
            return response

    def _multi(self, request):
        from predict.serving_api.apis import inference_pb2
        return multi_inference(self.service, inference_pb2, request, self._served,
                               self._spec)

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


def multi_inference(service, inference_pb2, request, served_of, spec_of):
    """TF Serving's MultiInference: classify and regress tasks over one input, on one
    model version (every task must name the same model and version, and signatures
    once each)."""
    tasks = list(request.tasks)
    if not tasks:
        raise InputError("tasks", "MultiInferenceRequest holds no tasks")
    first = tasks[0].model_spec
    for task in tasks[1:]:
        if task.model_spec.name != first.name or \
                task.model_spec.WhichOneof("version_choice") != \
                first.WhichOneof("version_choice") or \
                task.model_spec.version.value != first.version.value or \
                task.model_spec.version_label != first.version_label:
            raise InputError("tasks", "All ModelSpecs in a MultiInferenceRequest must "
                             "access the same model name and version")
    names = [t.model_spec.signature_name or "serving_default" for t in tasks]
    if len(set(names)) != len(names):
        raise InputError("tasks", "Duplicate evaluation of signature: "
                         + next(n for n in names if names.count(n) > 1))
    served, version, label = served_of(first)
    records = inference.serialized(request.input, service.max_instances)
    with served.use(version, label) as (number, model):
        model = service._batched(model, served, number)
        response = inference_pb2.MultiInferenceResponse()
        for task, name in zip(tasks, names, strict=True):
            result = response.results.add()
            if task.method_name == inference.CLASSIFY:
                used, rows = inference.classify(model, name, records)
                inference.fill_classification(result.classification_result, rows)
            elif task.method_name == inference.REGRESS:
                used, values = inference.regress(model, name, records)
                inference.fill_regression(result.regression_result, values)
            else:
                raise InputError("tasks", f"Unsupported signature method_name: "
                                 f"{task.method_name!r} (use {inference.CLASSIFY} or "
                                 f"{inference.REGRESS})")
            spec_of(result.model_spec, served.name, number, used)
        return response


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


__all__ = ["start", "GrpcApi", "signature_def", "multi_inference"]
