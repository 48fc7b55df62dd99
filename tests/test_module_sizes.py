"""No module of mljob/, trainer/, submit/ or predict/ passes 500 lines (generated code
aside: TF Serving's vendored protos in predict/serving_api), and submit/'s top level
holds its wings and at most a dozen modules (docs/architecture.md, "Inside submit")."""
from __future__ import annotations

import os

from tests.test_import_circles import PACKAGES, ROOT, modules

MAX_LINES = 500
GENERATED = (os.path.join("predict", "serving_api"),)
WINGS = {"cli", "jobdef", "packaging", "prediction", "runners", "local", "console"}


def too_long(limit: int = MAX_LINES) -> dict[str, int]:
    found = {}
    for name, path in modules(PACKAGES).items():
        if os.path.relpath(path, ROOT).startswith(GENERATED):
            continue
        with open(path, encoding="utf-8") as f:
            lines = sum(1 for _ in f)
        if lines > limit:
            found[name] = lines
    return found


def test_no_module_passes_500_lines():
    assert too_long() == {}
    assert too_long(limit=400)  # the count reads real files (some pass 400)


def test_submits_top_level_is_its_wings_and_a_dozen_modules():
    top = os.listdir(os.path.join(ROOT, "submit"))
    folders = {n for n in top if os.path.isfile(os.path.join(ROOT, "submit", n, "__init__.py"))}
    files = {n for n in top if n.endswith(".py")} - {"__init__.py", "__main__.py"}
    assert folders == WINGS
    assert len(files) <= 12, sorted(files)
