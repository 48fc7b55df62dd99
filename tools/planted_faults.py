"""Planted faults: does the test suite notice a small, plausible bug?

Each fault in the list (tools/faults.toml) is one edit a developer could plausibly
make: a flipped sign, a swapped order, a dropped check. For each, this script copies the
working tree once into a temporary folder, applies the edit there (never in your tree),
runs only the tests named for that fault, restores the file and moves on. A fault is

- caught: a selected test failed (or the run hit the timeout);
- survived: every selected test passed with the bug in place;
- stale: its `find` text is not in the file exactly once (the code moved on: update it);
- error: the selection did not run (no test collected, an internal pytest error);
- broken baseline: a selected test fails without the fault too (so it proves nothing).

The score is caught / (caught + survived). Run it over the modules a change touches
before resolving an issue, and record the score in the note. It is not a test: pytest
never collects it, and CI does not run it.

    python3 tools/planted_faults.py                  # every fault
    python3 tools/planted_faults.py --only 'tuning-*,env-*' --json out.json
    python3 tools/planted_faults.py --list
"""
from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from typing import NoReturn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_LIST = os.path.join(ROOT, "tools", "faults.toml")
CAUGHT, SURVIVED, STALE, ERROR, BROKEN = ("caught", "survived", "stale", "error",
                                          "broken baseline")


@dataclasses.dataclass(frozen=True)
class Fault:
    id: str
    area: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]
    markers: str = "not slow"
    why: str = ""
    timeout: float | None = None  # seconds; None: the command line's --timeout


@dataclasses.dataclass
class Result:
    id: str
    status: str
    seconds: float
    detail: str = ""


def _fail(message: str) -> NoReturn:
    """A mistake in the list or the command line: one line, exit status 2."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def load(path: str) -> list[Fault]:
    """The fault list; every entry must name a file, a find/replace pair and tests."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        _fail(f"error: cannot read the fault list {path}: {exc.strerror}; "
                         "give --faults an existing TOML file")
    except tomllib.TOMLDecodeError as exc:
        _fail(f"error: {path} is not valid TOML ({exc}); fix the file")
    faults, seen = [], set()
    for i, entry in enumerate(data.get("fault", []), start=1):
        missing = [k for k in ("id", "file", "find", "replace", "tests") if k not in entry]
        if missing:
            _fail(f"error: {path}: fault #{i} lacks {', '.join(missing)}; "
                             "every [[fault]] needs id, file, find, replace and tests")
        if not isinstance(entry["tests"], list) or not entry["tests"] \
                or not all(isinstance(t, str) for t in entry["tests"]):
            _fail(f"error: {path}: fault {entry['id']!r}: tests must be a "
                             "non-empty list of pytest node ids or files")
        if entry["id"] in seen:
            _fail(f"error: {path}: fault id {entry['id']!r} is used twice")
        if entry["find"] == entry["replace"]:
            _fail(f"error: {path}: fault {entry['id']!r} changes nothing")
        seen.add(entry["id"])
        faults.append(Fault(id=entry["id"], area=entry.get("area", ""), file=entry["file"],
                            find=entry["find"], replace=entry["replace"],
                            tests=tuple(entry["tests"]),
                            markers=entry.get("markers", "not slow"),
                            why=entry.get("why", ""), timeout=entry.get("timeout")))
    if not faults:
        _fail(f"error: {path} lists no [[fault]]")
    return faults


def select(faults: list[Fault], only: str | None) -> list[Fault]:
    if not only:
        return faults
    patterns = [p.strip() for p in only.split(",") if p.strip()]
    chosen = [f for f in faults if any(fnmatch.fnmatchcase(f.id, p) for p in patterns)]
    if not chosen:
        _fail(f"error: --only {only!r} matches no fault id; see --list")
    return chosen


