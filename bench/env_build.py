"""The first build of the bundled trainer's package environment, with venv + pip and
with uv side by side (`MLJOB_ENV_INSTALLER`), alternating, each in a fresh environment
cache and with fresh download caches for both tools (a first build on a new machine).

    python -m bench.env_build [--repeats 2]

Builds the project's sdist once (`submit.packaging.package.build`, as `python -m submit` does
without --package-path), stages it in a local folder, then times
`submit.packaging.envs.ensure_environment` for it; every environment built must pass the cache's
trust check (`submit.packaging.envtrust`). Writes bench/results/env_build.json with the times, the
uv/pip ratio, the distributions each installed into the environment (uv ignores the
interpreter's own packages a venv sees, so it installs copies of them: see
`submit.packaging.envs.installer`) and the load average before and after each build.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import statistics
import tempfile
import time

from submit.packaging import envs, envtrust, package

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "results", "env_build.json")


def build_once(pkg: package.Package, tool: str, work: str) -> dict:
    """One first build with `tool`, in a fresh cache; its seconds and load."""
    saved = {k: os.environ.get(k) for k in (envs.INSTALLER_ENV, "PIP_CACHE_DIR",
                                             "UV_CACHE_DIR")}
    os.environ.update({envs.INSTALLER_ENV: tool,
                       "PIP_CACHE_DIR": os.path.join(work, "pip-cache"),
                       "UV_CACHE_DIR": os.path.join(work, "uv-cache")})
    root = os.path.join(work, "envs")
    key = envs.environment_key([pkg])
    try:
        load = os.getloadavg()[0]
        started = time.monotonic()
        _, created = envs.ensure_environment([pkg], key, root=root)
        seconds = time.monotonic() - started
        assert created, "the environment was reused: the cache was not fresh"
        reason = envtrust.untrusted(root, key, envs.ENV_MARKER)
        assert reason is None, f"{tool}'s environment fails the trust check: {reason}"
        installed = glob.glob(os.path.join(glob.escape(root), key, "lib", "python*",
                                           "site-packages", "*.dist-info"))
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return {"tool": tool, "seconds": round(seconds, 2), "load_before": round(load, 2),
            "load_after": round(os.getloadavg()[0], 2),
            "distributions_installed": len(installed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    os.environ[envs.INSTALLER_ENV] = "uv"
    if envs.installer() is None:
        raise SystemExit("uv is not installed: pip install uv (the bench extra has it)")
    work = tempfile.mkdtemp(prefix="mljob-bench-env-")
    try:
        built = package.build(package.resolve_source(ROOT), os.path.join(work, "dist"))
        staged = package.stage(built, os.path.join(work, "staged", built.file_name))
        results = []
        for repeat in range(args.repeats):
            order = ("pip", "uv") if repeat % 2 == 0 else ("uv", "pip")
            for tool in order:
                run_dir = tempfile.mkdtemp(dir=work)
                entry = {"repeat": repeat, **build_once(staged, tool, run_dir)}
                shutil.rmtree(run_dir, ignore_errors=True)
                print(json.dumps(entry), flush=True)
                results.append(entry)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    median = {tool: statistics.median(r["seconds"] for r in results if r["tool"] == tool)
              for tool in ("pip", "uv")}
    ratio = median["pip"] / median["uv"]
    print(f"first build of the bundled trainer's environment: pip {median['pip']:.1f} s, "
          f"uv {median['uv']:.1f} s: uv is {ratio:.1f}x faster")
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"what": "seconds of the first build of the bundled trainer's package "
                           "environment (fresh environment and download caches)",
                   "median_seconds": median, "pip_over_uv": round(ratio, 2),
                   "package": built.file_name, "cpus": os.cpu_count(),
                   "python": platform.python_version(), "results": results}, f, indent=2)
    print(f"wrote {os.path.relpath(OUT, ROOT)}")


if __name__ == "__main__":
    main()
