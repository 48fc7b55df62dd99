"""The model server's process: TF Serving's flags (predict.serving.flags) turned into a
repository, a batcher, the REST and gRPC servers, and the config file poller.

`tensorflow_model_server` (the console script) and `python -m predict serve` both end
here; the first listens on 0.0.0.0 as TF Serving does, the second on 127.0.0.1 unless
`--host` says otherwise.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
import threading
from typing import Any

from mljob import procs, startup
from mljob.errors import boundary, first_line
from predict.serving import flags as serving_flags
from predict.errors import PredictError, UsageError

log = logging.getLogger("predict.serving")


def main_model_server(argv=None) -> int:
    """The `tensorflow_model_server` console script."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return main(sys.argv[1:] if argv is None else argv, prog="tensorflow_model_server",
                drop_in=True)


def main(argv, *, prog: str, drop_in: bool = False) -> int:
    """TF Serving's command line; its exit status (`mljob.errors.boundary`)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    def serve() -> int:
        try:
            options = serving_flags.parse(argv, drop_in=drop_in)
        except serving_flags.HelpRequested:
            print(serving_flags.help_text(prog))
            return 0
        if options.version:
            print(versions())
            return 0
        run(options)
        return 0

    return boundary(serve, program=prog)


def versions() -> str:
    """`--version`, in TF Serving's two lines: the server (TF Serving's API release
    this server speaks, with mljob's own version after `+`) and TensorFlow's, read from
    the installed distributions (TensorFlow is not imported for it)."""
    from importlib import metadata

    def installed(*names: str) -> str:
        for name in names:
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        return "not installed"
    from predict.serving_api import RELEASE
    return (f"TensorFlow ModelServer: {RELEASE}"
            f"+mljob.{installed('mljob')}\n"
            f"TensorFlow Library: {installed('tensorflow', 'tensorflow-cpu')}")


def check_serving_api() -> None:
    """The gRPC API and the config files need TF Serving's protos (vendored in
    predict.serving_api): refused before any model loads when what they need (grpcio,
    protobuf, TensorFlow's protos) is missing or older than they were generated for."""
    from predict.serving_api import missing
    reason = missing()
    if reason is not None:
        raise PredictError(reason)


@dataclasses.dataclass
class Prepared:
    """What the flags name, read and checked before TensorFlow is imported: the models'
    configs, the monitoring path, the batching parameters, Vertex AI's routes, the
    REST port's socket (bound) and the gRPC port (free when checked)."""

    configs: list
    metrics_path: str | None
    batching: Any  # protos.BatchingParameters, or None with batching off
    vertex: dict
    rest_socket: Any  # socket.socket, or None with REST off

    def close(self) -> None:
        if self.rest_socket is not None:
            self.rest_socket.close()


def run(options) -> None:
    """Serve until SIGTERM or SIGINT. Every refusal of the flags and the files they name
    (a port in use, a bad version policy, an unreadable config) comes before
    TensorFlow is imported: it takes seconds, and a mistake is told at once."""
    from mljob.storage import StorageError
    _logging()
    try:
        prepared = prepare(options)
    except StorageError as exc:
        raise UsageError(str(exc)) from None
    try:
        startup.tensorflow_quietly()  # its start-up notices off stderr
        check_serving_api()
        _run(options, prepared)
    except StorageError as exc:
        raise UsageError(str(exc)) from None
    finally:
        prepared.close()


def prepare(options) -> Prepared:
    """The flags' files read and checked, the ports had: no TensorFlow imported."""
    from predict.runtime import protos
    from predict.api import http as rest_http
    configs = _configs(options)
    metrics_path = None
    if options.monitoring_config_file:
        metrics_path = protos.read_monitoring(options.monitoring_config_file)
    params = None
    if options.enable_batching:
        params = protos.BatchingParameters(num_batch_threads=procs.usable_cores())
        if options.batching_parameters_file:
            params = protos.read_batching(options.batching_parameters_file,
                                          procs.usable_cores())
        changes = {k: v for k, v in (("max_batch_size", options.max_batch_size),
                                     ("batch_timeout_micros", options.batch_timeout_micros))
                   if v is not None}
        if changes:
            params = dataclasses.replace(params, **changes)
            protos.check_batching(params, "--max_batch_size/--batch_timeout_micros")
    vertex = _vertex(options, configs)
    _check_grpc_port(options.host, options.port)
    sock = rest_http.bind(options.host, options.rest_api_port) \
        if options.rest_api_port else None
    return Prepared(configs, metrics_path, params, vertex, sock)


def _check_grpc_port(host: str, port: int) -> None:
    """The gRPC port is free (grpcio binds it later, once TensorFlow is in)."""
    if not port:
        return
    import socket
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port} for gRPC "
                             f"({exc.strerror}); pick another --port") from None