def copy_tree(dest: str) -> None:
    """The working tree as git sees it (tracked and untracked, not ignored), uncommitted
    edits included, so the faults are planted in what you are about to commit."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], cwd=ROOT, capture_output=True,
                                check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        _fail(f"error: {ROOT} is not a git checkout (git ls-files failed); run the "
              "script from mljob's git working tree")
    for rel in filter(None, listed):
        src = os.path.join(ROOT, rel)
        if not os.path.isfile(src) or os.path.islink(src) and not os.path.exists(src):
            continue  # deleted in the working tree
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(src, target, follow_symlinks=False)


def pytest_run(tree: str, fault: Fault, timeout: float) -> tuple[str, str]:
    """(caught|survived|error, detail) for the fault's tests in the copy."""
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-n", "0",
               "-p", "no:cacheprovider", "-m", fault.markers, *fault.tests]
    env = {**os.environ, "PYTHONPATH": tree, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop_group(proc)
        return CAUGHT, f"timeout after {timeout:g} s"
    except BaseException:
        _stop_group(proc)  # Ctrl-C: never leave a test run behind
        raise
    finally:
        _stop_group(proc)  # whatever the tests started in their session
    failed = [line[len("FAILED "):] for line in out.splitlines() if line.startswith("FAILED ")]
    if proc.returncode == 0:
        return SURVIVED, _summary(out)
    if proc.returncode == 1 and failed:
        return CAUGHT, failed[0][:160]
    tail = " | ".join(out.strip().splitlines()[-3:])
    return ERROR, f"pytest exit {proc.returncode}: {tail[:200]}"


def _summary(out: str) -> str:
    lines = [line for line in out.strip().splitlines() if re.search(r"[0-9]+ passed", line)]
    return lines[-1].strip("= ") if lines else ""


def _stop_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait(30)


def plant(tree: str, fault: Fault) -> str | None:
    """Apply the fault in the copy; the original text, or None when it is stale."""
    path = os.path.join(tree, fault.file)
    try:
        with open(path, encoding="utf-8") as f:
            original = f.read()
    except FileNotFoundError:
        return None
    if original.count(fault.find) != 1:
        return None
    with open(path, "w", encoding="utf-8") as f:
        f.write(original.replace(fault.find, fault.replace))
    return original


def applies(fault: Fault) -> bool:
    try:
        with open(os.path.join(ROOT, fault.file), encoding="utf-8") as f:
            return f.read().count(fault.find) == 1
    except FileNotFoundError:
        return False


def restore(tree: str, fault: Fault, original: str) -> None:
    with open(os.path.join(tree, fault.file), "w", encoding="utf-8") as f:
        f.write(original)


def run(faults: list[Fault], *, timeout: float, baseline: bool, keep: bool,
        report=print) -> list[Result]:
    tree = tempfile.mkdtemp(prefix="planted-faults-")
    results: list[Result] = []
    try:
        copy_tree(tree)
        report(f"copied the working tree to {tree}")
        broken: dict[tuple, str] = {}
        if baseline:
            for selection in dict.fromkeys((f.tests, f.markers) for f in faults):
                started = time.monotonic()
                status, detail = pytest_run(tree, Fault("baseline", "", "", "", "",
                                                        selection[0], selection[1]),
                                            timeout)
                took = time.monotonic() - started
                report(f"baseline {' '.join(selection[0])}: "
                       f"{'ok' if status == SURVIVED else status} ({took:.0f} s)")
                if status != SURVIVED:
                    broken[selection] = detail
        for n, fault in enumerate(faults, start=1):
            started = time.monotonic()
            if (fault.tests, fault.markers) in broken:
                result = Result(fault.id, BROKEN, 0.0, broken[(fault.tests, fault.markers)])
            else:
                original = plant(tree, fault)
                if original is None:
                    result = Result(fault.id, STALE, 0.0,
                                    f"the find text is not in {fault.file} exactly once")
                else:
                    try:
                        status, detail = pytest_run(tree, fault, fault.timeout or timeout)
                    finally:
                        restore(tree, fault, original)
                    result = Result(fault.id, status, time.monotonic() - started, detail)
            results.append(result)
            report(f"[{n:2d}/{len(faults)}] {fault.id:<34} {result.status:<9} "
                   f"{result.seconds:6.1f} s  {result.detail}")
    finally:
        if keep:
            report(f"kept the copy in {tree}")
        else:
            shutil.rmtree(tree, ignore_errors=True)
    return results


def score(results: list[Result]) -> tuple[int, int, float]:
    caught = sum(r.status == CAUGHT for r in results)
    survived = sum(r.status == SURVIVED for r in results)
    judged = caught + survived
    return caught, survived, (caught / judged if judged else float("nan"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", default=DEFAULT_LIST, help="the fault list (TOML)")
    parser.add_argument("--only", help="comma-separated fault ids or globs (tuning-*)")
    parser.add_argument("--list", action="store_true", help="list the faults and exit")
    parser.add_argument("--check", action="store_true",
                        help="only check that every fault still applies (no tests run)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds per fault's test run (a timeout counts as caught)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip running each selection once without a fault")
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--keep", action="store_true", help="keep the tree's copy")
    args = parser.parse_args(argv)
    faults = select(load(args.faults), args.only)
    if args.list:
        for f in faults:
            print(f"{f.id:<34} {f.area:<22} {f.file}: {f.why}")
        return 0
    if args.check:
        stale = [f for f in faults if not applies(f)]
        for f in stale:
            print(f"stale: {f.id}: its find text is not in {f.file} exactly once")
        print(f"{len(faults) - len(stale)} of {len(faults)} faults apply")
        return 1 if stale else 0
    results = run(faults, timeout=args.timeout, baseline=not args.no_baseline,
                  keep=args.keep)
    caught, survived, ratio = score(results)
    others = {s: sum(r.status == s for r in results) for s in (STALE, ERROR, BROKEN)}
    print(f"\n{caught} caught, {survived} survived"
          + "".join(f", {n} {s}" for s, n in others.items() if n)
          + f": score {caught}/{caught + survived} = {ratio:.0%}")
    for r in results:
        if r.status != CAUGHT:
            print(f"  {r.status}: {r.id}  {r.detail}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"score": ratio, "caught": caught, "survived": survived,
                       "results": [dataclasses.asdict(r) for r in results]}, out, indent=1)
    return 0 if survived == 0 and not any(others.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
