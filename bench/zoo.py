"""The model zoo's time per model (tests/zoo/models.py): each model built, trained by
`mljob.training.fit` on a single node for --steps steps of batch 32 on its own small
data, evaluated on 256 examples and exported, one after the other in this process.

    python -m bench.zoo [--steps 200]

Reported per model: seconds to build (model_fn, with its adapt() calls), the first
chunk of steps (tracing), steps/s after it (the loop's own "step N" lines, timed as
they arrive), and the whole fit (training, evaluation, export). The process CPU
seconds of the fit are kept beside them: on a shared machine wall time is the noisy
one. Writes bench/results/zoo.json.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import resource
import tempfile
import time

from bench import common

LOG_EVERY = 20


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Timed(io.TextIOBase):
    """A progress stream that keeps when each `step N/` line arrived."""

    def __init__(self):
        self.steps: list[tuple[int, float]] = []

    def write(self, text: str) -> int:
        for match in re.finditer(r"^step ([0-9]+)/", text, re.M):
            self.steps.append((int(match.group(1)), time.monotonic()))
        return len(text)


def measure(name: str, steps: int, root: str) -> dict:
    import keras

    from mljob import cluster, training
    from mljob.training import summaries
    from tests.zoo import models as zoo
    entry = zoo.ZOO[name]
    keras.backend.clear_session()
    t0 = time.monotonic()
    entry.model_fn()
    build = time.monotonic() - t0
    stream = _Timed()
    original = summaries.Progress.__init__

    def progress_init(self, total, *, enabled, stream_=None, **_):
        original(self, total, enabled=enabled, stream=stream)
    summaries.Progress.__init__ = progress_init  # type: ignore[method-assign]
    try:
        keras.backend.clear_session()
        cpu, start = _cpu_s(), time.monotonic()
        training.fit(entry.model_fn, **zoo.fit_arguments(entry),
                     config=training.RunConfig(
                         job_dir=os.path.join(root, name), train_steps=steps,
                         batch_size=32, eval_every=0, checkpoint_every=0,
                         log_every=LOG_EVERY, steps_per_execution=LOG_EVERY),
                     info=cluster.from_environment({}))
        fit, fit_cpu = time.monotonic() - start, _cpu_s() - cpu
    finally:
        summaries.Progress.__init__ = original  # type: ignore[method-assign]
    (first, t_first), (last, t_last) = stream.steps[0], stream.steps[-1]
    return {"model": name, "build_s": round(build, 3),
            "first_step_s": round(t_first - start, 3),
            "steps_per_s": round((last - first) / max(t_last - t_first, 1e-9), 1),
            "fit_s": round(fit, 2), "fit_cpu_s": round(fit_cpu, 2)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--out", default=os.path.join(common.RESULTS, "zoo.json"))
    args = p.parse_args()
    from tests.zoo import models as zoo
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-zoo-") as root:
        for name in zoo.ZOO:
            rows.append(measure(name, args.steps, root))
            print(json.dumps(rows[-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump({"machine": common.machine(), "load_average": common.load_average(),
                   "steps": args.steps, "batch_size": 32, "models": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
