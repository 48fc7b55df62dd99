"""The Python API's boundary: every public call (the functions and the public methods of
the classes `submit.api` exports) walked with arguments of the wrong type and values no
call takes, each answered with the API's own `UsageError` in one line naming the
argument, before anything is read, written or started; and the red team's calls by
name (a string for the trainer's args, `wait(timeout=nan)`, a config that cannot be
written leaving no temporary file, a version from /etc)."""
from __future__ import annotations

import collections.abc as abc
import glob
import inspect
import math
import os
import tempfile
import types
import typing
from typing import Any

import pytest

from submit import api
from submit.api import checks as api_checks
from submit import jobs as records

SELF_REFERENCING: list = []
SELF_REFERENCING.append(SELF_REFERENCING)
LOOPED: dict = {}
LOOPED["again"] = LOOPED


def _deep(n: int) -> dict:
    top: dict = {}
    at = top
    for _ in range(n):
        at["a"] = {}
        at = at["a"]
    return top


DEEP = _deep(50_000)
# wrong values by what an annotation asks for; those a union takes anyway are skipped
HOSTILE: dict[Any, list[Any]] = {
    str: [None, 5, 2.5, b"bytes", ["x"], {"a": "b"}, "nul\0", "x" * (api_checks.MAX_TEXT + 1)],
    int: [None, "3", 1.5, True, -1, 10 ** 100, math.nan],
    float: [None, "5", True, math.nan, math.inf, -math.inf, -1.0, 10 ** 400, [1.0]],
    bool: [None, "yes", 1, 0.0],
    "strings": [None, "--model mlp", [1], [None], SELF_REFERENCING, ["nul\0"], 7,
                {"a": "b"}],
    "data": [None, 5, "text", LOOPED, DEEP, {"a": object()}, {1: "x"}, SELF_REFERENCING],
    "items": [None, 5, "text", {"a": 1}, SELF_REFERENCING, [object()], [DEEP], [{1: 2}]],
    "labels": [None, "team=vision", {"team": 1}, {1: "x"}, LOOPED, 3.5],
    "callable": [None, 5, "print"],
}


def _kinds(hint: Any) -> list[Any]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return [k for a in typing.get_args(hint) for k in _kinds(a)]
    if hint is type(None) or hint is Any:
        return []
    if origin is abc.Callable:
        return ["callable"]
    if origin is not None and issubclass(origin, abc.Mapping):
        return ["labels" if typing.get_args(hint)[1] is str else "data"]
    if origin is not None and issubclass(origin, abc.Sequence):
        return ["strings" if typing.get_args(hint)[:1] == (str,) else "items"]
    return [hint] if hint in HOSTILE else []


def hostile_values(hint: Any) -> list[Any]:
    """The wrong values for an annotation: each kind's, less those the annotation takes
    as a whole and that are good (a None where None is taken, a str in a union with
    str, a list where a list is data)."""
    out = []
    for kind in _kinds(hint):
        for value in HOSTILE[kind]:
            try:
                api_checks.check(value, hint, "probe")
            except api.UsageError:
                out.append(value)
    return out


def _baseline(hint: Any) -> Any:
    """A right value for a required argument (never reached when the check works)."""
    kinds = _kinds(hint)
    kind = kinds[0] if kinds else str
    return {str: "hostile01", int: 1, float: 1.0, bool: False, "strings": ["x"],
            "data": {}, "items": [], "labels": {}, "callable": print}[kind]


def public_calls() -> list[tuple[str, Any, Any]]:
    """(name, the callable to call, its unwrapped function) for every public call."""
    calls = []
    for name in api.__all__:
        obj = getattr(api, name)
        if inspect.isfunction(obj):
            calls.append((name, obj, obj.__wrapped__))
        elif inspect.isclass(obj) and not issubclass(obj, BaseException):
            for attr, member in vars(obj).items():
                if inspect.isfunction(member) and (attr == "__init__"
                                                   or not attr.startswith("_")):
                    calls.append((f"{name}.{attr}", (obj, attr), member.__wrapped__))
    return calls


@pytest.fixture
def subjects(tmp_path):
    """An ended job, a model with a published version and an endpoint that serves
    nothing: what a method is called on (a call the check let through ends at once)."""
    records.save(records.JobRecord("hostile01", state=records.SUCCEEDED,
                                   job_dir=str(tmp_path / "hostile01")))
    export = tmp_path / "export"
    export.mkdir()
    (export / "saved_model.pb").write_bytes(b"x")
    model = api.create_model("hostile_model", base_path=str(tmp_path / "base"))
    model.create_version("v1", str(export))
    endpoint = object.__new__(api.Endpoint)
    endpoint.process = None
    endpoint.model, endpoint.version = "hostile_model", "v1"
    return {"Job": api.Job("hostile01"), "Model": model, "Endpoint": endpoint}


def _cases():
    out = []
    for name, target, function in public_calls():
        hints = typing.get_type_hints(function)
        for param in inspect.signature(function).parameters.values():
            if param.name == "self" or param.kind in (param.VAR_KEYWORD,
                                                      param.VAR_POSITIONAL):
                continue
            for i, value in enumerate(hostile_values(hints.get(param.name, Any))):
                out.append(pytest.param(name, target, function, param.name, value,
                                        id=f"{name}-{param.name}-{i}"))
    return out


