"""`--model-config-file`: several models in one server, in TF Serving's model config.

Two spellings of the same thing are read:

- TF Serving's own text format (a `ModelServerConfig` text proto, what
  `tensorflow_model_server --model_config_file` reads), parsed with the
  TF Serving's own proto classes (vendored in predict.serving_api):

      model_config_list {
        config {
          name: "mnist"
          base_path: "gs://bucket/models/mnist"
          model_platform: "tensorflow"
          model_version_policy { latest { num_versions: 2 } }
          version_labels { key: "stable" value: 3 }
        }
      }

- the same fields as YAML or JSON (the proto's JSON mapping), for files ending in
  `.yaml`, `.yml` or `.json`:

      model_config_list:
        config:
          - name: mnist
            base_path: gs://bucket/models/mnist
            model_version_policy: {specific: {versions: [1, 2]}}
            version_labels: {stable: 1}

Relative local base paths are taken from the config file's folder. Unknown fields
are errors, as in TF Serving.
"""
from __future__ import annotations

import json
import os

import yaml

from mljob import storage
from mljob.errors import ascii_digits
from predict.models import request_log
from predict.errors import UsageError
from predict.models.versions import ModelConfig, VersionPolicy, parse_version

_FIELDS = {"name", "base_path", "model_platform", "model_version_policy", "version_labels",
           "model_type", "logging_config"}


MAX_CONFIG_BYTES = 4 * 1024 * 1024  # thousands of models' entries
MAX_DEPTH = 32  # the config's own nesting is 5 levels; the loaders recurse once a level


