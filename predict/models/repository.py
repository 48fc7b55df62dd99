"""Models served by version, the way TF Serving's manager serves them.

A model is a base path holding numbered version folders (TF Serving's layout:
`BASE/1/saved_model.pb`, `BASE/2/...`) on any fsspec filesystem. A watcher thread lists
every base path each `poll_seconds` and follows these rules:

- a version folder counts only once its publish marker is there (`saved_model.pb`, or
  `export.meta` for a TF1 export): the trainer writes that file last (or renames the
  whole folder into place), so a folder without it is half-published and never loaded;
- the version policy picks which of the found versions to serve: the latest N
  (default 1), all, or specific ones; with none given, a base path holding a model's
  record (`BASE/mljob-model.json`, `submit models`) serves every READY version, the
  default through its label, and a version deleted there is unloaded at once;
- a new version is loaded beside the old ones and takes traffic only once loaded; a
  version no longer wanted is unloaded only when a wanted one is available
  (availability first, TF Serving's default), and closed when the last request using
  it has finished, so a swap never fails a request;
- a version that fails to load is tried again `max_num_load_retries` times (TF
  Serving's default 5), `load_retry_interval_micros` apart (60 s), staying LOADING;
  then it is reported in the status (state END with the error) and not tried again;
  it never replaces a good version;
- with warmup on, a loaded version first replays its `assets.extra/
  tf_serving_warmup_requests` (predict.models.warmup) and takes traffic only after;
- one log line per version event: loading, available, failed (with its error),
  unloaded;
- a storage outage while listing is logged and changes nothing.

A request names a version, a label (which names a version) or neither (the highest
available version).
"""
from __future__ import annotations

import dataclasses as _dataclasses
import functools
import gc
import logging
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

from mljob import model_meta, storage
from mljob.errors import first_line
from predict.errors import PredictError, UsageError
from predict.models.versions import LoadOptions, ModelConfig, scan_versions

if TYPE_CHECKING:
    from predict.runtime.model import Model

log = logging.getLogger("predict.repository")

KEEP_ENDED = 16  # unloaded or failed versions kept in the status answer


class NotFoundError(PredictError):
    """No such model, version or label, or no version available: HTTP 404."""


class _Version:
    def __init__(self, number: int, url: str):
        self.number = number
        self.url = url
        self.state = "LOADING"
        self.error = ""
        self.model: Model | None = None
        self.refs = 0
        self.retired = False
        self.loaded_at = 0.0

    def status(self) -> dict:
        code = "UNKNOWN" if self.error else "OK"
        return {"version": str(self.number), "state": self.state,
                "status": {"error_code": code, "error_message": self.error}}


