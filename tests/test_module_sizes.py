"""No module of mljob/, trainer/, submit/ or predict/ passes 500 lines (generated code
aside: TF Serving's vendored protos in predict/serving_api), and submit/'s top level
holds its wings and at most a dozen modules (docs/architecture.md, "Inside submit")."""
from __future__ import annotations

import os

from tests.test_import_circles import PACKAGES, ROOT, modules

MAX_LINES = 500
GENERATED = (os.path.join("predict", "serving_api"),)
WINGS = {"cli", "jobdef", "packaging", "prediction", "runners", "local", "console", "api",
         "query"}


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


def test_the_architecture_page_names_every_module():
    """docs/architecture.md stays true: each module of the four packages is named there
    (by its file name, or its path inside its package), so a newcomer finds its room."""
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        text = f.read()
    missing = []
    for path in modules(PACKAGES).values():
        rel = os.path.relpath(path, ROOT)
        if rel.startswith(GENERATED) or os.path.basename(path) == "__init__.py":
            continue
        inside = rel.split(os.sep, 1)[1].replace(os.sep, "/")
        if os.path.basename(path) not in text and inside[:-3] not in text:
            missing.append(rel)
    assert missing == []
