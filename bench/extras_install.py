"""Each of setup.py's installs measured: `pip install mljob[EXTRA]` into a fresh venv
(not editable, from this source tree), the venv's size over an empty venv's, and the
import time of what that use runs (the best of three fresh interpreters).

    python3 -m bench.extras_install [--only core,submit,serve] [--json FILE]
    python3 -m bench.extras_install --only serve --before COMMIT

Prints a Markdown table (docs/install.md holds the last one). It downloads what pip's
cache lacks; TensorFlow (`cpu`) is large. `--before COMMIT` measures the same installs
of that commit's tree too (extracted with `git archive`), each beside this tree's, for
a change's before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what each install is for, and the import that use starts with
VARIANTS = {
    "core": ("", "import mljob.storage, mljob.procs, mljob.cluster"),
    "submit": ("submit", "import submit.__main__"),
    # the server's process before TensorFlow: its command line, flags, HTTP and gRPC
    # (predict.serving was that module; it is the process's package since)
    "serve": ("serve", "import predict.__main__, grpc, uvicorn, predict.serving as s; "
                       "getattr(s, 'run', None) or __import__('predict.serving.process')"),
    # --prefer_tflite_model's interpreter, an extra of its own beside the server's
    "serve-tflite": ("serve,serve-tflite", "import ai_edge_litert.interpreter"),
    "cpu": ("cpu", "import tensorflow"),
    "kubeflow": ("submit,kubeflow", "import submit.runners.kubeflow"),
    "vertex": ("submit,vertex", "import submit.runners.vertex"),
    "tuning": ("submit,tuning", "import optuna, matplotlib.pyplot"),
    "ray": ("submit,ray", "import ray"),
}


def du(path: str) -> int:
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total


def venv(folder: str) -> str:
    subprocess.run([sys.executable, "-m", "venv", folder], check=True)
    return os.path.join(folder, "bin", "python")


def import_seconds(python: str, statement: str, cwd: str) -> float:
    best = float("inf")
    for _ in range(3):
        code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=cwd,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
                                   "PYTHONPATH": ""}, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"{statement}: {done.stderr.strip().splitlines()[-1:]}")
        best = min(best, float(done.stdout.strip().splitlines()[-1]))
    return best


def measure(name: str, work: str, empty: int, root: str = ROOT, tag: str = "") -> dict:
    extras, statement = VARIANTS[name]
    folder = os.path.join(work, name + tag)
    python = venv(folder)
    target = f"{root}[{extras}]" if extras else root
    started = time.monotonic()
    subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    target], check=True, timeout=3600)
    took = time.monotonic() - started
    size = du(folder) - empty
    seconds = import_seconds(python, statement, work)
    shutil.rmtree(folder, ignore_errors=True)
    return {"install": name + tag, "extras": extras, "size_mb": round(size / 1e6, 1),
            "install_s": round(took, 1), "import_s": round(seconds, 3),
            "import": statement}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(VARIANTS))
    parser.add_argument("--json")
    parser.add_argument("--before", metavar="COMMIT",
                        help="measure that commit's tree too, each install beside ours")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mljob-extras-") as work:
        empty_python = venv(os.path.join(work, "empty"))
        empty = du(os.path.dirname(os.path.dirname(empty_python)))
        trees = [(ROOT, "")]
        if args.before:
            before = os.path.join(work, "before-tree")
            os.makedirs(before)
            archive = subprocess.run(["git", "-C", ROOT, "archive", args.before],
                                     check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", before], input=archive, check=True)
            trees.insert(0, (before, f" (before, {args.before[:10]})"))
        for name in args.only.split(","):
            for root, tag in trees:
                try:
                    rows.append(measure(name, work, empty, root, tag))
                except (subprocess.SubprocessError, RuntimeError) as exc:
                    rows.append({"install": name + tag, "error": str(exc)[:200]})
                print(json.dumps(rows[-1]), flush=True)
    print("| install | `pip install` | size over an empty venv | import | time |")
    print("|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['install']} | | | | failed: {r['error']} |")
            continue
        spec = f"mljob[{r['extras']}]" if r["extras"] else "mljob"
        print(f"| {r['install']} | `{spec}` | {r['size_mb']} MB | `{r['import']}` | "
              f"{r['import_s']:.2f} s |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
