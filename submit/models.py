"""Models and versions as Cloud ML's Model and Version resources, over TF Serving's layout.

A model is a base path (any fsspec URL; by default `$MLJOB_HOME/serving/<model>`) that a
`predict serve --model-base-path` watches; the local index `$MLJOB_HOME/models/<model>
.json` maps its name to that path. A version is a numbered folder published as `predict
publish` publishes (every file, then the marker last), named as gcloud names versions
(`v1`, `prod_2`) in the model's record `BASE/mljob-model.json` (`mljob.model_meta`),
which also holds the default version: the server reads it as the label `default` at
every poll, so `set-default` takes effect live. A folder published without a name (by
`predict publish`) is the version `v<N>`.

As Cloud ML: the first version becomes the default; the default version cannot be
deleted while others exist; a model with versions cannot be deleted.
"""
from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import re
from collections.abc import Iterator
from typing import Any

from mljob import contracts, model_meta, storage
from mljob.model_meta import MAX_VERSION
from submit.jobdef import spec as specs
from submit.errors import SubmitError, UsageError
from submit.home import exclusive, mljob_home
from submit.jobdef.spellings import JOB_ID, suggest_job_id

_NUMBERED = re.compile(r"[vV]?([1-9][0-9]{0,17})")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_name(name: str, what: str) -> None:
    """Cloud ML's rule for model and version names (the job id's)."""
    if not JOB_ID.fullmatch(name or ""):
        raise UsageError(f"invalid {what} name {name!r:.80}: use letters, digits and "
                         "underscores, starting with a letter, at most 128 characters, "
                         f"e.g. {suggest_job_id(name or 'v1')}")


def index_path(model: str) -> str:
    check_name(model, "model")
    return os.path.join(mljob_home(), "models", f"{model}.json")


def base_path(model: str) -> str:
    """The model's base path, from the local index."""
    try:  # storage's reader: a named pipe or device here is refused, never opened
        entry = json.loads(storage.read_bytes(index_path(model), limit=64 * 1024))
        if not isinstance(entry["basePath"], str) or not entry["basePath"]:
            raise ValueError("basePath is not a URL")
        return entry["basePath"]
    except FileNotFoundError:
        raise UsageError(f"no model {model!r} in the local index; create it with "
                         f"`python -m submit models create {model}` or see `models "
                         "list`") from None
    except (ValueError, KeyError, TypeError, OSError, storage.StorageError):
        raise SubmitError(f"the model entry {index_path(model)} is damaged; remove "
                          "it") from None


def names() -> list[str]:
    folder = os.path.join(mljob_home(), "models")
    return sorted(n[:-5] for n in (os.listdir(folder) if os.path.isdir(folder) else [])
                  if n.endswith(".json") and JOB_ID.fullmatch(n[:-5]))


def record(model: str) -> tuple[str, dict[str, Any]]:
    """(base path, the model's record), the record with every published folder."""
    base = base_path(model)
    try:
        data = model_meta.read(base)
    except UnicodeDecodeError:
        raise SubmitError(f"{model_meta.url(base)} is damaged (not UTF-8); restore or "
                          "remove it") from None
    except storage.TooLargeError as exc:  # never written so by mljob; by hand, or before
        raise SubmitError(f"{' '.join(str(exc).split())[:300]}; restore it, or delete the "
                          "versions (named by their folders, v<N>) and the model") from None
    except ValueError as exc:  # names the file, and its first field that is wrong
        text = " ".join(str(exc).split())[:300]
        if model_meta.url(base) not in text:
            text = f"{model_meta.url(base)} is damaged ({text})"
        raise SubmitError(f"{text}; restore or remove it") from None
    if data is None:
        raise SubmitError(f"model {model!r}'s record {model_meta.url(base)} is missing; "
                          "delete the model and create it again")
    return base, data


def published(base: str) -> dict[int, str]:
    """{number: URL} of the published version folders (an absent base path: none)."""
    from predict.models.repository import scan_versions
    try:
        return scan_versions(base)
    except FileNotFoundError:
        return {}