def _run(options, prepared: Prepared) -> None:
    from predict.runtime import batching
    from predict.models import config as model_config
    from predict.api import health as health_mod, metrics
    from predict.serving import listen
    from predict.models import repository, versions, warmup
    _tensorflow_threads(options)
    configs = prepared.configs
    registry = metrics.Metrics() if prepared.metrics_path else None
    batcher: Any = None
    per_model = None
    if prepared.batching is not None:
        params = prepared.batching
        if options.enable_per_model_batching_parameters:
            batcher = per_model = batching.PerModelBatchers(params, metrics=registry)
        else:
            batcher = batching.Batcher(params, metrics=registry)
    warm = warmup.replayer(options.num_request_iterations_for_warmup,
                           options.max_instances) if options.enable_model_warmup else None
    load_options = versions.LoadOptions(
        max_retries=options.max_num_load_retries,
        retry_interval_s=options.load_retry_interval_micros / 1e6, warmup=warm)
    health = health_mod.Health(None)
    events = _events(registry, health)
    tags = [t.strip() for t in options.saved_model_tags.split(",") if t.strip()]
    loader = None
    if tags != ["serve"] or per_model is not None or options.prefer_tflite_model:
        loader = functools.partial(
            _load, tags=None if tags == ["serve"] else tags, per_model=per_model,
            tflite=(options.num_tflite_pools * options.num_tflite_interpreters_per_pool
                    if options.prefer_tflite_model else 0))
    repo = repository.Repository(
        configs, poll_seconds=options.file_system_poll_wait_seconds, events=events,
        load_options=load_options, loader=loader,
        labels_for_unavailable=options.allow_version_labels_for_unavailable_models)
    health.repository = repo

    def reload(proto) -> None:
        from google.protobuf import json_format
        doc = json_format.MessageToDict(proto, preserving_proto_field_name=True)
        try:
            repo.reload(model_config.parse(doc, "(HandleReloadConfigRequest)"))
        except UsageError as exc:  # answered FAILED_PRECONDITION; the log says it too
            log.error("model config reload refused (HandleReloadConfigRequest): %s", exc)
            raise
        health.refresh()
        log.info("model config reloaded (HandleReloadConfigRequest): %s",
                 ", ".join(sorted(repo.models)))

    poller = ConfigPoller(options.model_config_file, configs, repo, health,
                          options.model_config_file_poll_wait_seconds)
    listen.serve(repo, host=options.host, rest_socket=prepared.rest_socket,
                 grpc_port=options.port,
                 threads=options.rest_api_num_threads, batcher=batcher,
                 reload=None if options.model_dir else reload, health=health,
                 after_start=poller.start, max_body_bytes=options.max_body_bytes,
                 max_instances=options.max_instances, metrics=registry,
                 timeout_s=options.rest_api_timeout_in_ms / 1000,
                 metrics_path=prepared.metrics_path, vertex=prepared.vertex,
                 cors=options.rest_api_enable_cors_support)
    poller.stop()


def _load(url: str, *, tags, per_model, tflite: int):
    """A version loaded as the flags say: its MetaGraph by tags, its
    batching_params.pbtxt read and checked first (a bad one fails the load), and with
    --prefer_tflite_model its model.tflite beside the SavedModel."""
    from predict.runtime import model as models
    if per_model is not None:
        per_model.prepare(url)
    model = models.load(url, tags=tags)
    if tflite:
        from predict.runtime import tflite as lite
        model = lite.prefer(model, url, interpreters=tflite)
    return model


