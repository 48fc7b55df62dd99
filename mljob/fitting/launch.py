"""`python -m mljob.fitting.launch MODULE [ARGS...]`: how every replica mljob starts runs
the user's module, exactly as `python -m MODULE ARGS...` would (`sys.argv`, `__main__`,
the exit status, a traceback for the script's own errors), with Keras's `fit` made
distributed first when the replica is part of a cluster (`mljob.fitting`; off with
MLJOB_KERAS_FIT=0), and on the evaluator replica made the sidecar evaluation of the
chief's epochs (`mljob.fitting.sidecar`, which finds the job dir in ARGS). An mljob
error the script lets escape (a refusal of `fit`, a `mljob.training` error) ends it with
its one line and exit status. A script that ends normally under
MultiWorkerMirroredStrategy waits for the cluster's other tasks to end theirs
(`mljob.coordination`), so that none is taken for crashed.

Imports no TensorFlow and no Keras: a script that uses neither pays nothing.
"""
from __future__ import annotations

import importlib.util
import os
import runpy
import sys

from mljob import fitting
from mljob.coordination import leave_together
from mljob.errors import EXIT_USAGE, MljobError, say

USAGE = "usage: python -m mljob.fitting.launch MODULE [ARGS...]"


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
    module, args = argv[0], argv[1:]
    try:
        found = importlib.util.find_spec(module)
    except ModuleNotFoundError as exc:  # a parent package missing; not one it imports
        if not exc.name or not (module + ".").startswith(exc.name + "."):
            raise
        found = None
    if found is None:  # python -m's own words and status
        print(f"{sys.executable}: No module named {module}", file=sys.stderr)
        raise SystemExit(1)
    if fitting.enabled(os.environ) and fitting.in_cluster(os.environ):
        fitting.install(os.environ, args)
    sys.argv = [module, *args]  # run_module puts the module's file first, as -m does
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except MljobError as exc:
        say(str(exc))
        raise SystemExit(exc.exit_status) from None
    except SystemExit as exc:
        if exc.code in (None, 0):
            leave_together("mljob-launch-end")
        raise
    leave_together("mljob-launch-end")


if __name__ == "__main__":
    main()