def versions(base: str, data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every version, named: the record's, and `v<N>` for folders published without a
    name; each with its number and whether its folder is there."""
    folders = published(base)
    out = {name: dict(v, published=v.get("number") in folders)
           for name, v in (data.get("versions") or {}).items() if isinstance(v, dict)}
    named = {v.get("number") for v in out.values()}
    for number in sorted(set(folders) - named):
        out.setdefault(f"v{number}", {"number": number, "published": True})
    return out


def find_version(base: str, data: dict[str, Any], name: str, model: str) -> dict:
    check_name(name, "version")
    found = versions(base, data).get(name)
    if found is None:
        raise UsageError(f"model {model!r} has no version {name!r}; see `python -m "
                         f"submit versions list --model {model}`")
    return found


def model_resource(model: str, base: str, data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": model, "description": data.get("description"),
                           "labels": data.get("labels") or {},
                           "regions": data.get("regions") or None,
                           "onlinePredictionLogging": data.get("onlinePredictionLogging"),
                           "onlinePredictionConsoleLogging":
                               data.get("onlinePredictionConsoleLogging")}
    default = data.get("defaultVersion")
    all_versions = versions(base, data)
    if default in all_versions:
        out["defaultVersion"] = version_resource(model, base, data, default,
                                                 all_versions[default])
    out["mljob"] = {"basePath": base, "createTime": data.get("createTime")}
    return {k: v for k, v in out.items() if v is not None}


def version_resource(model: str, base: str, data: dict[str, Any], name: str,
                     version: dict[str, Any]) -> dict[str, Any]:
    number = version["number"]
    out = {"name": name, "description": version.get("description"),
           "deploymentUri": storage.join(base, str(number)),
           "createTime": version.get("createTime"),
           "state": "READY" if version.get("published") else "FAILED",
           "errorMessage": None if version.get("published") else
           f"the folder {storage.join(base, str(number))} is not published",
           "isDefault": data.get("defaultVersion") == name,
           "labels": version.get("labels") or {}, "framework": "TENSORFLOW",
           **{k: v for k, v in (version.get("settings") or {}).items()
              if k != "framework"},
           "mljob": {"model": model, "number": number, "origin": version.get("origin")}}
    return {k: v for k, v in out.items() if v is not None}


# --- changes --------------------------------------------------------------------------
#
# Every change of a record is a read-change-write under the model's lock (a file beside
# its index entry), so that concurrent commands on one machine each see the others'
# changes; a record is written only when its reader takes it (model_meta.MAX_BYTES), and
# descriptions and labels are bounded when given (MAX_DESCRIPTION, Google Cloud's labels).

MAX_DESCRIPTION = 4096  # characters; Cloud ML documents no bound, its record needs one


@contextlib.contextmanager
def _lock(model: str) -> Iterator[None]:
    with exclusive(index_path(model)[:-len(".json")] + ".lock"):
        yield


def _check_description(text: str | None) -> None:
    if text is None:
        return
    specs.check_text(text, "--description")
    if len(text) > MAX_DESCRIPTION:
        raise UsageError(f"--description is {len(text)} characters; write at most "
                         f"{MAX_DESCRIPTION}")


def _write(model: str, base: str, data: dict[str, Any]) -> None:
    """The record written, or a one-line UsageError (nothing written) when it would be
    larger than its readers take."""
    try:
        model_meta.write(base, data)
    except ValueError as exc:
        raise UsageError(f"model {model!r}: {exc}; shorten its descriptions or delete "
                         "versions it no longer needs") from None


def _fits(model: str, base: str, data: dict[str, Any]) -> None:
    size = len(model_meta.encode(data))
    if size > model_meta.MAX_BYTES:
        raise UsageError(f"model {model!r}: {model_meta.url(base)} would hold {size} "
                         f"bytes, more than the {model_meta.MAX_BYTES} its readers take; "
                         "shorten its descriptions or delete versions it no longer needs")


def _readable(model: str) -> tuple[str, dict[str, Any], str | None]:
    """(base, record, why): a record that cannot be read (damaged, too large, missing)
    as an empty one with why, so that a model can always be deleted."""
    try:
        base, data = record(model)
        return base, data, None
    except UsageError:  # no such model
        raise
    except SubmitError as exc:
        return base_path(model), {}, str(exc)


def create_model(model: str, base: str | None, description: str | None,
                 labels: dict[str, str], regions: list[str],
                 logging: dict[str, bool] | None = None) -> str:
    path = index_path(model)
    if os.path.exists(path):
        raise UsageError(f"model {model!r} already exists; pick another name, or delete "
                         "it first")
    if base is None:
        base = os.path.join(mljob_home(), "serving", model)
    base = specs._normalise_url(base, "--base-path")
    _check_description(description)
    labels = specs.check_labels(labels, "the model's labels")
    with _lock(model):
        if model_meta.read(base) is not None:
            raise UsageError(f"--base-path {base} already holds a model's record "
                             f"({model_meta.MODEL_FILE}); pick another base path")
        _write(model, base, {"name": model, "description": description, "labels": labels,
                             "regions": regions, "createTime": _now(), "versions": {},
                             "defaultVersion": None, **(logging or {})})
        storage.write_bytes(path, json.dumps({"name": model, "basePath": base}).encode())
    return base


def delete_model(model: str) -> None:
    """As Cloud ML: only a model without versions. A record that cannot be read (damaged,
    too large, missing) is no obstacle: its published folders are the versions left."""
    with _lock(model):
        base, data, why = _readable(model)
        left = versions(base, data)
        if left:
            raise UsageError(f"model {model!r} has versions; delete them first (`python -m "
                             f"submit versions list --model {model}`), as Cloud ML requires"
                             + (f" (its record cannot be read, so they are named by their "
                                f"folders: {', '.join(sorted(left))})" if why else ""))
        fs, path = storage.filesystem(model_meta.url(base))
        if storage.retry(lambda: fs.exists(path), f"check {model_meta.url(base)}"):
            storage.retry(lambda: fs.rm_file(path), f"remove {model_meta.url(base)}")
        os.remove(index_path(model))


def create_version(model: str, name: str, origin: str, description: str | None,
                   labels: dict[str, str],
                   settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """Publish the export and record it as version `name`: the folder first (its number
    claimed there, `predict.models.publish`), then the record re-read, changed and written
    under the model's lock. A record that could not take it (too large, the name taken
    meanwhile) unpublishes the folder again: nothing half-made."""
    from predict.models import publish
    check_name(name, "version")
    _check_description(description)
    labels = specs.check_labels(labels, "the version's labels")
    base, data = record(model)
    existing = versions(base, data)
    if name in existing:
        raise UsageError(f"model {model!r} already has version {name!r}; pick another "
                         "name (versions are never overwritten)")
    origin = specs._normalise_url(origin, "--origin")
    entry = {"origin": origin, "createTime": _now(), "labels": labels,
             "description": description, "settings": dict(settings or {})}
    _fits(model, base, {**data, "versions": {**(data.get("versions") or {}),
                                             name: {**entry, "number": MAX_VERSION}}})
    taken = {v["number"] for v in existing.values()}
    wanted = _NUMBERED.fullmatch(name)
    number = int(wanted[1]) if wanted and int(wanted[1]) not in taken else None
    # a name that is no free number: the next number free in the base path, claimed
    # there (two creates at once never ask for the same one)
    number = publish.publish(origin, base, number)
    try:
        with _lock(model):
            base, data = record(model)  # as other commands left it meanwhile
            clash = versions(base, data).get(name)
            if clash is not None and clash.get("number") != number:
                raise UsageError(f"model {model!r} got a version {name!r} meanwhile; pick "
                                 "another name (versions are never overwritten)")
            named = [n for n, v in (data.get("versions") or {}).items()
                     if isinstance(v, dict) and v.get("number") == number]
            if named:  # a record written by hand, naming a folder never published
                raise UsageError(f"model {model!r}'s record names number {number} for "
                                 f"version {named[0]!r}, whose folder is missing; delete "
                                 "that version first")
            data.setdefault("versions", {})[name] = {"number": number, **entry}
            if not data.get("defaultVersion"):
                data["defaultVersion"] = name  # Cloud ML: the first version is the default
            _write(model, base, data)
    except BaseException:
        _remove_folder(base, number)
        raise
    return data["versions"][name]


def _remove_folder(base: str, number: int) -> None:
    """A version's folder, unpublished first (its marker), so never half-served."""
    folder = storage.join(base, str(number))
    fs, path = storage.filesystem(folder)
    for marker in (contracts.SAVED_MODEL_MARKER, contracts.LEGACY_EXPORT_MARKER):
        marker_path = f"{path.rstrip('/')}/{marker}"
        if storage.retry(functools.partial(fs.exists, marker_path), f"check {folder}"):
            storage.retry(functools.partial(fs.rm_file, marker_path), f"unpublish {folder}")
    if storage.retry(lambda: fs.exists(path), f"check {folder}"):
        storage.retry(lambda: fs.rm(path, recursive=True), f"remove {folder}")


