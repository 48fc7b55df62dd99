"""No import circle anywhere in mljob/, trainer/, submit/ and predict/: every module's
imports (at the top, in functions, under TYPE_CHECKING: all of them, read with ast)
form a graph without a cycle. A circle means two modules that cannot be read, tested
or changed apart; the layers of docs/architecture.md point one way."""
from __future__ import annotations

import ast
import functools
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("mljob", "trainer", "submit", "predict")


def modules(folders: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Every module under the folders (the packages): dotted name to file."""
    found = {}
    for package in folders:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
                    if parts[-1] == "__init__":
                        parts = parts[:-1]
                    found[".".join(parts)] = path
    return found


def imports(name: str, path: str, known: set[str]) -> set[str]:
    """The modules of ours that `name` imports: `from a.b import c` is a.b.c when that is
    a module, else a.b; relative imports are resolved against the module's package."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    package = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[:len(package) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in known:
                    out.add(full)
                elif base in known:
                    out.add(base)
    out.discard(name)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's), plus any
    module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@functools.lru_cache(maxsize=1)
def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def test_no_module_imports_itself_through_others():
    assert circles(graph()) == []


def test_the_walk_sees_a_circle_and_the_layers():
    """The walk itself: it finds a planted two-module circle, and it reads the imports
    the layers rest on (so an empty graph cannot pass the test above)."""
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    g = graph()
    assert "submit.runners.engine" in g["submit.lifecycle"]
    assert "submit.local.entry" in g["submit.runners.local"]
    assert "trainer.fit" in g["trainer.task"]  # a function-level import is read too


def test_the_local_wing_never_reaches_up():
    """submit.local runs jobs; it is driven from above and imports neither the runners'
    verbs nor the job life."""
    g = graph()
    up = {m for m in g if m.startswith(("submit.runners", "submit.lifecycle",
                                        "submit.cli", "submit.submission"))}
    wing = {m: sorted(g[m] & up) for m in g if m.startswith("submit.local")}
    assert {m: deps for m, deps in wing.items() if deps} == {}


WINGS = ("submit.jobdef", "submit.packaging", "submit.prediction", "submit.home",
         "submit.query")


def reaching_up(g: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each wing module's imports of the commands (submit.cli), the job life, the
    submission, the Python API or the runners (a batch prediction job's engine
    renderings, submit.prediction.render, are the runners' to call, never callers of
    a runner)."""
    up = {m for m in g if m.startswith(("submit.cli", "submit.lifecycle", "submit.runners",
                                        "submit.submission", "submit.api"))}
    return {m: sorted(g[m] & up) for m in g
            if m.startswith(WINGS) and g[m] & up}


def test_the_wings_never_reach_up_into_the_commands_or_the_job_life():
    """jobdef, packaging, prediction and home are read by the commands, the job life and
    the runners, never the other way round: a wing importing submit.cli,
    submit.lifecycle, submit.submission, submit.api or a runner (at the top or in a
    function) is an arrow back up."""
    g = graph()
    assert {w for w in WINGS if any(m == w or m.startswith(w + ".") for m in g)} == set(WINGS)
    assert reaching_up(g) == {}
    planted = dict(g, **{"submit.jobdef.spec": g["submit.jobdef.spec"] | {"submit.cli.formats"}})
    assert reaching_up(planted) == {"submit.jobdef.spec": ["submit.cli.formats"]}
    planted = dict(g, **{"submit.prediction.render": g["submit.prediction.render"]
                         | {"submit.runners.vertex"}})
    assert reaching_up(planted) == {"submit.prediction.render": ["submit.runners.vertex"]}


def test_the_fitting_wing_stands_on_the_loop_modules_below_the_front_door():
    """mljob.fitting imports mljob.training's loop modules, never the package itself;
    the front door (`mljob.training`, its `run`) hands the epoch mode down to
    mljob.fitting.library: an arrow that closes no circle."""
    g = graph()
    assert [m for m in sorted(g) if m.startswith("mljob.fitting")
            and "mljob.training" in g[m]] == []
    assert "mljob.fitting.library" in g["mljob.training"]
    assert "mljob.training.steps" in g["mljob.fitting.library"]
