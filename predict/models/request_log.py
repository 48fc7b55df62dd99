"""A model config's `logging_config`: sampled requests and their responses written as
TF Serving's `PredictionLog` records (TFRecord files).

    logging_config {
      log_collector_config { type: "tfrecord" filename_prefix: "/var/log/serving/iris" }
      sampling_config { sampling_rate: 0.1 }
    }

TF Serving leaves the collector to a plugin registered under `type`; this server has
one, `tfrecord` (ours): each sampled request goes to `<filename_prefix>-<pid>-<start
time>.tfrecord`, a local file, one PredictionLog a record (`log_metadata` with the
model spec and sampling config, then `predict_log`, `classify_log`, `regress_log` or
`multi_inference_log` with the request and the response), flushed after each record.
The file is in the format of `assets.extra/tf_serving_warmup_requests`, so a sample
of real traffic can warm the next version (`predict publish --warmup-requests`).
REST requests are logged as the equivalent gRPC messages, as TF Serving does.
"""
from __future__ import annotations

import os
import random
import threading
import time
import typing
from dataclasses import dataclass

from predict.errors import UsageError

COLLECTOR = "tfrecord"


@dataclass(frozen=True)
class LoggingSpec:
    sampling_rate: float
    filename_prefix: str


def parse(value, where: str, base_dir: str) -> LoggingSpec:
    """A config entry's logging_config (the proto's JSON mapping) -> LoggingSpec."""
    if not isinstance(value, dict) or not set(value) <= {"log_collector_config",
                                                         "sampling_config"}:
        raise UsageError(f"{where}: logging_config takes log_collector_config and "
                         "sampling_config")
    collector = value.get("log_collector_config") or {}
    sampling = value.get("sampling_config") or {}
    if not isinstance(collector, dict) or not isinstance(sampling, dict):
        raise UsageError(f"{where}: logging_config's fields are messages")
    if collector.get("type") != COLLECTOR:
        raise UsageError(f"{where}: log collector type {collector.get('type', '')!r} is not "
                         f"served; use type: \"{COLLECTOR}\" (PredictionLog TFRecord files)")
    prefix = collector.get("filename_prefix")
    if not isinstance(prefix, str) or not prefix or "://" in prefix:
        raise UsageError(f"{where}: log_collector_config needs filename_prefix, a local "
                         "path")
    if base_dir and not os.path.isabs(prefix):
        prefix = os.path.join(base_dir, prefix)
    unknown = set(sampling) - {"sampling_rate"}
    if unknown:
        raise UsageError(f"{where}: sampling_config field {sorted(unknown)[0]!r} is not "
                         "served; give sampling_rate")
    rate = sampling.get("sampling_rate", 0.0)
    if not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
        raise UsageError(f"{where}: sampling_rate must lie in [0, 1]")
    return LoggingSpec(float(rate), prefix)


class RequestLogger:
    """One model's sampled request log."""

    def __init__(self, spec: LoggingSpec):
        self.spec = spec
        self._lock = threading.Lock()
        self._file: typing.BinaryIO | None = None
        self.path = (f"{spec.filename_prefix}-{os.getpid()}-"
                     f"{time.strftime('%Y%m%d%H%M%S', time.gmtime())}.tfrecord")

    def sampled(self) -> bool:
        return self.spec.sampling_rate > 0 and random.random() < self.spec.sampling_rate

    def write(self, kind: str, spec, request, response) -> None:
        """kind: predict_log, classify_log, regress_log or multi_inference_log; spec the
        answer's ModelSpec."""
        from predict.serving_api.apis import prediction_log_pb2
        from predict.runtime.records import write_tfrecords
        log = prediction_log_pb2.PredictionLog()
        log.log_metadata.model_spec.CopyFrom(spec)
        log.log_metadata.sampling_config.sampling_rate = self.spec.sampling_rate
        log.log_metadata.saved_model_tags.append("serve")
        entry = getattr(log, kind)
        entry.request.CopyFrom(request)
        entry.response.CopyFrom(response)
        data = log.SerializeToString()
        with self._lock:
            if self._file is None:
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
                self._file = open(self.path, "ab")  # kept open; close() closes it
            write_tfrecords(self._file, [data])
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class Loggers:
    """The loggers of the served models, following config reloads."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_model: dict = {}

    def get(self, served) -> RequestLogger | None:
        spec = getattr(served.config, "logging", None)
        with self._lock:
            current = self._by_model.get(served.name)
            if current is not None and current.spec == spec:
                return current
            if current is not None:
                current.close()
                del self._by_model[served.name]
            if spec is None:
                return None
            logger = self._by_model[served.name] = RequestLogger(spec)
            return logger

    def close(self) -> None:
        with self._lock:
            for logger in self._by_model.values():
                logger.close()
            self._by_model.clear()


def predict_messages(name: str, version: int, signature: str, batch: dict, outputs: dict):
    """A REST :predict as TF Serving's PredictRequest and PredictResponse."""
    import tensorflow as tf
    from predict.serving_api.apis import predict_pb2
    request, response = predict_pb2.PredictRequest(), predict_pb2.PredictResponse()
    for spec in (request.model_spec, response.model_spec):
        spec.name, spec.signature_name = name, signature
        spec.version.value = version
    for key, value in batch.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
    for key, value in outputs.items():
        response.outputs[key].CopyFrom(tf.make_tensor_proto(value))
    return request, response


def example_messages(kind: str, name: str, version: int, signature: str, records: list,
                     result: list):
    """A REST :classify or :regress as TF Serving's request and response."""
    from predict.serving_api.apis import classification_pb2, regression_pb2
    from predict.runtime import inference
    if kind == "classify_log":
        request, response = (classification_pb2.ClassificationRequest(),
                             classification_pb2.ClassificationResponse())
        inference.fill_classification(response.result, result)
    else:
        request, response = (regression_pb2.RegressionRequest(),
                             regression_pb2.RegressionResponse())
        inference.fill_regression(response.result, result)
    for spec in (request.model_spec, response.model_spec):
        spec.name, spec.signature_name = name, signature
        spec.version.value = version
    for record in records:
        request.input.example_list.examples.add().ParseFromString(record)
    return request, response


class Tap:
    """A loaded model whose calls are kept (batch, outputs, signature) for the log."""

    def __init__(self, model):
        self._model = model
        self.signatures, self.source = model.signatures, model.source
        self.calls: list = []

    def signature(self, name=None):
        return self._model.signature(name)

    def predict(self, batch: dict, signature_name=None) -> dict:
        outputs = self._model.predict(batch, signature_name)
        self.calls.append((batch, outputs, self._model.signature(signature_name).name))
        return outputs


__all__ = ["LoggingSpec", "Tap", "predict_messages", "example_messages", "RequestLogger",
           "Loggers", "parse", "COLLECTOR"]
