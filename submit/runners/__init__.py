"""Runners execute a job, all behind one interface (`submit.runners.engine.Runner`):
`local` supervises one process per replica on this machine; `kubeflow`, `vertex` and
`ray` are cluster engines that hand the job to Kubernetes, Vertex AI or a Ray cluster.
The registry imports a backend only when it is asked for, so an engine's SDK is never
loaded for local jobs, and a missing SDK gets an install hint."""
from __future__ import annotations

import importlib
from typing import Any, NamedTuple

from submit.errors import UsageError

RUNNERS = {"local": "submit.runners.local:LocalEngine",
           "kubeflow": "submit.runners.kubeflow:KubeflowEngine",
           "vertex": "submit.runners.vertex:VertexEngine",
           "ray": "submit.runners.ray:RayEngine"}
# Runners that run a tuning job (trainingInput.hyperparameters) as a runner of its own:
# Ray's is a study supervised here whose trials are Ray jobs (submit.runners.ray_tuning).
TUNING = {"ray": "submit.runners.ray_tuning:RayTuningEngine"}
# Runners that take a batch prediction job (`Runner.render_prediction`); the others refuse
# one in a line naming these.
PREDICTION = ("local", "vertex", "kubeflow")
EXTRAS = {"kubeflow": "kubeflow", "vertex": "vertex", "ray": "ray"}  # setup.py extras per runner
# Each runner's own options (`RunOpt`s), in a module that imports no SDK, so that the CLI
# builds its flags (and `--help`) without loading any engine.
OPTIONS = {"local": "submit.runners.local_options:RUNOPTS",
           "kubeflow": "submit.runners.kubeflow_options:RUNOPTS",
           "vertex": "submit.runners.vertex_options:RUNOPTS",
           "ray": "submit.runners.ray_options:RUNOPTS"}


class Declared(NamedTuple):
    opt: Any                    # the first declaring runner's RunOpt (flag, choices)
    owners: tuple[str, ...]     # the runners that take it
    help: str                   # each owner's help, prefixed with its name


def declared_options(*, prediction: bool = False) -> dict[str, Declared]:
    """Every runner option by name, the runners in the registry's order; two runners
    declaring one name share its flag (the first's flag and choices, both helps). With
    `prediction`, those a batch prediction job takes (`RunOpt.prediction`), with that
    help, on the runners that take one."""
    found: dict[str, Declared] = {}
    for runner in RUNNERS:
        if runner not in OPTIONS or (prediction and runner not in PREDICTION):
            continue
        module, _, attr = OPTIONS[runner].partition(":")
        for opt in getattr(importlib.import_module(module), attr):
            if prediction and opt.prediction is None:
                continue
            mine = f"{runner}: {opt.prediction if prediction else opt.help}"
            if opt.name in found:
                seen = found[opt.name]
                found[opt.name] = seen._replace(owners=(*seen.owners, runner),
                                                help=f"{seen.help}; {mine}")
            else:
                found[opt.name] = Declared(opt, (runner,), mine)
    return found


def get(name: str, *, tuning: bool = False):
    """The runner class `name`; with `tuning`, the one that runs its tuning jobs."""
    try:
        target = TUNING[name] if tuning and name in TUNING else RUNNERS[name]
    except KeyError:
        raise UsageError(f"unknown runner {name!r}; use one of {', '.join(RUNNERS)}") \
            from None
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        if exc.name and exc.name.startswith(("submit", "trainer")):
            raise
        extra = EXTRAS.get(name)
        hint = (f"pip install -e '.[{extra}]' in mljob's source folder" if extra
                else f"pip install {exc.name}")
        raise UsageError(f"runner {name!r} needs the Python package {exc.name!r}; "
                         f"install it with {hint}") from None