class ServedModel:
    """One model's versions: loads, serves, unloads."""

    def __init__(self, config: ModelConfig, loader=None, events=None,
                 load_options: LoadOptions = LoadOptions(), stop=None):
        from predict.runtime import model as models
        self.config = config
        self.name = config.name
        self._load = loader or models.load
        self._events = events  # called as events(model_name, what, version, url) when set
        self._options = load_options
        self._stop = stop or threading.Event()  # ends load retries early
        self._lock = threading.Lock()
        self._versions: dict = {}  # number -> _Version (loading, available, ended)
        self._file_labels: dict = {}  # BASE/mljob-model.json's (`versions set-default`)
        self._registered = False      # whether BASE holds that record (last read)

    # --- the watcher's side ---------------------------------------------------------
    def poll(self) -> None:
        """List the versions, load the wanted new ones, unload the unwanted."""
        if self.config.model_dir is not None:
            found = {1: self.config.model_dir}
        else:
            assert self.config.base_path is not None  # a config names one or the other
            with self._lock:
                known = {n for n, v in self._versions.items() if v.state != "END"}
            found = scan_versions(self.config.base_path, known)
            self._read_file_labels(self.config.base_path)
        registry = self.config.policy.registry and self._registered
        # a model's record: every READY (published) version, the deleted ones unloaded
        wanted = set(found) if registry else self.config.policy.choose(found)
        for number in sorted(wanted):
            with self._lock:
                if number in self._versions:
                    continue
                version = self._versions[number] = _Version(number, found[number])
            self._load_version(version)
        self._unload_unwanted(wanted, force=registry)

    def _read_file_labels(self, base_path: str) -> None:
        """The model record's labels, read at every poll (a bad record changes nothing)."""
        try:
            record = model_meta.read(base_path)
            labels = model_meta.version_labels(record)
        except (ValueError, OSError, storage.StorageError) as exc:
            log.warning("model %s: %s unreadable: %s", self.name, model_meta.MODEL_FILE,
                        first_line(exc))
            return
        with self._lock:
            self._file_labels, self._registered = labels, record is not None

    @property
    def labels(self) -> dict:
        """Version labels: the config's (flags, model config file) over the record's."""
        return {**self._file_labels, **self.config.labels}

    def _load_version(self, version: _Version) -> None:
        attempts = 1 + self._options.max_retries
        message: str | None = None
        for attempt in range(1, attempts + 1):
            log.info("model %s: loading version %d from %s", self.name, version.number,
                     version.url)
            try:
                model = self._load(version.url)
            except Exception as exc:  # a bad export: report it, keep serving the others
                message = str(exc) if isinstance(exc, PredictError) else first_line(exc)
            else:
                message = self._warm(model, version)
                if message is None:
                    break
            if attempt < attempts:
                log.warning("model %s: version %d failed to load (attempt %d of %d): %s; "
                            "retrying in %gs", self.name, version.number, attempt,
                            attempts, message, self._options.retry_interval_s)
                if not self._stop.wait(self._options.retry_interval_s):
                    continue
            log.error("model %s: version %d failed to load: %s", self.name,
                      version.number, message)
            with self._lock:
                version.state, version.error = "END", message or "load failed"
            self._event("load_failed", version)
            return
        with self._lock:
            version.model, version.state = model, "AVAILABLE"
            version.loaded_at = time.time()
        log.info("model %s: version %d available", self.name, version.number)
        self._event("loaded", version)

    def _warm(self, model, version: _Version) -> str | None:
        """Replay the version's warmup requests; the error, or None when warm."""
        if self._options.warmup is None:
            return None
        try:
            count = self._options.warmup(model, version.url)  # type: ignore[operator]
        except Exception as exc:  # a bad warmup file fails the load, as in TF Serving
            model.close()
            message = str(exc) if isinstance(exc, PredictError) else first_line(exc)
            return f"warmup failed: {message}"
        if count:
            log.info("model %s: version %d warmed up with %d requests", self.name,
                     version.number, count)
        return None

    def retire(self) -> None:
        """The model left the config: unload every version (requests in flight finish)."""
        self._unload_unwanted(set(), force=True)

    def _unload_unwanted(self, wanted: set, force: bool = False) -> None:
        with self._lock:
            if not force and not any(v.state == "AVAILABLE" and n in wanted
                                     for n, v in self._versions.items()):
                return  # nothing wanted is up yet: keep serving what we have
            closing = []
            for number, version in self._versions.items():
                if number in wanted or version.state != "AVAILABLE":
                    continue
                version.state, version.retired = "END", True
                if version.refs == 0:
                    closing.append(version)
            self._forget_old_ended()
        for version in closing:
            self._close(version)

    def _close(self, version: _Version) -> None:
        model, version.model = version.model, None
        if model is not None:
            model.close()
            del model
            gc.collect()  # a SavedModel's graphs go only with the Python objects
        log.info("model %s: version %d unloaded", self.name, version.number)
        self._event("unloaded", version)

    def _forget_old_ended(self) -> None:
        ended = sorted(n for n, v in self._versions.items()
                       if v.state == "END" and v.refs == 0)
        for number in ended[:-KEEP_ENDED] if len(ended) > KEEP_ENDED else []:
            del self._versions[number]

    def _event(self, what: str, version: _Version) -> None:
        if self._events is not None:
            self._events(self.name, what, version.number, version.url)

    # --- the requests' side ---------------------------------------------------------
    @contextmanager
    def use(self, version: int | None = None, label: str | None = None):
        """(version number, Model) to predict with; the version is not closed before
        the block ends, even if it is unloaded meanwhile."""
        with self._lock:
            chosen = self._resolve(version, label)
            chosen.refs += 1
        try:
            yield chosen.number, chosen.model
        finally:
            with self._lock:
                chosen.refs -= 1
                close = chosen.retired and chosen.refs == 0 and chosen.model is not None
            if close:
                self._close(chosen)

    def _resolve(self, version: int | None, label: str | None) -> _Version:
        if label is not None:
            if label not in self.labels:
                labels = ", ".join(sorted(self.labels)) or "none"
                raise NotFoundError(f"model {self.name!r} has no version label {label!r} "
                                    f"(labels: {labels})")
            version = self.labels[label]
        if version is None:
            available = [n for n, v in self._versions.items() if v.state == "AVAILABLE"]
            if not available:
                raise NotFoundError(f"model {self.name!r} has no available version yet")
            return self._versions[max(available)]
        found = self._versions.get(version)
        if found is None or found.state != "AVAILABLE":
            available = sorted(n for n, v in self._versions.items() if v.state == "AVAILABLE")
            raise NotFoundError(
                f"model {self.name!r} has no version '{version}' available"
                + (f" (label {label!r})" if label else "")
                + f"; available: {', '.join(map(str, available)) or 'none'}")
        return found

    def status(self, version: int | None = None, label: str | None = None) -> list:
        """TF Serving's model_version_status: every version known, newest first; one
        version when a version or label is named."""
        with self._lock:
            if version is not None or label is not None:
                if label is not None:
                    if label not in self.labels:
                        raise NotFoundError(f"model {self.name!r} has no version label "
                                            f"{label!r}")
                    version = self.labels[label]
                if version not in self._versions:
                    raise NotFoundError(f"model {self.name!r} has no version '{version}'")
                return [self._versions[version].status()]
            return [self._versions[n].status() for n in sorted(self._versions, reverse=True)]

    def available(self) -> list:
        with self._lock:
            return sorted(n for n, v in self._versions.items() if v.state == "AVAILABLE")

    def close(self) -> None:
        with self._lock:
            versions = [v for v in self._versions.values() if v.model is not None]
        for version in versions:
            version.model.close()


