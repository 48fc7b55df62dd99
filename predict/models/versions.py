"""What a server serves: each model's config (name, base path, version policy, labels),
how its versions load, and the published version folders found under a base path.

A version folder (`BASE/<number>/`) counts only once its publish marker is there
(`saved_model.pb`, or `export.meta` for a TF1 export): the trainer writes that file
last, so a folder without it is half-published. The policy picks which of the found
versions to serve, as TF Serving's model_version_policy does; `predict.models.repository`
loads and unloads them.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from mljob import contracts, storage
from mljob.errors import ascii_digits
from predict.errors import UsageError

MARKERS = (contracts.SAVED_MODEL_MARKER, contracts.LEGACY_EXPORT_MARKER)
MAX_VERSION = 2 ** 63 - 1


@dataclass(frozen=True)
class LoadOptions:
    """How versions load: TF Serving's --max_num_load_retries,
    --load_retry_interval_micros, and the warmup replayed before traffic."""

    max_retries: int = 5
    retry_interval_s: float = 60.0
    warmup: object = None  # callable(model, version_url) or None


@dataclass(frozen=True)
class VersionPolicy:
    """TF Serving's model_version_policy: `latest` N, `all`, or `specific` versions;
    `registry` (none given): with a model's record (mljob.model_meta) every READY one."""

    kind: str = "latest"
    count: int = 1
    versions: frozenset = frozenset()
    registry: bool = False

    def choose(self, found) -> set:
        found = sorted(found)
        if self.kind == "all":
            return set(found)
        if self.kind == "specific":
            return set(found) & set(self.versions)
        return set(found[-self.count:])

    @classmethod
    def parse(cls, text: str) -> "VersionPolicy":
        """`latest`, `latest:N`, `all` or `specific:1,2` (the --model-version-policy flag)."""
        kind, _, arg = text.strip().partition(":")
        try:
            if kind == "latest":
                count = int(arg) if arg else 1
                if count < 1:
                    raise ValueError
                return cls("latest", count=count)
            if kind == "all" and not arg:
                return cls("all")
            if kind == "specific":
                versions = frozenset(parse_version(v) for v in arg.split(",") if v.strip())
                if versions:
                    return cls("specific", versions=versions)
        except ValueError:
            pass
        raise UsageError(f"version policy {text!r} is not one of latest, latest:N (N >= 1), "
                         "all, specific:V1,V2,...")

    def describe(self) -> str:
        if self.kind == "specific":
            return "specific:" + ",".join(str(v) for v in sorted(self.versions))
        return "all" if self.kind == "all" else f"latest:{self.count}"


@dataclass(frozen=True)
class ModelConfig:
    """One served model: its name, where its versions are, which to serve, labels."""

    name: str
    base_path: str | None = None     # BASE/<version>/ folders, watched
    model_dir: str | None = None     # one export served as version 1, not watched
    policy: VersionPolicy = VersionPolicy()
    labels: dict = field(default_factory=dict)   # label -> version
    logging: object = None  # predict.models.request_log.LoggingSpec: sampled request logs

    def __post_init__(self):
        # a newline in a name forged a second "ready" line in the server's log
        for what, text in (("model name", self.name), ("base path", self.base_path),
                           ("model dir", self.model_dir), *(("version label", label)
                                                            for label in self.labels)):
            if isinstance(text, str) and any(ord(c) < 32 or ord(c) == 127 for c in text):
                raise UsageError(f"{what} {text!r:.80} holds a control character; "
                                 "write it without one")


def parse_version(text) -> int:
    text = str(text).strip()
    if not ascii_digits(text) or len(text) > 19 or int(text) > MAX_VERSION:
        raise ValueError(f"{text!r:.40} is not a version number")
    return int(text)


def scan_versions(base_path: str, known=()) -> dict:
    """{version: URL} of the published version folders under base_path. Folders in
    `known` are taken as published without looking for their marker again."""
    fs, root = storage.filesystem(base_path)
    root = root.rstrip("/")
    fs.invalidate_cache(root)  # object stores' listings are cached by fsspec
    entries = storage.retry(lambda: fs.ls(root, detail=True), f"list {base_path}")
    found = {}
    for entry in entries:
        name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
        if entry.get("type") != "directory" or not ascii_digits(name) \
                or len(name) > 19:  # int() refuses 4,300 digits; int64 has 19
            continue
        version = int(name)
        if version > MAX_VERSION:
            continue
        if version in known or any(
                storage.retry(functools.partial(fs.exists, f"{root}/{name}/{m}"),
                              f"check {base_path}/{name}") for m in MARKERS):
            found[version] = storage.join(base_path, name)
    return found


__all__ = ["MARKERS", "MAX_VERSION", "LoadOptions", "VersionPolicy", "ModelConfig",
           "parse_version", "scan_versions"]
