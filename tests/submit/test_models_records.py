"""A model's own record, `BASE/mljob-model.json`, edited by hand or written by something
else: every field the commands and the server read is type-checked, and `versions list`,
`models describe` and `versions describe` refuse a damaged one in one line naming the file
and the field (were tracebacks); the prediction server keeps its labels as they were."""
from __future__ import annotations

import json

import pytest

from mljob import model_meta
from tests.support.submit_cli import one_error_line, run

GOOD_VERSION = {"number": 1, "createTime": "2026-11-28T00:00:00Z", "origin": "/x"}
DAMAGED = {
    "a list": ([1], "holds a JSON list"),
    "versions a list": ({"versions": ["v1"]}, "its versions is"),
    "number text": ({"versions": {"v1": {"number": "1"}}}, "number \"1\" is not a version"),
    "number true": ({"versions": {"v1": {"number": True}}}, "number true is not a version"),
    "number negative": ({"versions": {"v1": {"number": -1}}}, "number -1 is not"),
    "number past int64": ({"versions": {"v1": {"number": 2 ** 64}}}, "is not a version"),
    "version not an object": ({"versions": {"v1": 1}}, "version 'v1' is not an object"),
    "labels a list": ({"labels": ["a"]}, "its labels is"),
    "labels numbers": ({"labels": {"a": 1}}, "its labels are not text"),
    "version labels numbers": ({"versions": {"v1": {**GOOD_VERSION, "labels": {"a": 1}}}},
                               "version 'v1' labels are not text"),
    "description a number": ({"description": 5}, "its description is 5"),
    "default a number": ({"defaultVersion": 3}, "its defaultVersion is 3"),
    "regions text": ({"regions": "us"}, "its regions is"),
    "settings a list": ({"versions": {"v1": {**GOOD_VERSION, "settings": [1]}}},
                        "version 'v1' settings is"),
    "logging text": ({"onlinePredictionLogging": "yes"}, "onlinePredictionLogging is"),
}


@pytest.fixture
def model(capsys, tmp_path):
    base = tmp_path / "served" / "m"
    status, _, err = run(capsys, "models", "create", "m", "--base-path", str(base))
    assert status == 0, err
    (base / "1").mkdir()  # a published folder, so that every listing has a version
    (base / "1" / "saved_model.pb").write_bytes(b"")
    return base


@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_damaged_model_record_is_one_line(capsys, model, case):
    data, words = DAMAGED[case]
    if isinstance(data, dict):
        data = {"name": "m", "versions": {"v1": GOOD_VERSION}, **data}
    (model / model_meta.MODEL_FILE).write_text(json.dumps(data))
    for argv in (["versions", "list", "--model", "m"], ["models", "describe", "m"],
                 ["versions", "describe", "v1", "--model", "m"]):
        status, out, err = run(capsys, *argv)
        line = one_error_line(err)
        assert status == 1 and out == "", (argv, err)
        assert f"{model / model_meta.MODEL_FILE} is not a model record (" in line, line
        assert words in line and line.endswith("; restore or remove it"), line
    with pytest.raises(ValueError, match="is not a model record"):  # the server's read
        model_meta.read(str(model))


def test_a_record_nested_too_deep_is_one_line(capsys, model):
    (model / model_meta.MODEL_FILE).write_text("[" * 100_000 + "]" * 100_000)
    status, _, err = run(capsys, "versions", "list", "--model", "m")
    assert status == 1 and "nested too deep to be a model record" in one_error_line(err)


def test_a_good_record_with_every_field_is_taken(model):
    data = {"name": "m", "description": "d", "labels": {"a": "b"}, "regions": ["us"],
            "createTime": "t", "defaultVersion": "v1", "onlinePredictionLogging": True,
            "versions": {"v1": {**GOOD_VERSION, "labels": {"s": "p"}, "description": None,
                                "settings": {"runtimeVersion": "2.11"}}}}
    model_meta.check(data)
