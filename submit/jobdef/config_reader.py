"""The hardened reader in front of config.yaml's schema: a --config file as a mapping.

Only a regular file of at most MAX_CONFIG_BYTES is read (a device never ends, a pipe
blocks); it must be UTF-8; JSON or YAML (by the name) with every key once (never
last-wins), nesting bounded before any parser recurses, YAML's safe loader only, aliases
whose expansion is bounded (the billion laughs), and YAML 1.1's base-60 numbers kept as
the text written. Top-level `x-` keys hold anchors and are dropped. What the mapping
holds is the schema's business (`submit.jobdef.config_schema`).
"""
from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any

import yaml

from mljob.errors import first_line, too_many_digits
from submit.jobdef import spellings
from submit.errors import ConfigError

MAX_CONFIG_BYTES = 1024 * 1024
MAX_CONFIG_DEPTH = 50  # a job config nests 4 deep; parsers recurse per level


def read_document(path: str) -> dict:
    """The whole config file as a mapping (its `x-` keys dropped), refusing anything
    odd."""
    data = _read_config(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--config {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} "
                          f"at offset {exc.start}); save it as UTF-8") from None
    if path.endswith(".json"):
        try:
            document = json.loads(text, object_pairs_hook=_unique_keys)
        except _RepeatedKey as exc:
            raise ConfigError(f"--config {path} repeats the key {exc.key!r:.60}; give each "
                              "key once (the last one would silently win)") from None
        except ValueError as exc:
            raise ConfigError(f"--config {path} is not valid JSON: "
                              f"{too_many_digits(exc) or exc}") from None
        except RecursionError:
            raise ConfigError(f"--config {path} nests values too deeply; a job config "
                              f"needs at most {MAX_CONFIG_DEPTH} levels") from None
    else:
        document = _safe_yaml(text, path)
    if not isinstance(document, dict):
        raise ConfigError(f"--config {path} must be a mapping with a 'trainingInput' key, "
                          f"not {type(document).__name__}")
    # `x-` keys hold YAML anchors for the rest (docker-compose's convention)
    return {k: v for k, v in document.items()
            if not (isinstance(k, str) and k.startswith("x-"))}


class _RepeatedKey(Exception):
    def __init__(self, key, line: int | None = None):
        super().__init__(key)
        self.key, self.line = key, line


def _unique_keys(pairs: list) -> dict:
    """json's object_pairs_hook: a key given twice is an error, not last-wins."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKey(key)
        out[key] = value
    return out


class _ConfigLoader(yaml.SafeLoader):
    """yaml's safe loader, stricter: a key given twice in a mapping is an error (not
    last-wins), and YAML 1.1's base-60 numbers (`1:30` is 90) stay the text written."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and \
                    key_node.tag != "tag:yaml.org,2002:merge":  # `<<: *base`
                key = self.construct_object(key_node)
                try:
                    if key in seen:
                        raise _RepeatedKey(key, key_node.start_mark.line + 1)
                    seen.add(key)
                except TypeError:  # unhashable: the safe loader refuses it below
                    continue
        return super().construct_mapping(node, deep)

    def construct_base60(self, node):
        if ":" in str(node.value):
            return self.construct_scalar(node)
        tag = node.tag.rsplit(":", 1)[-1]
        return (yaml.SafeLoader.construct_yaml_int if tag == "int"
                else yaml.SafeLoader.construct_yaml_float)(self, node)


for _tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float"):
    _ConfigLoader.add_constructor(_tag, _ConfigLoader.construct_base60)


def _read_config(path: str) -> bytes:
    """At most MAX_CONFIG_BYTES of a regular file: a device (/dev/zero) never ends and a
    named pipe blocks until written, so only regular files are opened, and the read
    stops one byte past the limit whatever the file claims its size is."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            kind = "folder" if stat.S_ISDIR(mode) else \
                "named pipe" if stat.S_ISFIFO(mode) else "device or socket"
            raise ConfigError(f"cannot read --config {path}: it is a {kind}, not a "
                              "regular file; pass a config.yaml or JSON file")
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        reason = ("a symbolic link loop" if exc.errno == errno.ELOOP
                  else exc.strerror or first_line(exc))
        raise ConfigError(f"cannot read --config {path}: {reason}") from None
    if len(data) > MAX_CONFIG_BYTES:
        size = max(os.path.getsize(path), len(data))
        raise ConfigError(f"--config {path} is {size} bytes; the limit is "
                          f"{MAX_CONFIG_BYTES} (a job config is a few lines)")
    return data


def _safe_yaml(text: str, path: str) -> Any:
    """yaml.safe_load, after refusing deep nesting (the loader recurses once per level:
    thousands overflow the stack) and aliases that expand too far (a few lines of them
    expand to gigabytes); anchors and aliases within the bound are YAML as written."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_CONFIG_DEPTH:
                    raise ConfigError(
                        f"--config {path} line {event.start_mark.line + 1} nests values "
                        f"more than {MAX_CONFIG_DEPTH} levels deep; a job config needs 4")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        loader = _ConfigLoader(text)  # a SafeLoader, stricter
        try:
            node = loader.get_single_node()
            spellings.check_expansion(node, path, MAX_CONFIG_DEPTH)  # anchors, bounded
            return None if node is None else loader.construct_document(node)
        finally:
            loader.dispose()
    except _RepeatedKey as exc:
        raise ConfigError(f"--config {path} line {exc.line} repeats the key {exc.key!r:.60}; "
                          "give each key once (the last one would silently win)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())  # one line
        raise ConfigError(f"--config {path} is not valid YAML{where}: {problem}") from None
    except ValueError as exc:  # yaml converts digits with int()
        if not too_many_digits(exc):
            raise
        raise ConfigError(f"--config {path} holds {too_many_digits(exc)}") from None

