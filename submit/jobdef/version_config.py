"""gcloud's `versions create` and `models create` flags that say where and how Cloud ML
served a model: taken, checked, recorded in the resource, and (where they change
nothing here) said so in one line.

- `versions create --config FILE`: a YAML or JSON Version resource, as gcloud reads it
  (`deploymentUri`, `runtimeVersion`, `framework`, `pythonVersion`, `machineType`,
  `description`, `labels`, `autoScaling`, `manualScaling`); the flags win over it. A
  field for Python code or containers this server does not run is refused, an unknown
  field is an error naming it.
- `--framework`: TensorFlow (any of gcloud's spellings); scikit-learn and XGBoost are
  refused (this server loads SavedModels).
- `--runtime-version`, `--python-version`, `--machine-type`: recorded in the Version.
- `--region` (models and versions): gcloud's regional endpoint; recorded on the model
  as its region; every model here is served where `predict serve` runs.
- `models create --enable-logging`, `--enable-console-logging`: Cloud ML's
  onlinePredictionLogging and onlinePredictionConsoleLogging, recorded.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from submit.jobdef import config_reader, spellings
from submit.jobdef import spec as specs
from submit.errors import ConfigError, UsageError

FRAMEWORKS = ("TENSORFLOW",)
REFUSED_FRAMEWORKS = {
    "SCIKIT_LEARN": "this server loads TensorFlow SavedModels, not scikit-learn "
                    "pickles; export a SavedModel or drop --framework",
    "XGBOOST": "this server loads TensorFlow SavedModels, not XGBoost boosters; export "
               "a SavedModel or drop --framework"}
MACHINE_TYPE = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)+")
RECORDED = ("runtimeVersion", "pythonVersion", "machineType", "framework",
            "autoScaling", "manualScaling")
CONFIG_KEYS = ("deploymentUri", "description", "labels", *RECORDED)
REFUSED_KEYS = {
    "predictionClass": "custom prediction routines run your Python code, which this "
                       "server does not; serve a SavedModel",
    "packageUris": "custom prediction routines' packages are not installed by this "
                   "server; serve a SavedModel",
    "container": "custom containers are served by their own image; run it yourself",
    "routes": "custom containers' routes belong to their own image",
    "acceleratorConfig": "this server predicts on CPU",
    "explanationConfig": "explanations are not served here",
}
Echo = Callable[..., None]


def framework(text: str | None, where: str = "--framework") -> str | None:
    """`tensorflow`, `TENSORFLOW`, ...; the others refused with why."""
    if text is None:
        return None
    return spellings.enum_value(text, FRAMEWORKS, f"{where}", refused=REFUSED_FRAMEWORKS)


def read_version_config(path: str) -> dict[str, Any]:
    """`--config FILE`: the Version fields it gives, checked."""
    doc = config_reader.read_document(path)
    where = f"--config {path}"
    for key in doc:
        if key in REFUSED_KEYS:
            raise ConfigError(f"{where}: {key}: {REFUSED_KEYS[key]}")
        if key not in CONFIG_KEYS and key != "name":
            raise ConfigError(f"{where}: unknown Version field {key!r}; use "
                              f"{', '.join(CONFIG_KEYS)}")
    for key in ("deploymentUri", "description", "runtimeVersion", "pythonVersion",
                "machineType", "framework"):
        if key in doc and not isinstance(doc[key], str):
            raise ConfigError(f"{where}: {key} must be a string, not "
                              f"{type(doc[key]).__name__}")
    for key in ("autoScaling", "manualScaling", "labels"):
        if key in doc and not isinstance(doc[key], dict):
            raise ConfigError(f"{where}: {key} must be a mapping")
    if "labels" in doc:
        doc["labels"] = specs.check_labels(doc["labels"], f"{where} labels")
    return dict(doc)


def version_fields(*, config_path: str | None, origin: str | None,
                   description: str | None, labels: Mapping[str, str],
                   runtime_version: str | None, python_version: str | None,
                   machine_type: str | None, framework_text: str | None) -> dict[str, Any]:
    """The version's fields from --config and the flags (the flags win): origin,
    description, labels and the recorded settings."""
    doc = read_version_config(config_path) if config_path else {}
    given = {"runtimeVersion": runtime_version, "pythonVersion": python_version,
             "machineType": machine_type, "framework": framework_text}
    flags = {"runtimeVersion": "--runtime-version", "pythonVersion": "--python-version",
             "machineType": "--machine-type", "framework": "--framework"}
    settings: dict[str, Any] = {}
    for key in RECORDED:
        value = given.get(key) if given.get(key) is not None else doc.get(key)
        if value is None:
            continue
        where = flags[key] if given.get(key) is not None else f"--config {key}"
        if key == "framework":
            value = framework(value, where)
        elif key in ("runtimeVersion", "pythonVersion"):
            if not specs.VERSIONS[key].fullmatch(value):
                raise UsageError(f"{where} {value!r:.40} is not a version; write e.g. "
                                 f"{'2.11' if key == 'runtimeVersion' else '3.7'}")
        elif key == "machineType" and not MACHINE_TYPE.fullmatch(value):
            raise UsageError(f"{where} {value!r:.40} is not a machine type; write e.g. "
                             "n1-standard-4 or mls1-c1-m2")
        settings[key] = value
    origin = origin if origin is not None else doc.get("deploymentUri")
    if origin is None:
        raise UsageError("give the export to publish: --origin URL (or deploymentUri in "
                         "--config)")
    all_labels = {**(doc.get("labels") or {}), **labels}
    return {"origin": origin,
            "description": description if description is not None
            else doc.get("description"),
            "labels": all_labels, "settings": settings}


def note_settings(settings: Mapping[str, Any], echo: Echo) -> None:
    """One line on stderr for the recorded settings that change nothing here."""
    shown = [k for k in ("runtimeVersion", "pythonVersion", "machineType",
                         "autoScaling", "manualScaling") if k in settings]
    if shown:
        echo(f"{', '.join(shown)} recorded in the Version; `predict serve` serves it on "
             "this machine's TensorFlow and Python, where it runs", err=True)


def check_region(region: str | None, flag: str = "--region") -> str | None:
    if region is not None and not specs.VERSIONS["region"].fullmatch(region):
        raise UsageError(f"{flag} {region!r:.40} is not a Google Cloud region; write e.g. "
                         "us-central1")
    return region


def region_note(region: str | None, echo: Echo) -> None:
    if region is not None:
        echo(f"--region {region}: gcloud's regional endpoint; models here are served "
             "where `predict serve` runs", err=True)
