"""The Python API's models and versions (`submit.api` exports them): `Model`, its
versions as `models` / `versions` record them, and a version served for `predict`
(`Model.deploy()`, an `Endpoint`), as Vertex's SDK's `Model.deploy` and
`Endpoint.predict`."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mljob import storage
from submit import models
from submit.api.endpoint import Endpoint
from submit.errors import UsageError


class Model:
    """A model (a served base path) and its versions, as `models` / `versions`."""

    def __init__(self, name: str):
        models.base_path(name)  # UsageError when the index has no such model
        self.name = name

    def __repr__(self) -> str:
        return f"Model({self.name!r})"

    def describe(self) -> dict[str, Any]:
        """Cloud ML's Model resource."""
        base, data = models.record(self.name)
        return models.model_resource(self.name, base, data)

    def create_version(self, name: str, origin: str, *, description: str | None = None,
                       labels: Mapping[str, str] | None = None,
                       **settings: str) -> dict[str, Any]:
        """Publish an export as version `name` (the first becomes the default); its
        Version resource. `settings`: runtime_version, python_version, machine_type,
        framework, recorded as `versions create`'s flags."""
        from submit.jobdef import version_config
        fields = version_config.version_fields(
            config_path=None, origin=origin, description=description,
            labels=dict(labels or {}), runtime_version=settings.pop("runtime_version", None),
            python_version=settings.pop("python_version", None),
            machine_type=settings.pop("machine_type", None),
            framework_text=settings.pop("framework", None))
        if settings:
            raise UsageError(f"create_version() got unknown option {sorted(settings)[0]!r}")
        models.create_version(self.name, name, fields["origin"], fields["description"],
                              fields["labels"], fields["settings"])
        return self.version(name)

    def version(self, name: str) -> dict[str, Any]:
        """Version `name`'s resource."""
        base, data = models.record(self.name)
        found = models.find_version(base, data, name, self.name)
        return models.version_resource(self.name, base, data, name, found)

    def versions(self) -> list[dict[str, Any]]:
        """Every version's resource, oldest first."""
        base, data = models.record(self.name)
        found = sorted(models.versions(base, data).items(), key=lambda kv: kv[1]["number"])
        return [models.version_resource(self.name, base, data, n, v) for n, v in found]

    def set_default(self, name: str) -> None:
        models.set_default(self.name, name)

    def delete_version(self, name: str) -> None:
        models.delete_version(self.name, name)

    def delete(self) -> None:
        """Delete the model (it must have no versions left, as Cloud ML requires)."""
        models.delete_model(self.name)

    def deploy(self, version: str | None = None, *, port: int | None = None,
               timeout: float = 300.0) -> Endpoint:
        """Serve a version (the default one unless named) on 127.0.0.1 with the local
        TF Serving-compatible server, as Vertex's `Model.deploy()`; the Endpoint
        (`predict(instances)`, `undeploy()`, a context manager) once it answers.
        `port`: its REST port (a free one by default)."""
        base, data = models.record(self.name)
        name = version or data.get("defaultVersion")
        if not name:
            raise UsageError(f"model {self.name!r} has no default version; create one "
                             "with Model.create_version(), or name the version")
        found = models.find_version(base, data, name, self.name)
        if not found.get("published"):
            raise UsageError(f"version {name!r} of model {self.name!r} is not published; "
                             "pick a READY version")
        return Endpoint(self.name, name, storage.join(base, str(found["number"])),
                        port=port, timeout=timeout)


def create_model(name: str, *, base_path: str | None = None,
                 description: str | None = None,
                 labels: Mapping[str, str] | None = None,
                 regions: Sequence[str] = ()) -> Model:
    """Create a model: a base path `predict serve --model_base_path` watches."""
    from submit.jobdef import version_config
    for region in regions:
        version_config.check_region(region, "regions")
    models.create_model(name, base_path, description, dict(labels or {}), list(regions))
    return Model(name)


def get_model(name: str) -> Model:
    return Model(name)


def list_models() -> list[Model]:
    return [Model(name) for name in models.names()]