def _configs(options) -> list:
    from predict.models import config as model_config, versions
    if options.model_config_file:
        return model_config.read(options.model_config_file)
    if options.model_base_path:
        return [versions.ModelConfig(
            name=options.model_name, base_path=options.model_base_path,
            policy=versions.VersionPolicy.parse(options.model_version_policy)
            if "model_version_policy" in options.given else
            versions.VersionPolicy(registry=True),
            labels=model_config.parse_labels(options.version_label))]
    return [versions.ModelConfig(name=options.model_name, model_dir=options.model_dir)]


def _vertex(options, configs) -> dict:
    """Vertex AI's custom container contract: AIP_HEALTH_ROUTE, AIP_PREDICT_ROUTE (for
    the first model: a Vertex container serves one)."""
    health = os.environ.get("AIP_HEALTH_ROUTE")
    predict = os.environ.get("AIP_PREDICT_ROUTE")
    for name, route in (("AIP_HEALTH_ROUTE", health), ("AIP_PREDICT_ROUTE", predict)):
        if route is not None and not route.startswith("/"):
            raise UsageError(f"{name}={route!r} must be a path starting with /")
    if (health or predict) and not options.rest_api_port:
        raise UsageError("AIP_HEALTH_ROUTE/AIP_PREDICT_ROUTE need the REST API: set "
                         "AIP_HTTP_PORT or --rest_api_port")
    return {"health_route": health, "predict_route": predict, "model": configs[0].name}


def _events(registry, health):
    def event(model_name, what, version, url):
        if registry is not None:
            registry.model_event(model_name, what, version, url)
        health.refresh()
    return event


def _tensorflow_threads(options) -> None:
    intra = options.tensorflow_intra_op_parallelism or options.tensorflow_session_parallelism
    inter = options.tensorflow_inter_op_parallelism or options.tensorflow_session_parallelism
    if intra or inter:
        import tensorflow as tf
        if intra:
            tf.config.threading.set_intra_op_parallelism_threads(intra)
        if inter:
            tf.config.threading.set_inter_op_parallelism_threads(inter)


class _StderrNow(logging.StreamHandler):
    """A handler writing to whatever `sys.stderr` is when a line is logged, never to a
    stream an earlier caller set and has since closed (an in-process run's capture)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def _logging() -> None:
    """Version events and reloads, one line each on stderr, as TF Serving logs them.

    The handler sits at the root (the `predict` loggers log at INFO, the others at the
    root's WARNING): a library that configures logging later (`logging.basicConfig`,
    as exporting or converting a model does) then finds the root configured and adds
    no second handler, which printed every line twice. It writes to this call's stderr
    (one left by an earlier in-process run is replaced: its stream may be closed);
    whoever else listens at the root (a test's log capture) sees the records too."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "serving_stderr", False)]:
        root.removeHandler(old)
    handler = _StderrNow()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s] "
                                           "%(message)s"))
    handler.serving_stderr = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    logging.getLogger("predict").setLevel(logging.INFO)


class ConfigPoller:
    """--model_config_file_poll_wait_seconds: re-read the config file and reload when
    it changed. A file that cannot be read or parsed, or a reload that fails, is logged
    and the models served stay as they were (TF Serving's behaviour)."""

    def __init__(self, url: str, configs: list, repo, health, seconds: float):
        self.url = url
        self.current = list(configs)
        self.repo = repo
        self.health = health
        self.seconds = seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.url and self.seconds > 0:
            self._thread = threading.Thread(target=self._watch, name="config-poller",
                                            daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        from predict.models import config as model_config
        while not self._stop.wait(self.seconds):
            try:
                configs = model_config.read(self.url)
                if configs == self.current:
                    continue
                self.repo.reload(configs)
                self.current = configs
                self.health.refresh()
                log.info("model config reloaded from %s: %s", self.url,
                         ", ".join(c.name for c in configs))
            except Exception as exc:  # keep serving what we have
                message = str(exc) if isinstance(exc, PredictError) else first_line(exc)
                log.error("cannot reload the model config %s: %s", self.url, message)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


__all__ = ["main", "main_model_server", "run", "ConfigPoller"]
