"""A snippet run in a child Python, its peak resident memory (VmHWM) measured: memory
bounds are tested by what a process really allocated, not assumed. The child gets an address-space
limit so a bound that is missing fails the test instead of the machine."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

_RUNNER = """
import json, resource, sys, traceback
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
result = {"error": None}
try:
    exec(compile(sys.stdin.read(), "<snippet>", "exec"), {"__name__": "__snippet__"})
except BaseException as exc:
    result["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
# VmHWM: this program's own peak. ru_maxrss would not do: Linux keeps, across fork and
# exec, the peak of the forking process (a test process that loaded TensorFlow: 600 MB).
with open("/proc/self/status") as f:
    result["peak_mb"] = int(next(x for x in f if x.startswith("VmHWM:")).split()[1]) / 1024
print("PEAK " + json.dumps(result), flush=True)
"""


def run_measured(code: str, *, limit_mb: int = 3072, timeout: float = 240,
                 cwd: str | None = None) -> dict:
    """{"error": "Type: message" or None, "peak_mb": float, "stdout": str}; the child
    sees this worktree first on sys.path."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", _RUNNER, str(limit_mb * 1024 * 1024)],
                          input=textwrap.dedent(code), capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd or root)
    line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith("PEAK ")),
                None)
    assert line is not None, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    result = json.loads(line[len("PEAK "):])
    result["stdout"] = proc.stdout
    return result
