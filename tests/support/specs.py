"""A JobSpec from a job id, a trainingInput and flags, in one call, for tests that
render a job: the flags become the frozen `Flags`, the trainingInput a checked config."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from submit.jobdef import spec as specs


def resolve(job_id: str, training_input: Mapping[str, Any], **flags: Any) -> specs.JobSpec:
    if flags.get("args") is not None:
        flags["args"] = tuple(flags["args"])
    return specs.resolve(specs.Flags(job_id, **flags), specs.training_config(training_input))
