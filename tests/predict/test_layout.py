"""predict/ reads top-down as TF Serving's model_servers/ does: the process
(serving/), the two APIs (api/), the models and their versions (models/), the model
call and batching (runtime/), prediction without a server (offline/); at most six
modules at its top level, and no import arrow back up: a wing imports only the wings
below it (and the top level's errors), never the command line."""
from __future__ import annotations

import os

from tests.test_import_circles import ROOT, graph

WINGS = ["serving", "api", "models", "runtime"]  # top-down: each imports only below it
BESIDE = {"offline": {"models", "runtime"}}     # offline reads the models' call, no API
TOP = {"predict.errors", "predict.serving_api"}  # what every wing may read


def wing(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "predict" else None


def arrows_up(g: dict) -> dict:
    """Each predict module's imports that point up a folder or across to a wing above."""
    found = {}
    for name, deps in g.items():
        here = wing(name)
        if here is None or here == "serving_api":
            continue
        allowed = {here} | (set(WINGS[WINGS.index(here) + 1:]) if here in WINGS
                            else BESIDE.get(here, set()))
        bad = sorted(d for d in deps if d.startswith("predict") and
                     not any(d == t or d.startswith(t + ".") for t in TOP) and
                     wing(d) not in allowed)
        if bad:
            found[name] = bad
    return found


def test_at_most_six_modules_at_the_top_and_the_wings():
    top = os.listdir(os.path.join(ROOT, "predict"))
    modules = sorted(n for n in top if n.endswith(".py"))
    folders = {n for n in top if os.path.isfile(os.path.join(ROOT, "predict", n, "__init__.py"))}
    assert len(modules) <= 6, modules
    assert folders == set(WINGS) | set(BESIDE) | {"serving_api"}


def test_no_import_arrow_points_back_up():
    g = graph()
    assert arrows_up(g) == {}
    planted = dict(g, **{"predict.runtime.batching": g["predict.runtime.batching"] |
                         {"predict.api.metrics"}})
    assert arrows_up(planted) == {"predict.runtime.batching": ["predict.api.metrics"]}
    planted = dict(g, **{"predict.offline.batch": g["predict.offline.batch"] |
                         {"predict.__main__"}})
    assert arrows_up(planted) == {"predict.offline.batch": ["predict.__main__"]}
