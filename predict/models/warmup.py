"""TF Serving's model warmup (`--enable_model_warmup`, on by default).

A version may carry `assets.extra/tf_serving_warmup_requests`: a TFRecord file of
`tensorflow.serving.PredictionLog` records (predict_log, classify_log, regress_log or
multi_inference_log, each holding a request). After the version loads and before it
takes traffic, every request is run against it `--num_request_iterations_for_warmup`
times (0: once), so the first real requests do not pay for TensorFlow's tracing and
allocation. As in TF Serving, at most 1000 records are read, and a file that cannot be
read or a request that fails fails the version's load (reported with its error).

`predict publish --warmup-requests FILE` puts such a file into the published version;
`check_file` checks it first.
"""
from __future__ import annotations

import io

from mljob import storage
from predict.runtime import inference
from predict.errors import InputError, UsageError

WARMUP_FILE = "assets.extra/tf_serving_warmup_requests"
MAX_RECORDS = 1000  # TF Serving's kMaxNumRecords
MAX_FILE_BYTES = 256 * 1024 * 1024


def _logs(data: bytes, where: str) -> list:
    from predict.serving_api.apis import prediction_log_pb2
    from predict.runtime.records import read_tfrecords
    from predict.errors import InstanceError
    logs = []
    try:
        for index, raw in enumerate(read_tfrecords(io.BytesIO(data))):
            if index >= MAX_RECORDS:
                raise UsageError(f"{where}: more than {MAX_RECORDS} warmup records "
                                 "(TF Serving's limit)")
            log = prediction_log_pb2.PredictionLog()
            try:
                log.ParseFromString(raw)
            except Exception:
                raise UsageError(f"{where}: record {index} is not a PredictionLog") from None
            kind = log.WhichOneof("log_type")
            if kind not in ("predict_log", "classify_log", "regress_log",
                            "multi_inference_log"):
                raise UsageError(f"{where}: record {index} holds {kind or 'no request'}; "
                                 "warmup takes predict_log, classify_log, regress_log or "
                                 "multi_inference_log")
            logs.append(log)
    except InstanceError as exc:  # damaged framing
        raise UsageError(f"{where}: {exc}") from None
    return logs


def check_file(path: str) -> bytes:
    """The bytes of a warmup file, after checking every record (for publish)."""
    try:
        data = storage.read_bytes(path, limit=MAX_FILE_BYTES)
    except FileNotFoundError:
        raise UsageError(f"warmup requests file {path} does not exist") from None
    if not _logs(data, f"warmup requests file {path}"):
        raise UsageError(f"warmup requests file {path} holds no records")
    return data


def replayer(iterations: int, max_instances: int):
    """-> warm(model, version_url): replays the version's warmup file; the number of
    requests run (0 when the version has none)."""
    def warm(model, url: str) -> int:
        path = storage.join(url, WARMUP_FILE)
        try:
            data = storage.read_bytes(path, limit=MAX_FILE_BYTES)
        except FileNotFoundError:
            return 0
        logs = _logs(data, WARMUP_FILE)
        runs = max(iterations, 1)
        for log in logs:
            for _ in range(runs):
                _replay(model, log, max_instances)
        return len(logs) * runs
    return warm


# a warmup request's tensors are bounded as a client's are (the export is not trusted more)
MAX_ELEMENTS = 64 * 1024 * 1024


def _replay(model, log, max_instances: int) -> None:
    from predict.serving_api.apis import predict_pb2
    from predict.runtime.tensors import predict_response
    kind = log.WhichOneof("log_type")

    def check(count: int) -> None:
        if count > max_instances:
            raise InputError("warmup request", f"{count} instances, more than "
                                               f"--max_instances {max_instances}")
    if kind == "predict_log":
        predict_response(predict_pb2, model, log.predict_log.request, check,
                         MAX_ELEMENTS)
        return
    if kind == "multi_inference_log":
        request = log.multi_inference_log.request
        records = inference.serialized(request.input, max_instances)
        for task in request.tasks:
            run = inference.classify if task.method_name == inference.CLASSIFY \
                else inference.regress
            run(model, task.model_spec.signature_name, records)
        return
    request = getattr(log, kind).request
    records = inference.serialized(request.input, max_instances)
    run = inference.classify if kind == "classify_log" else inference.regress
    run(model, request.model_spec.signature_name, records)


__all__ = ["WARMUP_FILE", "replayer", "check_file", "MAX_RECORDS"]
