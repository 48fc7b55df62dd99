"""Runners execute a JobPlan. Each backend is a module with a class taking
`(plan, record, publish=..., terminal=...)` and a `run() -> final state` method; the
registry imports a backend only when it is asked for, so a cluster engine's SDK is never
loaded for local jobs."""
from __future__ import annotations

import importlib

from submit.errors import UsageError

RUNNERS = {"local": "submit.runners.local:LocalRunner"}


def get(name: str):
    try:
        target = RUNNERS[name]
    except KeyError:
        raise UsageError(f"unknown runner {name!r}; use one of {', '.join(RUNNERS)}") \
            from None
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise UsageError(f"runner {name!r} needs {exc.name}; install it with pip") from None
