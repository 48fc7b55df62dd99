"""gcloud's and Cloud ML's REST spellings, taken as they are written.

Users copy commands and configs from Cloud ML's docs, old scripts and `gcloud ...
describe --format yaml`; this module maps those spellings onto ours:

- enum values in any of gcloud's spellings: `standard-1`, `STANDARD_1`, `standard_1`;
- int64 fields written as strings, as the REST API and `describe --format yaml` emit them
  (`workerCount: '2'`): INT64_KEYS are written so, and config.yaml's schema
  (`submit.jobdef.config_schema`) reads every int64 field so;
- job ids by Cloud ML's rule, with the nearest valid spelling in the error, and never a
  command's name (`models`, `jobs`, ...);
- YAML anchors and aliases, with the expanded document bounded (a few lines of aliases
  can expand to gigabytes: the alias bomb).
"""
from __future__ import annotations

import re
from collections.abc import Iterable

import yaml

from submit.errors import ConfigError, UsageError

JOB_ID = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")  # whole string: fullmatch
# gcloud ai-platform's command groups and ours (`console`): never a job id, so that
# `python -m submit models` is never a training job named "models", and every job id can
# be submitted with the short form `python -m submit JOB_ID`.
RESERVED_WORDS = frozenset({"jobs", "local", "models", "versions", "predict", "explain",
                            "operations", "submit", "help", "training", "prediction",
                            "console"})
# trainingInput's int64 counts (the REST API writes int64 as a JSON string)
INT64_KEYS = ("workerCount", "parameterServerCount", "evaluatorCount")
MAX_EXPANDED_VALUES = 10_000   # a job config holds tens; anchors may repeat some


def enum_value(text: str, choices: Iterable[str], what: str,
               refused: dict[str, str] | None = None) -> str:
    """`text` as the one of `choices` it spells, in gcloud's spellings: any case, `-` for
    `_` (`standard-1`, `BASIC_GPU`, `basic_gpu`, `OnFailure`, `on-failure`). A value
    in `refused` is a known one this tool cannot run: its reason is the error."""
    def key(s: str) -> str:
        return s.replace("-", "").replace("_", "").lower()
    chosen = {key(c): c for c in choices}
    if not isinstance(text, str) or key(text) not in chosen:
        for name, reason in (refused or {}).items():
            if isinstance(text, str) and key(text) == key(name):
                raise UsageError(f"{what} {text!r:.40}: {reason}")
        spelled = ", ".join(c if c != c.upper() else c.lower().replace("_", "-")
                            for c in choices)  # gcloud's spelling; CamelCase as it is
        raise UsageError(f"unknown {what} {text!r:.40}; use one of {spelled} (any case, "
                         "'-' or '_')")
    return chosen[key(text)]


def suggest_job_id(text: str) -> str:
    """The nearest valid job id: other characters become `_`, a leading non-letter gets
    `job_` in front, a reserved word gets `_1` after."""
    fixed = re.sub(r"[^A-Za-z0-9_]", "_", str(text)).strip("_") or "job"
    if not fixed[0].isalpha():
        fixed = "job_" + fixed
    if fixed.lower() in RESERVED_WORDS:
        fixed += "_1"
    return fixed[:128]


def check_job_id(job_id: str) -> None:
    """Cloud ML's rule: letters, digits and underscores, starting with a letter (at most
    128), and not one of the commands' names."""
    if not JOB_ID.fullmatch(job_id or ""):  # `$` would let "job01\n" through
        raise UsageError(f"invalid job id {job_id!r:.80}: use letters, digits and "
                         "underscores, starting with a letter, at most 128 characters, "
                         f"e.g. {suggest_job_id(job_id or 'job01')}")
    if job_id.lower() in RESERVED_WORDS:
        raise UsageError(f"{job_id!r} is a command's name, never a job id; pick another, "
                         f"e.g. {suggest_job_id(job_id)} (or see python -m submit --help)")


def check_expansion(node: yaml.Node | None, path: str, max_depth: int) -> None:
    """Refuse a composed YAML document whose aliases expand past MAX_EXPANDED_VALUES
    values or `max_depth` levels, or refer to themselves. Each node is sized once
    (shared by its aliases), so the check costs the document's written size."""
    sizes: dict[int, tuple[int, int] | None] = {}  # id -> (values, height); None: open

    def measure(n: yaml.Node, depth: int) -> tuple[int, int]:
        if depth > max_depth:
            raise ConfigError(f"--config {path} line {n.start_mark.line + 1} nests values "
                              f"more than {max_depth} levels deep (aliases included); a "
                              "job config needs 4")
        if id(n) in sizes:
            known = sizes[id(n)]
            if known is None:
                raise ConfigError(f"--config {path} line {n.start_mark.line + 1}: an alias "
                                  "refers to the value that holds it; write the value out")
            if depth + known[1] > max_depth:
                measure_deep = depth + known[1]
                raise ConfigError(f"--config {path} line {n.start_mark.line + 1} nests "
                                  f"values {measure_deep} levels deep through aliases; a "
                                  f"job config needs at most {max_depth}")
            return known
        sizes[id(n)] = None
        values, height = 1, 0
        if isinstance(n, (yaml.SequenceNode, yaml.MappingNode)):
            children = (n.value if isinstance(n, yaml.SequenceNode)
                        else [c for pair in n.value for c in pair])
            for child in children:
                size, h = measure(child, depth + 1)
                values, height = values + size, max(height, h + 1)
                if values > MAX_EXPANDED_VALUES:
                    raise ConfigError(
                        f"--config {path} line {n.start_mark.line + 1}: its YAML aliases "
                        f"expand to more than {MAX_EXPANDED_VALUES} values; a job config "
                        "holds tens, write fewer aliases")
        sizes[id(n)] = (values, height)
        return values, height

    if node is not None:
        measure(node, 0)