def read(url: str) -> list:
    """The ModelConfigs of a model config file (any fsspec URL)."""
    fs, path = storage.filesystem(url)
    if storage.retry(lambda: fs.isdir(path), f"check {url}"):
        raise UsageError(f"model config file {url} is a folder; name the file itself "
                         "(e.g. models.config or models.yaml)")
    try:
        raw = storage.read_bytes(url, limit=MAX_CONFIG_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise UsageError(f"model config file {url} does not exist") from None
    except storage.TooLargeError:
        raise UsageError(f"model config file {url} is larger than {MAX_CONFIG_BYTES} "
                         "bytes; a model config lists models, not data") from None
    except UnicodeDecodeError:
        raise UsageError(f"model config file {url} is not UTF-8 text") from None
    if url.lower().endswith((".yaml", ".yml", ".json")):
        doc = _yaml(raw, url)
    else:
        doc = _text_proto(raw, url)
    return parse(doc, url)


def _yaml(raw: str, url: str):
    """YAML or JSON, after refusing YAML aliases (a few lines of them expand to
    gigabytes: the training config refuses them too) and nesting past MAX_DEPTH (the
    loaders recurse once a level: 100,000 levels overflow the stack)."""
    try:
        depth = 0
        for event in yaml.parse(raw, Loader=yaml.SafeLoader):  # JSON is YAML here
            if isinstance(event, yaml.AliasEvent):
                raise UsageError(f"model config file {url} line {event.start_mark.line + 1} "
                                 f"uses the YAML alias *{event.anchor}; aliases are "
                                 "refused, write the value out")
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise UsageError(f"model config file {url} line "
                                     f"{event.start_mark.line + 1} nests values more than "
                                     f"{MAX_DEPTH} levels deep; a model config needs 5")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        return yaml.safe_load(raw) if not url.lower().endswith(".json") else json.loads(raw)
    except (yaml.YAMLError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"model config file {url} is not valid YAML/JSON: "
                         f"{first[:200]}") from None


def _text_proto(raw: str, url: str) -> dict:
    from predict.serving_api import missing
    reason = missing()
    if reason is not None:
        raise UsageError(f"reading the text proto {url}: {reason}; or write the file as "
                         "YAML")
    from google.protobuf import json_format, text_format

    from predict.serving_api.config import model_server_config_pb2
    message = model_server_config_pb2.ModelServerConfig()
    try:
        text_format.Parse(raw, message)
    except text_format.ParseError as exc:
        raise UsageError(f"model config file {url} is not a ModelServerConfig text proto: "
                         f"{exc}") from None
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def parse(doc, url: str) -> list:
    where = f"model config file {url}"
    if not isinstance(doc, dict) or set(doc) != {"model_config_list"}:
        raise UsageError(f"{where} must hold exactly model_config_list (TF Serving's "
                         "ModelServerConfig)")
    listing = doc["model_config_list"]
    configs = listing.get("config") if isinstance(listing, dict) else None
    if isinstance(configs, dict):
        configs = [configs]
    if not isinstance(configs, list) or not configs:
        raise UsageError(f"{where}: model_config_list needs at least one config entry")
    base_dir = os.path.dirname(url) if storage.is_local(url) else ""
    return [_one(entry, f"{where}, config {index}", base_dir)
            for index, entry in enumerate(configs)]


def _one(entry, where: str, base_dir: str) -> ModelConfig:
    if not isinstance(entry, dict):
        raise UsageError(f"{where} must be a mapping of fields")
    unknown = sorted(set(entry) - _FIELDS)
    if unknown:
        raise UsageError(f"{where}: unknown field {unknown[0]!r}; a config takes "
                         f"{', '.join(sorted(_FIELDS))}")
    name, base = entry.get("name"), entry.get("base_path")
    if not isinstance(name, str) or not name or "/" in name or ":" in name:
        raise UsageError(f"{where}: name must be a non-empty string without / or :")
    if not isinstance(base, str) or not base:
        raise UsageError(f"{where} ({name}): base_path is required")
    _model_type(entry, where, name)
    logging = None
    if "logging_config" in entry:
        logging = request_log.parse(entry["logging_config"], f"{where} ({name})", base_dir)
    platform = entry.get("model_platform", "tensorflow")
    if platform != "tensorflow":
        raise UsageError(f"{where} ({name}): model_platform {platform!r} is not served; "
                         "use tensorflow")
    if base_dir and "://" not in base and not os.path.isabs(base):
        base = os.path.join(base_dir, base)
    return ModelConfig(name=name, base_path=base,
                       policy=_policy(entry.get("model_version_policy"), where, name),
                       labels=_labels(entry.get("version_labels"), where, name),
                       logging=logging)


def _model_type(entry: dict, where: str, name: str) -> None:
    """TF Serving's deprecated model_type: TENSORFLOW (or unset) only, never beside
    model_platform."""
    if "model_type" not in entry:
        return
    kind = entry["model_type"]
    if "model_platform" in entry:
        raise UsageError(f"{where} ({name}): Illegal setting both model_type (deprecated) "
                         "and model_platform; keep model_platform")
    if kind not in ("TENSORFLOW", "MODEL_TYPE_UNSPECIFIED", 1, 0):
        raise UsageError(f"{where} ({name}): model_type {kind!r} is not served; use "
                         "model_platform: \"tensorflow\"")


def _policy(value, where: str, name: str) -> VersionPolicy:
    if value is None:  # a base path with a model's record: its READY versions
        return VersionPolicy(registry=True)
    bad = UsageError(f"{where} ({name}): model_version_policy must be one of "
                     "{latest: {num_versions: N}}, {all: {}}, {specific: {versions: [...]}}")
    if not isinstance(value, dict) or len(value) != 1:
        raise bad
    (kind, body), = value.items()
    body = {} if body is None else body  # `latest:` alone; `latest: 0` is no policy
    if not isinstance(body, dict):
        raise bad
    try:  # OverflowError: num_versions .inf
        if kind == "latest" and set(body) <= {"num_versions"}:
            count = body.get("num_versions", 1)
            if isinstance(count, str) and ascii_digits(count):  # protobuf's JSON form
                count = int(count)
            if isinstance(count, int) and not isinstance(count, bool) and count >= 1:
                return VersionPolicy("latest", count=count)
        if kind == "all" and not body:
            return VersionPolicy("all")
        if kind == "specific" and set(body) == {"versions"}:
            versions = body["versions"]
            versions = versions if isinstance(versions, list) else [versions]
            if versions:
                return VersionPolicy("specific",
                                     versions=frozenset(parse_version(v) for v in versions))
    except (TypeError, ValueError, OverflowError):
        pass
    raise bad


def _labels(value, where: str, name: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UsageError(f"{where} ({name}): version_labels must map labels to versions")
    labels = {}
    for label, version in value.items():
        try:
            labels[str(label)] = parse_version(version)
        except ValueError:
            raise UsageError(f"{where} ({name}): version label {label!r} must name a "
                             f"version number, got {version!r}") from None
    return labels


def parse_labels(items) -> dict:
    """`--version-label LABEL=VERSION` flags -> {label: version}."""
    labels = {}
    for item in items:
        label, sep, version = item.partition("=")
        try:
            if not sep or not label:
                raise ValueError
            labels[label] = parse_version(version)
        except ValueError:
            raise UsageError(f"--version-label {item!r} must be LABEL=VERSION, e.g. "
                             "stable=3") from None
    return labels


__all__ = ["read", "parse", "parse_labels"]
