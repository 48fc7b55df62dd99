"""tools/planted_faults.py itself (not its faults, which CI never runs): a fault is
planted in a copy and never in the tree, each outcome is told apart on a tiny project
of its own, and a bad fault list is one line and exit 2."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.support.common import ROOT

TOOL = os.path.join(ROOT, "tools", "planted_faults.py")


def _tool():
    spec = importlib.util.spec_from_file_location("planted_faults", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("planted_faults", module)  # dataclasses look their module up
    spec.loader.exec_module(sys.modules["planted_faults"])
    return sys.modules["planted_faults"]


def _project(folder) -> str:
    (folder / "calc.py").write_text("def add(a, b):\n    return a + b\n\n\n"
                                    "def half(x):\n    return x / 2\n")
    (folder / "test_calc.py").write_text(
        "import calc\n\n\ndef test_add():\n    assert calc.add(2, 3) == 5\n\n\n"
        "def test_half_is_a_number():\n    assert isinstance(calc.half(4), float)\n")
    return str(folder)


def test_each_outcome_is_told_apart_and_the_tree_is_never_edited(tmp_path):
    tool = _tool()
    tree = _project(tmp_path)
    before = (tmp_path / "calc.py").read_text()

    def fault(find, replace, tests=("test_calc.py",)):
        return tool.Fault(id=find, area="", file="calc.py", find=find, replace=replace,
                          tests=tests)

    outcomes = {}
    for name, f in {"sign": fault("a + b", "a - b"),                    # caught
                    "equivalent": fault("x / 2", "x * 0.5"),             # survived
                    "stale": fault("a * b", "a / b"),                    # not in the file
                    "ambiguous": fault("return ", "return -"),           # in it twice
                    "nothing collected": fault("a + b", "b + a", ("nope.py",))}.items():
        original = tool.plant(tree, f)
        if original is None:
            outcomes[name] = tool.STALE
            continue
        assert (tmp_path / "calc.py").read_text() != before  # planted in this "copy"
        try:
            outcomes[name] = tool.pytest_run(tree, f, 120)[0]
        finally:
            tool.restore(tree, f, original)
        assert (tmp_path / "calc.py").read_text() == before
    assert outcomes == {"sign": tool.CAUGHT, "equivalent": tool.SURVIVED,
                        "stale": tool.STALE, "ambiguous": tool.STALE,
                        "nothing collected": tool.ERROR}
    results = [tool.Result(n, s, 0.0) for n, s in outcomes.items()]
    assert tool.score(results) == (1, 1, 0.5)


@pytest.mark.parametrize("text, words", [
    ('[[fault]]\nid = "a"\n', "fault #1 lacks file, find, replace, tests"),
    ("x = [", "is not valid TOML"),
    ('[[fault]]\nid = "a"\nfile = "f"\nfind = "x"\nreplace = "y"\ntests = "t"\n',
     "tests must be a non-empty list"),
    ('[[fault]]\nid = "a"\nfile = "f"\nfind = "x"\nreplace = "x"\ntests = ["t"]\n',
     "changes nothing"),
    ("", "lists no [[fault]]"),
], ids=["missing keys", "not toml", "tests not a list", "no change", "empty"])
def test_a_bad_fault_list_is_one_line_and_exit_2(tmp_path, text, words):
    listed = tmp_path / "faults.toml"
    listed.write_text(text)
    done = subprocess.run([sys.executable, TOOL, "--faults", str(listed), "--list"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_projects_fault_list_loads_and_names_existing_tests():
    tool = _tool()
    faults = tool.load(tool.DEFAULT_LIST)
    assert len(faults) >= 20
    for f in faults:
        assert os.path.isfile(os.path.join(ROOT, f.file)), f.id
        for test in f.tests:
            assert os.path.isfile(os.path.join(ROOT, test.split("::")[0])), (f.id, test)


def test_only_matching_no_fault_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, TOOL, "--only", "no-such-*", "--list"],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (
        2, "error: --only 'no-such-*' matches no fault id; see --list\n")
