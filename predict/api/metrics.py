"""Prometheus metrics at TF Serving's path, under TF Serving's names.

TF Serving (with `--monitoring_config_file` enabling Prometheus) answers
`GET /monitoring/prometheus/metrics`; its metric names are TensorFlow monitoring
names with `/` turned into `:`, and existing dashboards query these:

- `:tensorflow:serving:request_count` (counter; model_name, status: `OK`,
  `INVALID_ARGUMENT`, `NOT_FOUND`, ...);
- `:tensorflow:serving:request_latency` (histogram in microseconds; model_name, API:
  `Predict`, `Classify`, `GetModelMetadata`, `GetModelStatus`; entrypoint: `REST`,
  `GRPC`);
- `:tensorflow:cc:saved_model:load_attempt_count` (counter; model_path, status:
  `success`, `fail`).

The buckets are TF Serving's (10 us times 1.8^i, 33 of them). Ours, for versions and
batching, carry an `mljob` prefix: `:mljob:serving:model_version_available`
(model_name, version; 1 while served), `:mljob:serving:model_latest_version`
(model_name) and `:mljob:serving:batch_size` (model_name; instances a merged call).

Counters are rendered as TF Serving renders them (the sample name without the
`_total` suffix prometheus-client would add); histograms and gauges come from
prometheus-client's own exposition.
"""
from __future__ import annotations

import threading
import time

import prometheus_client
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

PATH = "/monitoring/prometheus/metrics"
CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST
BUCKETS = tuple(10 * 1.8 ** i for i in range(33))

# HTTP statuses and the TF error codes TF Serving reports for them.
STATUS_CODES = {200: "OK", 400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 405: "UNIMPLEMENTED",
                413: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}


class Metrics:
    PATH = PATH
    CONTENT_TYPE = CONTENT_TYPE

    def __init__(self) -> None:
        prometheus_client.disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        self._lock = threading.Lock()
        self._counters: dict = {}  # (name, help) -> {labels tuple: value}
        self.request_latency = Histogram(
            ":tensorflow:serving:request_latency",
            "Distribution of wall time (in microseconds) for Tensorflow Serving request.",
            ["model_name", "API", "entrypoint"], buckets=BUCKETS, registry=self.registry)
        self.version_available = Gauge(
            ":mljob:serving:model_version_available",
            "1 while the version is loaded and served, 0 after it was unloaded or failed.",
            ["model_name", "version"], registry=self.registry)
        self.latest_version = Gauge(
            ":mljob:serving:model_latest_version",
            "The highest version served (what a request without a version gets).",
            ["model_name"], registry=self.registry)
        self.batch_size = Histogram(
            ":mljob:serving:batch_size", "Instances in one merged signature call.",
            ["model_name"], buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
            registry=self.registry)
        self._latest: dict = {}

    # --- recording ----------------------------------------------------------------------
    def count(self, name: str, help_text: str, labels: tuple) -> None:
        with self._lock:
            family = self._counters.setdefault((name, help_text), {})
            family[labels] = family.get(labels, 0) + 1

    def request(self, model_name: str, api: str, entrypoint: str, code: str,
                seconds: float) -> None:
        self.count(":tensorflow:serving:request_count", "The total number of requests.",
                   (("model_name", model_name), ("status", code)))
        self.request_latency.labels(model_name, api, entrypoint).observe(seconds * 1e6)

    def timer(self, entrypoint: str) -> "_Timer":
        return _Timer(self, entrypoint)

    def model_event(self, model_name: str, what: str, version: int, path: str = "") -> None:
        """Called by the repository: `loaded`, `load_failed` or `unloaded`."""
        if what in ("loaded", "load_failed"):
            self.count(":tensorflow:cc:saved_model:load_attempt_count",
                       "The number of times a SavedModel was successfully loaded.",
                       (("model_path", path), ("status", "success" if what == "loaded"
                                                          else "fail")))
        self.version_available.labels(model_name, str(version)).set(
            1 if what == "loaded" else 0)
        with self._lock:
            served = self._latest.setdefault(model_name, set())
            (served.add if what == "loaded" else served.discard)(version)
            latest = max(served) if served else 0
        self.latest_version.labels(model_name).set(latest)

    # --- exposition ---------------------------------------------------------------------
    def exposition(self) -> bytes:
        lines = []
        with self._lock:
            counters = {k: dict(v) for k, v in self._counters.items()}
        for (name, help_text), samples in sorted(counters.items()):
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
            for labels, value in sorted(samples.items()):
                rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                lines.append(f"{name}{{{rendered}}} {value}")
        text = "\n".join(lines) + "\n" if lines else ""
        return text.encode() + generate_latest(self.registry)


class _Timer:
    """One request: the API and model are filled in once the route is known."""

    def __init__(self, metrics: Metrics, entrypoint: str):
        self.metrics = metrics
        self.entrypoint = entrypoint
        self.model_name = ""
        self.api = ""
        self.start = time.perf_counter()

    def done(self, http_status: int = 200, code: str | None = None) -> None:
        if not self.model_name or not self.api:
            return  # not a model's request (an unknown route)
        code = code or STATUS_CODES.get(http_status, "UNKNOWN")
        self.metrics.request(self.model_name, self.api, self.entrypoint, code,
                             time.perf_counter() - self.start)


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


__all__ = ["Metrics", "PATH", "CONTENT_TYPE", "BUCKETS", "STATUS_CODES"]
