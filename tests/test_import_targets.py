"""Every import of our own packages anywhere in the repository names something that
exists: a module, or a name the module defines at its top level. Read with ast, so the
imports inside functions (bench/ and tools/ import most of what they use there, and a
benchmark is run by hand long after the module it used moved) are checked without running
them or importing TensorFlow."""
from __future__ import annotations

import ast
import functools
import os

from tests.test_import_circles import PACKAGES, ROOT, modules

FOLDERS = (*PACKAGES, "bench", "tools", "tests")


def defined(tree: ast.Module) -> set[str]:
    """Names bound at a module's top level (under if/try too)."""
    names: set[str] = set()

    def bind(target) -> None:
        if isinstance(target, ast.Name):
            names.add(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                bind(t)

    def walk(body) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    bind(t)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                bind(node.target)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    if a.name == "*":
                        names.add("*")
                    names.add((a.asname or a.name).split(".")[0])
            elif isinstance(node, ast.If):
                walk(node.body)
                walk(node.orelse)
            elif isinstance(node, ast.Try):
                walk(node.body)
                walk(node.orelse)
                walk(node.finalbody)
                for h in node.handlers:
                    walk(h.body)
    walk(tree.body)
    return names


@functools.cache
def _parse(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), path)


@functools.cache
def _defined(path: str) -> frozenset[str]:
    return frozenset(defined(_parse(path)))


def ours() -> dict[str, str]:
    return modules(FOLDERS)


def missing(found: dict[str, str]) -> list[str]:
    """`file:line: what` for each import of ours that names nothing."""
    roots = {name.split(".")[0] for name in found}
    out = []
    for name, path in sorted(found.items()):
        package = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
        for node in ast.walk(_parse(path)):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            where = f"{os.path.relpath(path, ROOT)}:{node.lineno}"
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] in roots and a.name not in found:
                        out.append(f"{where}: import {a.name}")
            else:
                base = node.module or ""
                if node.level:
                    parent = package[:len(package) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                if base.split(".")[0] not in roots:
                    continue
                if base not in found:
                    out.append(f"{where}: from {base} import ...")
                    continue
                names = _defined(found[base])
                for a in node.names:
                    if (a.name != "*" and f"{base}.{a.name}" not in found
                            and a.name not in names and "*" not in names):
                        out.append(f"{where}: from {base} import {a.name}")
    return out


def test_every_import_of_ours_names_something_that_exists():
    assert missing(ours()) == []


def test_the_check_sees_a_module_and_a_name_that_are_gone(tmp_path):
    """The check itself: a function-level import of a module that moved away and of a
    name a module no longer defines are both found."""
    stale = tmp_path / "stale.py"
    stale.write_text("def f():\n    from submit import tuning\n"
                     "    from submit.local.study import _iso, iso\n")
    found = {**ours(), "bench.stale": str(stale)}
    assert [row.split(": ", 1)[1] for row in missing(found) if "stale" in row] == [
        "from submit import tuning", "from submit.local.study import _iso"]