class Repository:
    """Every served model, and the watcher thread that polls their base paths."""

    def __init__(self, configs, *, poll_seconds: float = 1.0, loader=None, events=None,
                 load_options: LoadOptions = LoadOptions(),
                 labels_for_unavailable: bool = False):
        _check_names(configs)
        self._stop = threading.Event()
        self._new = functools.partial(ServedModel, loader=loader, events=events,
                                      load_options=load_options, stop=self._stop)
        self.models = {c.name: self._new(c) for c in configs}
        self.poll_seconds = poll_seconds
        self.labels_for_unavailable = labels_for_unavailable
        self._thread: threading.Thread | None = None
        self._reload_lock = threading.Lock()

    def start(self) -> None:
        """Poll once now (a missing base path or a first version that cannot load is
        the user's mistake), then keep polling in a thread."""
        for served in self.models.values():
            config = served.config
            try:
                served.poll()
            except FileNotFoundError:
                raise UsageError(f"model {config.name!r}: base path {config.base_path} does "
                                 "not exist; TF Serving's layout is BASE/<version>/"
                                 "saved_model.pb") from None
            if config.model_dir is not None and not served.available():
                (status,) = served.status()
                raise UsageError(status["status"]["error_message"])
            if not served.available() and served.status():
                raise UsageError(f"model {config.name!r}: no version under "
                                 f"{config.base_path} could be loaded: "
                                 f"{served.status()[0]['status']['error_message']}")
            if not served.status():
                log.warning("model %s: no published version under %s yet; waiting",
                            config.name, config.base_path)
        self.check_labels({n: m.config for n, m in self.models.items()}, {})
        if self.poll_seconds > 0 and any(m.config.base_path for m in self.models.values()):
            self._thread = threading.Thread(target=self._watch, name="version-watcher",
                                            daemon=True)
            self._thread.start()

    def reload(self, configs) -> None:
        """TF Serving's ReloadConfig: serve exactly these models. New models are loaded,
        models no longer named are unloaded, changed ones take their new policy and
        labels; labels are checked only once the new versions are loaded, and a label
        naming a version that is not available fails the reload (UsageError) and
        keeps the labels before (TF Serving's rule), unless
        --allow_version_labels_for_unavailable_models lets a *new* label do so."""
        _check_names(configs)
        with self._reload_lock:
            wanted = {c.name: c for c in configs}
            before = {n: m.config for n, m in self.models.items()}
            models = dict(self.models)
            for name, config in wanted.items():
                served = models.get(name)
                if served is None:
                    models[name] = self._new(config)
                else:
                    served.config = _dataclasses.replace(config, labels=served.config.labels)
            for name in set(models) - set(wanted):
                models.pop(name).retire()
                log.info("model %s: removed from the config; its versions are unloaded",
                         name)
            self.models = models
            for name in wanted:
                try:
                    self.models[name].poll()
                except FileNotFoundError:
                    raise UsageError(f"model {name!r}: base path "
                                     f"{self.models[name].config.base_path} does not "
                                     "exist") from None
            self.check_labels(wanted, before)
            for name, config in wanted.items():
                self.models[name].config = config

    def check_labels(self, wanted: dict, before: dict) -> None:
        for name, config in wanted.items():
            available = set(self.models[name].available())
            old = before[name].labels if name in before else {}
            for label, version in sorted(config.labels.items()):
                if version in available or old.get(label) == version:
                    continue
                if self.labels_for_unavailable and label not in old:
                    continue
                raise UsageError(f"model {name!r}: label {label!r} names version {version}, "
                                 "which is not available; labels may name only loaded "
                                 "versions (or pass --allow_version_labels_for_unavailable_"
                                 "models for new labels)")

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            for served in list(self.models.values()):
                if served.config.base_path is None:
                    continue
                try:
                    served.poll()
                except Exception as exc:  # storage outage, vanished folder: keep serving
                    log.warning("model %s: cannot list %s: %s", served.name,
                                served.config.base_path, first_line(exc))

    def get(self, name: str) -> ServedModel:
        try:
            return self.models[name]
        except KeyError:
            raise NotFoundError(f"model {name!r} not found; this server serves "
                                f"{', '.join(repr(n) for n in sorted(self.models))}") from None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        for served in self.models.values():
            served.close()


def _check_names(configs) -> None:
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise UsageError(f"model name {dup!r} is given twice; each model needs its own "
                         "name")


__all__ = ["ServedModel", "Repository", "NotFoundError"]