def test_every_public_call_has_annotated_arguments_and_is_walked():
    """No public call escapes the walk: each is checked (`guard` wrapped it), and each
    argument is annotated with something the check knows."""
    calls = public_calls()
    assert {"submit", "Job.wait", "Job.logs", "Job.metrics", "Model.deploy",
            "Model.create_version", "Endpoint.predict", "list_jobs"} <= {
        c[0] for c in calls}
    for name, _, function in calls:
        hints = typing.get_type_hints(function)
        for param in inspect.signature(function).parameters.values():
            if param.name != "self" and param.kind is not param.VAR_KEYWORD:
                assert param.name in hints, f"{name}({param.name}) has no annotation"


@pytest.mark.parametrize("name,target,function,param,value", _cases())
def test_a_wrong_argument_is_the_apis_usage_error_in_one_line(subjects, name, target,
                                                              function, param, value):
    signature = inspect.signature(function)
    hints = typing.get_type_hints(function)
    kwargs = {p.name: _baseline(hints.get(p.name, Any))
              for p in signature.parameters.values()
              if p.name != "self" and p.default is p.empty
              and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    kwargs[param] = value
    if isinstance(target, tuple):
        cls, attr = target
        call = cls if attr == "__init__" else getattr(subjects[cls.__name__], attr)
    else:
        call = target
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "mljob-config-*")))
    with pytest.raises(api.UsageError) as raised:
        call(**kwargs)
    message = str(raised.value)
    assert "\n" not in message and len(message) < 400, message
    assert f"({param}=...)" in message, message  # the argument is named
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "mljob-config-*"))) == before


@pytest.mark.parametrize("option,value,fragment", [
    ("worker_count", "2", "submit(worker_count=...) is '2', not a whole number"),
    ("worker_count", -3, "give a whole number from 0"),
    ("parameter_server_count", 10 ** 30, "give a whole number from 0"),
    ("region", 5, "submit(region=...) is 5, not a string"),
    ("master_machine_type", ["n1"], "not a string"),
    ("use_chief_in_tf_config", "yes", "not True or False"),
    ("packages", 5, "submit(packages=...) is 5"),
    ("container_engine", 3, "submit(container_engine=...) is 3, not a string"),
])
def test_submits_flag_keywords_are_checked_as_their_flags(tmp_path, option, value,
                                                          fragment):
    with pytest.raises(api.UsageError, match=fragment.replace("(", r"\(").replace(
            ")", r"\)").replace(".", r"\.")):
        api.submit("hostile02", job_dir=str(tmp_path / "j"), **{option: value})
    assert not os.path.exists(tmp_path / "j")


def test_the_red_teams_calls(tmp_path, subjects):
    # a string for the trainer's args: refused, with the list it meant
    with pytest.raises(api.WrongType, match=r"args=\.\.\.\) is '--model mlp', not a list "
                                            r"of strings or None; give a list, one string "
                                            r"per item: \['--model', 'mlp'\]"):
        api.submit("hostile02", package_path=str(tmp_path), args="--model mlp")
    assert isinstance(api.WrongType("x"), TypeError)  # what Python's callers catch
    # nan, negative and infinite timeouts never reach the wait loop
    job = subjects["Job"]
    for timeout in (math.nan, -1, math.inf):
        with pytest.raises(api.BadValue, match=r"Job\.wait\(timeout=\.\.\.\)"):
            job.wait(timeout=timeout)
    assert isinstance(api.BadValue("x"), ValueError)
    # a config that cannot be written leaves no temporary file behind
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "mljob-config-*")))
    for config in ({"trainingInput": {"args": {1, 2}}}, LOOPED,
                   {"trainingInput": {"scaleTier": b"BASIC"}}):
        with pytest.raises(api.UsageError, match="submit\\(config=...\\)"):
            api.submit("hostile02", job_dir=str(tmp_path / "j"), config=config)
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "mljob-config-*"))) == before
    with pytest.raises(api.BadValue, match=r"submit\(config=\.\.\.\) contains itself"):
        api.submit("hostile02", config={"trainingInput": LOOPED})
    # an export the server's publisher refuses: the API's UsageError, its message kept
    with pytest.raises(api.UsageError, match="leads out of the export|nothing is published"
                       "|not a SavedModel|no saved_model") as raised:
        subjects["Model"].create_version("v2", "/etc")
    assert type(raised.value).__module__.startswith("submit")
    # recursion and depth: refused by the check, never a RecursionError
    with pytest.raises(api.BadValue, match="nested more than 64 deep"):
        api.submit("hostile02", config=DEEP)
    # no such keyword: one line naming it
    with pytest.raises(api.UsageError, match="unknown option 'wrker_count'"):
        api.submit("hostile02", job_dir=str(tmp_path / "j"), wrker_count=2)
    with pytest.raises(api.WrongType, match=r"submit\(\): too many positional"):
        api.submit("hostile02", "trainer")
