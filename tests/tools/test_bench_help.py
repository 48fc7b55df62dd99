"""Every benchmark's `--help` prints its usage and exits 0 (a `%` in a help string made
argparse raise instead) and runs nothing (one ignored its arguments and rewrote its
results): all of them run as `python -m bench.NAME --help` in one child process, so
TensorFlow is imported once."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.support.common import ROOT

SCRIPT = r'''
import contextlib, io, runpy, sys
bad = []
for name in sys.argv[1:]:
    sys.argv = [name, "--help"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        bad.append(f"{name}: --help returned without exiting")
    except SystemExit as exc:
        if exc.code not in (0, None) or "usage:" not in out.getvalue():
            bad.append(f"{name}: exit {exc.code}, {out.getvalue()[:200]!r}")
    except Exception as exc:
        bad.append(f"{name}: {type(exc).__name__}: {exc}")
print("\n".join(bad) or "ok")
'''


def test_every_benchmark_answers_help():
    folder = os.path.join(ROOT, "bench")
    names = []
    for f in sorted(f for f in os.listdir(folder) if f.endswith(".py")):
        with open(os.path.join(folder, f)) as source:
            if 'if __name__ == "__main__":' in source.read():
                names.append(f"bench.{f[:-3]}")
    assert "bench.time_to_accuracy" in names
    done = subprocess.run([sys.executable, "-c", SCRIPT, *names], cwd=ROOT, timeout=300,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1:] == ["ok"], done.stdout
