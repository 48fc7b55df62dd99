"""Numbers read from outside are ASCII digits: `str.isdigit()` takes "²" (then int()
fails: a 500, a traceback) and `\\d` or `isdecimal()` take "３" and "٣" (which int()
reads, and TensorFlow, HTTP and Kubernetes do not). So no guard in the tree uses them:
`mljob.errors.ascii_digits` (or a `[0-9]` class) does, and the places they guarded
take those characters as the bad input they are."""
from __future__ import annotations

import ast
import os

import pytest

from mljob.errors import ascii_digits
from submit import training_output
from submit.console import pages
from submit.errors import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ("mljob", "trainer", "submit", "predict", "bench", "tools")


def guards_in(path: str) -> list[int]:
    """Lines of `x.isdigit()`, `x.isnumeric()`, `x.isdecimal()` without `isascii()` on
    its line, and `\\d` in a pattern given to `re` without re.ASCII (read with ast:
    comments and docstrings may name them)."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ("isdigit", "isnumeric"):
            found.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr == "isdecimal" and \
                "isascii()" not in lines[node.lineno - 1]:
            found.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Name) and node.func.value.id == "re" and \
                node.args and isinstance(node.args[0], ast.Constant) and \
                isinstance(node.args[0].value, str) and "\\d" in node.args[0].value and \
                "ASCII" not in ast.unparse(node):
            found.append(node.lineno)
    return found


def test_no_unicode_digit_guard_in_the_tree():
    found = []
    for folder in FOLDERS:
        for where, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(where, name)
                    found += [f"{os.path.relpath(path, ROOT)}:{n}" for n in guards_in(path)]
    assert found == [], "use mljob.errors.ascii_digits (or [0-9]): " + ", ".join(found)


@pytest.mark.parametrize("text", ["²", "３", "٣", "1²", "", "-1", "+1", " 1", "1_000"])
def test_ascii_digits_refuses_what_int_or_others_misread(text):
    assert not ascii_digits(text)


def test_trials_with_odd_ids_rank_and_chart_without_error():
    trials = [{"trialId": "²", "state": "SUCCEEDED", "finalMetric": {"objectiveValue": 1.0}},
              {"trialId": 3, "state": "SUCCEEDED", "finalMetric": {"objectiveValue": 0.5}},
              {"trialId": "2", "state": "SUCCEEDED", "finalMetric": {"objectiveValue": 0.5}}]
    out = training_output.output_of(trials, metric_tag="score", maximize=True)
    assert [t["trialId"] for t in out["trials"]] == ["²", "2", 3]
    svg = pages.objective_charts(out["trials"], [], [], "score", maximize=True)
    assert svg.count("<circle") == 2  # trials 2 and 3; `²` is no trial number


def test_a_version_of_unicode_digits_is_not_a_version_name():
    from submit.prediction import spec as prediction_spec
    with pytest.raises(UsageError, match="is not a model or version name"):
        prediction_spec.resolve("p1", model="m", version="²", input_paths="x",
                                output_path="/tmp/out", data_format="JSON",
                                region="us-central1")
