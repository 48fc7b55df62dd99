"""Every third-party module a package imports is declared for the use that package
serves (setup.py): mljob's core and the trainer by install_requires (TensorFlow by the
`cpu` extra or the image), the model server by the `serve` extra, the launcher by
`submit` (its cluster engines by theirs); mljob's core sdist (staged beside a user's
package that imports mljob) requires what install_requires does. A module imported but
declared nowhere fails here, naming it."""
from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import sys

import setuptools

from tests.test_import_circles import ROOT

# extras each package may rely on, beyond install_requires
USES = {"mljob": ("cpu",), "trainer": ("cpu",),
        "predict": ("serve", "serve-tflite", "cpu"),
        "submit": ("submit", "serve", "cpu", "kubeflow", "vertex", "ray", "tuning", "test",
                   "notebook")}
# modules that come with a declared distribution as its documented API: TensorFlow's
# numpy, keras and protobuf; pydantic's core; the Google and Kubernetes clients' HTTP
THROUGH = {"numpy": {"numpy"}, "keras": {"keras"}, "google": {"protobuf"},
           "pydantic_core": {"pydantic-core"}, "requests": {"requests"},
           "urllib3": {"urllib3"}}


def declared() -> tuple[list[str], dict[str, list[str]]]:
    """setup.py's install_requires and extras_require, read by running it."""
    seen: dict = {}
    source = open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read()
    real = setuptools.setup
    setuptools.setup = lambda **kwargs: seen.update(kwargs)
    try:
        exec(compile(source, "setup.py", "exec"), {"__name__": "setup"})
    finally:
        setuptools.setup = real
    return seen["install_requires"], seen["extras_require"]


def name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def imported(package: str) -> dict[str, str]:
    """Top-level third-party modules the package imports: module -> a file doing it."""
    found: dict[str, str] = {}
    ours = {"mljob", "trainer", "submit", "predict", "__future__", "tests"}
    for folder, _, files in os.walk(os.path.join(ROOT, package)):
        for file in files:
            if not file.endswith(".py"):
                continue
            path = os.path.join(folder, file)
            for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module]
                else:
                    continue
                for module in names:
                    top = module.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in ours:
                        found.setdefault(top, os.path.relpath(path, ROOT))
    return found


def test_every_import_is_declared_for_its_use():
    core, extras = declared()
    dists = importlib.metadata.packages_distributions()
    missing = []
    for package, uses in USES.items():
        allowed = {name(r) for r in core} | {name(r) for use in uses for r in extras[use]}
        for module, where in sorted(imported(package).items()):
            owners = {d.lower().replace("_", "-") for d in dists.get(module, [module])}
            # a dependency of a declared one is not enough (h11 came with uvicorn until a
            # release might not bring it): only those named in THROUGH
            if not owners & allowed and not owners & THROUGH.get(module, set()):
                missing.append(f"{package}: {module} ({where}) from {sorted(owners)}")
    assert missing == []


def test_the_core_sdist_requires_what_install_requires_does():
    from submit.packaging.package import MLJOB_CORE_REQUIRES
    core, _ = declared()
    assert sorted(MLJOB_CORE_REQUIRES) == sorted(core)


def test_core_imports_are_core():
    """mljob's core and the trainer import nothing the extras bring (beyond TensorFlow)."""
    core, extras = declared()
    allowed = {name(r) for r in core + extras["cpu"]}
    dists = importlib.metadata.packages_distributions()
    for package in ("mljob", "trainer"):
        for module in imported(package):
            owners = {d.lower().replace("_", "-") for d in dists.get(module, [module])}
            assert owners & allowed or module in THROUGH, (package, module)


def test_a_program_without_its_extra_says_which_install_brings_it():
    import subprocess
    code = ("import sys, runpy; sys.modules['click'] = None; "
            "runpy.run_module('submit', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code, "jobs", "list"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("error: python -m submit needs click, which mljob's `submit` "
                           "extra installs: pip install 'mljob[submit]'\n")