def delete_version(model: str, name: str) -> None:
    """As Cloud ML: not the default while others exist. With a record that cannot be read,
    a version is named by its folder (`v<N>`), and the record is left as it is."""
    with _lock(model):
        base, data, why = _readable(model)
        version = find_version(base, data, name, model)
        others = [n for n in versions(base, data) if n != name]
        if data.get("defaultVersion") == name and others:
            raise UsageError(f"version {name!r} is model {model!r}'s default; make another "
                             f"the default first (`versions set-default {others[0]} --model "
                             f"{model}`), as Cloud ML requires")
        _remove_folder(base, version["number"])
        if why is not None:
            return
        (data.get("versions") or {}).pop(name, None)
        if data.get("defaultVersion") == name:
            data["defaultVersion"] = None
        _write(model, base, data)


def set_default(model: str, name: str) -> dict[str, Any]:
    with _lock(model):
        base, data = record(model)
        version = find_version(base, data, name, model)
        if not version.get("published"):
            raise UsageError(f"version {name!r} of model {model!r} is not published; pick "
                             "a READY version")
        if name not in (data.get("versions") or {}):  # a folder `predict publish` made
            data.setdefault("versions", {})[name] = {"number": version["number"]}
        data["defaultVersion"] = name
        _write(model, base, data)
    return version
