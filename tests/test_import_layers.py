"""submit/ in layers, each importing only those below it (at the top, in a function or
under TYPE_CHECKING: every import, read with ast). From the top: the command line, the
web console, the Python API (the layer both stand on), the submission, the job life,
the runners, the batch prediction job, the local wing, then the records, packaging
and job definitions everything shares. A module in no layer fails the test (a new one is
placed on purpose), and so does any arrow back up: the API or the console importing the
command line, the local wing importing the batch prediction job."""
from __future__ import annotations

from tests.test_import_circles import graph

LAYERS: tuple[tuple[str, ...], ...] = (
    ("submit.__main__", "submit.cli"),
    ("submit.console",),
    ("submit.api",),
    ("submit.submission",),
    ("submit.lifecycle",),
    ("submit.runners",),
    ("submit.prediction",),
    ("submit.local",),
    ("submit.query.listing", "submit.query.curves", "submit.job_index", "submit.models",
     "submit.packaging"),
    ("submit.query", "submit.resource", "submit.logs", "submit.training_output"),
    ("submit.jobs",),
    ("submit.jobdef", "submit.record_values", "submit.home", "submit.errors",
     "submit"),  # the package itself: its __init__ alone
)


def layer(module: str) -> int | None:
    """The layer of a module of submit/ (0 is the top); None when it has none."""
    best = None
    for depth, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + ".") and prefix != "submit":
                if best is None or len(prefix) > best[1]:
                    best = (depth, len(prefix))
    return None if best is None else best[0]


def arrows_up(g: dict[str, set[str]]) -> list[str]:
    """`a -> b` for each import of a module of submit/ by one in a lower layer."""
    out = []
    for module, deps in sorted(g.items()):
        if not module.startswith("submit"):
            continue
        mine = layer(module)
        for dep in sorted(deps):
            theirs = layer(dep) if dep.startswith("submit") else None
            if mine is not None and theirs is not None and theirs < mine:
                out.append(f"{module} -> {dep}")
    return out


def test_every_module_of_submit_has_a_layer():
    g = graph()
    assert [m for m in sorted(g) if m.startswith("submit") and layer(m) is None] == []


def test_no_arrow_points_back_up_inside_submit():
    assert arrows_up(graph()) == []


def test_the_check_sees_the_arrows_that_once_were():
    """The check itself: the three arrows back up this layering removed are each
    found when planted again."""
    g = graph()
    planted = dict(g)
    planted["submit.api"] = g["submit.api"] | {"submit.cli.cli_base"}
    planted["submit.console.app"] = g["submit.console.app"] | {"submit.cli.formats"}
    planted["submit.local.entry"] = g["submit.local.entry"] | {"submit.prediction.job"}
    assert arrows_up(planted) == ["submit.api -> submit.cli.cli_base",
                                  "submit.console.app -> submit.cli.formats",
                                  "submit.local.entry -> submit.prediction.job"]
    # the layers read the imports they judge
    assert "submit.query.listing" in g["submit.api"] and "submit.local.entry" in g[
        "submit.prediction.job"]
