"""Health: REST (`GET /healthz`, ours, and Vertex AI's AIP_HEALTH_ROUTE) and gRPC's
standard `grpc.health.v1.Health` service.

The server is healthy when every served model has an available version: 200 / SERVING;
otherwise 503 / NOT_SERVING. gRPC answers for the service names "" (the whole server),
`tensorflow.serving.PredictionService` and `tensorflow.serving.ModelService`, and for
each model's name. The gRPC statuses are refreshed on every version event and config
reload.
"""
from __future__ import annotations

import threading

REST_ROUTE = "/healthz"
SERVICES = ("", "tensorflow.serving.PredictionService", "tensorflow.serving.ModelService")


class Health:
    def __init__(self, repository):
        self.repository = repository
        self.servicer = None
        self._lock = threading.Lock()
        self._known: set = set()

    def ready(self) -> tuple[bool, dict]:
        """(every model has an available version, {model: available versions})."""
        models = {name: served.available()
                  for name, served in list(self.repository.models.items())}
        return bool(models) and all(models.values()), models

    def grpc_servicer(self):
        from grpc_health.v1 import health
        self.servicer = health.HealthServicer()
        self.refresh()
        return self.servicer

    def refresh(self, *_event) -> None:
        if self.servicer is None:
            return
        from grpc_health.v1 import health_pb2
        serving = health_pb2.HealthCheckResponse.SERVING
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        with self._lock:
            ok, models = self.ready()
            for service in SERVICES:
                self.servicer.set(service, serving if ok else not_serving)
            for name, versions in models.items():
                self.servicer.set(name, serving if versions else not_serving)
            for gone in self._known - set(models):
                self.servicer.set(gone, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
            self._known = set(models)


__all__ = ["Health", "REST_ROUTE"]
