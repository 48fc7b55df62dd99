"""TF Serving's small text-proto config files whose protos predict.serving_api does not
hold (nor does the `tensorflow-serving-api` wheel): `--batching_parameters_file`
(BatchingParameters, from session_bundle_config.proto) and `--monitoring_config_file`
(MonitoringConfig).

The messages are declared here with TF Serving's own field names and numbers, so
protobuf's own text parser reads the files exactly as TF Serving does (`max_batch_size
{ value: 128 }`, `prometheus_config { enable: true }`), and an unknown field is a
parse error naming it.
"""
from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from google.protobuf import wrappers_pb2  # noqa: F401  (registers the wrappers' file)

from mljob import storage
from predict.errors import UsageError

METRICS_PATH = "/monitoring/prometheus/metrics"
_F = descriptor_pb2.FieldDescriptorProto


def _build():
    pool = descriptor_pool.Default()
    try:
        pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters")
    except KeyError:
        file = descriptor_pb2.FileDescriptorProto(
            name="mljob/tf_serving_configs.proto", package="tensorflow.serving",
            syntax="proto3", dependency=["google/protobuf/wrappers.proto"])
        batching = file.message_type.add(name="BatchingParameters")
        for number, name, wrapper in [
                (1, "max_batch_size", "Int64Value"), (2, "batch_timeout_micros", "Int64Value"),
                (3, "max_enqueued_batches", "Int64Value"),
                (4, "num_batch_threads", "Int64Value"), (5, "thread_pool_name", "StringValue"),
                (8, "enable_large_batch_splitting", "BoolValue"),
                (9, "max_execution_batch_size", "Int64Value"),
                (10, "batch_padding_policy", "StringValue")]:
            batching.field.add(name=name, number=number, type=_F.TYPE_MESSAGE,
                               label=_F.LABEL_OPTIONAL,
                               type_name=f".google.protobuf.{wrapper}")
        batching.field.add(name="allowed_batch_sizes", number=6, type=_F.TYPE_INT64,
                           label=_F.LABEL_REPEATED)
        batching.field.add(name="pad_variable_length_inputs", number=7,
                           type=_F.TYPE_BOOL, label=_F.LABEL_OPTIONAL)
        prometheus = file.message_type.add(name="PrometheusConfig")
        prometheus.field.add(name="enable", number=1, type=_F.TYPE_BOOL,
                             label=_F.LABEL_OPTIONAL)
        prometheus.field.add(name="path", number=2, type=_F.TYPE_STRING,
                             label=_F.LABEL_OPTIONAL)
        monitoring = file.message_type.add(name="MonitoringConfig")
        monitoring.field.add(name="prometheus_config", number=1, type=_F.TYPE_MESSAGE,
                             label=_F.LABEL_OPTIONAL,
                             type_name=".tensorflow.serving.PrometheusConfig")
        pool.Add(file)
    return (message_factory.GetMessageClass(
                pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters")),
            message_factory.GetMessageClass(
                pool.FindMessageTypeByName("tensorflow.serving.MonitoringConfig")))


BatchingParametersProto, MonitoringConfigProto = _build()


@dataclass(frozen=True)
class BatchingParameters:
    """TF Serving's batching knobs, with its defaults (BasicBatchScheduler's)."""

    max_batch_size: int = 1000
    batch_timeout_micros: int = 0
    max_enqueued_batches: int = 10
    num_batch_threads: int = 2
    allowed_batch_sizes: tuple = ()
    pad_variable_length_inputs: bool = False


MAX_BYTES = 1 << 20  # a config file of these few fields is a few hundred bytes


def _parse(url: str, flag: str, message):
    try:
        raw = storage.read_bytes(url, limit=MAX_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise UsageError(f"{flag} {url} does not exist") from None
    except IsADirectoryError:
        raise UsageError(f"{flag} {url} is a folder; give a text proto file") from None
    except storage.StorageError as exc:  # a device, a named pipe, past MAX_BYTES
        raise UsageError(f"{flag}: {exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{flag} {url} is not UTF-8 text") from None
    try:
        text_format.Parse(raw, message)
    except text_format.ParseError as exc:
        raise UsageError(f"{flag} {url} is not a {message.DESCRIPTOR.name} text proto: "
                         f"{exc}") from None
    return message


def read_batching(url: str, threads: int,
                  flag: str = "--batching_parameters_file") -> BatchingParameters:
    """--batching_parameters_file (or a version's batching_params.pbtxt) ->
    BatchingParameters, checked as TF Serving checks."""
    proto = _parse(url, flag, BatchingParametersProto())
    where = f"{flag} {url}"
    for unsupported in ("enable_large_batch_splitting", "max_execution_batch_size",
                        "batch_padding_policy"):
        if proto.HasField(unsupported):
            raise UsageError(f"{where}: {unsupported} is not implemented by this server; "
                             "leave it out")
    defaults = BatchingParameters(num_batch_threads=threads)

    def get(name):
        return getattr(proto, name).value if proto.HasField(name) \
            else getattr(defaults, name)
    params = BatchingParameters(
        max_batch_size=get("max_batch_size"), batch_timeout_micros=get("batch_timeout_micros"),
        max_enqueued_batches=get("max_enqueued_batches"),
        num_batch_threads=get("num_batch_threads"),
        allowed_batch_sizes=tuple(proto.allowed_batch_sizes),
        pad_variable_length_inputs=proto.pad_variable_length_inputs)
    check_batching(params, where)
    return params


def check_batching(params: BatchingParameters, where: str) -> None:
    for name in ("max_batch_size", "max_enqueued_batches", "num_batch_threads"):
        if not 1 <= getattr(params, name) <= 1_000_000:
            raise UsageError(f"{where}: {name} must lie in 1..1000000")
    if not 0 <= params.batch_timeout_micros <= 3_600_000_000:
        raise UsageError(f"{where}: batch_timeout_micros must lie in 0..3600000000")
    sizes = params.allowed_batch_sizes
    if sizes:
        if any(s < 1 for s in sizes) or list(sizes) != sorted(set(sizes)):
            raise UsageError(f"{where}: allowed_batch_sizes must be positive and strictly "
                             "increasing")
        if sizes[-1] != params.max_batch_size:
            raise UsageError(f"{where}: the last entry in allowed_batch_sizes must equal "
                             f"max_batch_size ({sizes[-1]} != {params.max_batch_size})")


def read_monitoring(url: str) -> str | None:
    """--monitoring_config_file -> the Prometheus path, or None when not enabled."""
    proto = _parse(url, "--monitoring_config_file", MonitoringConfigProto())
    config = proto.prometheus_config
    if not config.enable:
        return None
    path = config.path or METRICS_PATH
    if not path.startswith("/") or path.startswith("/v1/"):
        raise UsageError(f"--monitoring_config_file {url}: prometheus_config.path must "
                         "start with / and lie outside /v1/")
    return path


__all__ = ["BatchingParameters", "read_batching", "check_batching", "read_monitoring",
           "METRICS_PATH"]
