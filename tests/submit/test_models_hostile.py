"""The model registry against hostile and concurrent use: it never writes a record its
own reader refuses (descriptions and labels bounded when given, the whole record by what
`mljob-model.json`'s reader takes), a model can always be deleted whatever its record
holds, and versions created at once by ten processes are all recorded."""
from __future__ import annotations

import json
import os

import pytest
import yaml

from mljob import model_meta
from submit import models
from submit.errors import UsageError
from tests.support.submit_cli import at_once, one_error_line, run


@pytest.fixture
def export(tmp_path):
    """What `versions create` publishes: a folder with the SavedModel's marker (the
    registry copies files; it loads nothing)."""
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "saved_model.pb").write_bytes(b"\x08\x01")
    (folder / "variables").mkdir()
    return str(folder)


@pytest.fixture
def base(capsys, tmp_path):
    base = tmp_path / "served" / "m"
    status, _, err = run(capsys, "models", "create", "m", "--base-path", str(base))
    assert status == 0, err
    return base


def ok(capsys, *argv) -> str:
    status, out, err = run(capsys, *argv)
    assert status == 0, err
    return out


def refused(capsys, *argv, status=2) -> str:
    got, out, err = run(capsys, *argv)
    assert got == status and out == "", (got, err)
    return one_error_line(err)


def published(base) -> list[str]:
    return sorted(n for n in os.listdir(base) if n.isdigit())


def test_two_600_kb_descriptions_are_refused_and_the_model_stays_usable(
        capsys, tmp_path, base, export):
    for i in (1, 2):
        config = tmp_path / f"v{i}.yaml"
        config.write_text(yaml.safe_dump({"deploymentUri": export,
                                          "description": "d" * 600_000}))
        line = refused(capsys, "versions", "create", f"v{i}", "--model", "m", "--config",
                       str(config))
        assert "--description is 600000 characters; write at most 4096" in line
    assert published(base) == []  # nothing was published for a refused version
    assert len((base / model_meta.MODEL_FILE).read_bytes()) < 4096
    line = refused(capsys, "models", "create", "m2", "--description", "x" * 4097)
    assert "write at most 4096" in line
    ok(capsys, "versions", "create", "v1", "--model", "m", "--origin", export,
       "--description", "é" * 4096)  # the bound is in characters
    assert json.loads(ok(capsys, "versions", "list", "--model", "m", "--format", "json"))[
        0]["description"] == "é" * 4096
    with pytest.raises(UsageError, match="more than Google Cloud's 64"):
        models.create_version("m", "v2", export, None, {f"k{i}": "v" for i in range(65)})
    with pytest.raises(UsageError, match="is not a Google Cloud label key"):
        models.create_version("m", "v2", export, None, {"K" * 64: "v"})
    assert published(base) == ["1"]
    ok(capsys, "versions", "delete", "v1", "--model", "m")
    ok(capsys, "models", "delete", "m")


def test_a_record_never_grows_past_what_its_reader_takes(capsys, base, export):
    """Versions whose descriptions are each within bounds, filling the record: the one
    that would take it past model_meta.MAX_BYTES is refused, nothing published."""
    data = model_meta.read(str(base))
    data["versions"] = {f"old{i}": {"number": 1000 + i, "description": "o" * 4000,
                                    "labels": {}, "settings": {}} for i in range(250)}
    room = model_meta.MAX_BYTES - len(model_meta.encode(data))
    data["description"] = "f" * (room - 2000)  # 2,000 bytes left
    model_meta.write(str(base), data)
    size = len((base / model_meta.MODEL_FILE).read_bytes())
    assert 1990 < model_meta.MAX_BYTES - size < 2010
    line = refused(capsys, "versions", "create", "v1", "--model", "m", "--origin", export,
                   "--description", "n" * 4096)
    assert f"more than the {model_meta.MAX_BYTES} its readers take" in line
    assert "shorten its descriptions or delete versions" in line
    assert published(base) == []
    assert len((base / model_meta.MODEL_FILE).read_bytes()) == size
    ok(capsys, "versions", "create", "v1", "--model", "m", "--origin", export)  # fits
    with pytest.raises(ValueError, match="would hold"):  # the writer's own bound
        model_meta.write(str(base), {**data, "description": "x" * model_meta.MAX_BYTES})


@pytest.mark.parametrize("damage", ["oversized", "not json", "missing", "wrong types"])
def test_a_model_is_always_deletable(capsys, base, export, damage):
    ok(capsys, "versions", "create", "v1", "--model", "m", "--origin", export)
    path = base / model_meta.MODEL_FILE
    if damage == "oversized":  # what two 600 KB descriptions made before
        data = json.loads(path.read_text())
        data["versions"]["v1"]["description"] = "d" * 1_200_000
        path.write_text(json.dumps(data))
    elif damage == "not json":
        path.write_bytes(b"{\x00 not json")
    elif damage == "missing":
        path.unlink()
    else:
        path.write_text(json.dumps({"versions": {"v1": {"number": "one"}}}))
    assert refused(capsys, "versions", "list", "--model", "m", status=1)
    line = refused(capsys, "models", "delete", "m")
    assert "has versions; delete them first" in line and "v1" in line
    ok(capsys, "versions", "delete", "v1", "--model", "m")
    assert published(base) == []
    ok(capsys, "models", "delete", "m")
    assert not path.exists() and "m" not in models.names()


def test_ten_versions_created_at_once_are_all_recorded(capsys, base, export):
    names = [f"r{i}" for i in range(10)]
    codes = at_once([["versions", "create", name, "--model", "m", "--origin",
                              export, "--labels", f"i={i}"] for i, name in
                             enumerate(names)])
    assert codes == [0] * 10
    listed = json.loads(ok(capsys, "versions", "list", "--model", "m", "--format", "json"))
    assert sorted(v["name"] for v in listed) == names
    numbers = {v["name"]: v["mljob"]["number"] for v in listed}
    assert sorted(numbers.values()) == list(range(1, 11))
    assert published(base) == [str(n) for n in sorted(numbers.values(), key=str)]
    assert all(v["state"] == "READY" for v in listed)
    assert {v["labels"]["i"] for v in listed} == {str(i) for i in range(10)}
    assert sum(v["isDefault"] for v in listed) == 1
