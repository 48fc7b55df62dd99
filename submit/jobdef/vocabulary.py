"""The words and bounds config.yaml's keys take (restart policies, goals, algorithms,
parameter types and scales, the trial and restart bounds), and how a value's type is
named in a message: shared by the schema (`config_schema`, pydantic) and by the checks
that run without it, so that a command which reads no config never loads pydantic."""
from __future__ import annotations

from typing import Any

RESTART_POLICIES = ("Never", "OnFailure", "ExitCode", "Always")
GOALS = ("MAXIMIZE", "MINIMIZE")
ALGORITHMS = ("ALGORITHM_UNSPECIFIED", "GRID_SEARCH", "RANDOM_SEARCH")
PARAM_TYPES = ("DOUBLE", "INTEGER", "CATEGORICAL", "DISCRETE")
SCALES = ("UNIT_LINEAR_SCALE", "UNIT_LOG_SCALE", "UNIT_REVERSE_LOG_SCALE")
MAX_RESTARTS = 100
MAX_TRIALS = 10_000          # a sanity bound, like the replica counts'
# Trials running at once: each is a training job of its own (the local runner starts them
# all on this machine; Vertex and Katib queue what their cluster cannot hold).
MAX_PARALLEL_TRIALS = 100


def type_name(value: Any) -> str:
    names = {str: "a string", int: "an integer", bool: "true or false", list: "a list",
             dict: "a mapping", float: "a number", type(None): "empty"}
    return names.get(type(value), type(value).__name__)
