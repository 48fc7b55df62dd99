"""Readers never see a publication half-way: `storage.publish_dir` swaps versions while a
reader looks after every step the publish takes (every rename, removal and upload), on
a local folder and on an object store (memory://). Each version's files carry its
number, so a mixed or missing read shows.

Local: every file can be read at every step (the new copy is exchanged with the old one
in one step, and the old one is removed only after). Object stores: whenever the marker
is there, the other files are all of the marker's version (the marker goes first when a
publish starts, last when it ends)."""
from __future__ import annotations

import os
import shutil

from mljob import storage

MARKER = "saved_model.pb"
FILES = ("variables/variables.index", "variables/variables.data-00000-of-00001",
         "assets/vocab.txt", MARKER)


def _version(tmp_path, n: int) -> str:
    folder = tmp_path / "src" / str(n)
    for rel in FILES:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(f"v{n} {rel}")
    return str(folder)


def _reading_after(target, name: str, read_once, problems: list, monkeypatch) -> None:
    """Make target.name call read_once after each call, recording what it finds."""
    inner = getattr(target, name, None)
    if inner is None:
        return

    def wrapped(*args, **kwargs):
        result = inner(*args, **kwargs)
        problem = read_once()
        if problem:
            problems.append(f"after {name}: {problem}")
        return result

    monkeypatch.setattr(target, name, wrapped)


def _publish_versions(tmp_path, url: str) -> None:
    sources = [_version(tmp_path, n) for n in range(3)]
    for source in sources + sources:
        storage.publish_dir(source, url, marker=MARKER)


def test_local_publish_is_never_missing(tmp_path, monkeypatch):
    path = tmp_path / "job" / "model"
    storage.publish_dir(_version(tmp_path, 9), str(path), marker=MARKER)

    def read_once():
        for rel in FILES:  # as a model loader reads: each file by its path
            try:
                with open(path / rel) as f:
                    if not f.read().startswith("v"):
                        return f"{rel} is empty"
            except FileNotFoundError:
                return f"{rel} is missing"
        return None

    problems: list[str] = []
    for target, name in ((os, "rename"), (os, "replace"), (shutil, "rmtree"),
                         (shutil, "copytree"), (storage, "_exchange")):
        _reading_after(target, name, read_once, problems, monkeypatch)
    _publish_versions(tmp_path, str(path))
    monkeypatch.undo()
    assert problems == []
    with open(path / MARKER) as f:
        assert f.read().startswith("v2 ")
    assert os.listdir(tmp_path / "job") == ["model"]  # no temporary or old copies left


def test_object_store_publish_never_shows_a_marker_over_changing_files(tmp_path, memfs,
                                                                       monkeypatch):
    url = "memory://published/model"
    storage.publish_dir(_version(tmp_path, 9), url, marker=MARKER)

    def read_one(rel):
        try:
            return memfs.store[f"/published/model/{rel}"].getvalue().decode().split()[0]
        except KeyError:
            return None

    def read_once():
        marker = read_one(MARKER)
        if marker is None:
            return None  # unpublished: a reader waits
        files = {rel: read_one(rel) for rel in FILES if rel != MARKER}
        wrong = {rel: v for rel, v in files.items() if v != marker}
        return f"marker {marker} over {wrong}" if wrong else None

    problems: list[str] = []
    for name in ("put_file", "pipe_file", "rm_file", "rm", "_rm", "makedirs", "mkdir"):
        _reading_after(type(memfs), name, read_once, problems, monkeypatch)
    _publish_versions(tmp_path, url)
    monkeypatch.undo()
    assert problems == []
    assert read_one(MARKER) == "v2" and read_once() is None
