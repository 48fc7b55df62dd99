"""Submitting in-process, as the tests do: a minimal training package, `python -m submit`
run through its entry point with captured output, and what a folder holds."""
from __future__ import annotations

import json
import os

from submit.__main__ import main

def write_package(folder, task_source: str = "print('hello')\n") -> str:
    """A minimal training package: setup.py and a module `fakejob.task`."""
    os.makedirs(os.path.join(folder, "fakejob"), exist_ok=True)
    with open(os.path.join(folder, "setup.py"), "w") as f:
        f.write('from setuptools import setup\n'
                'setup(name="fakejob", version="0.1", packages=["fakejob"])\n')
    for name, text in (("__init__.py", ""), ("task.py", task_source)):
        with open(os.path.join(folder, "fakejob", name), "w") as f:
            f.write(text)
    return str(folder)


def run(capsys, *argv):
    status = main(list(argv), standalone_mode=False)
    out, err = capsys.readouterr()
    return status, out, err


def files_under(*folders) -> list[str]:
    found = []
    for folder in folders:
        for dirpath, _, names in os.walk(folder):
            found += [os.path.join(dirpath, n) for n in names]
    return found


def dry_run(capsys, *argv) -> dict:
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    status, out, err = run(capsys, *argv[:cut], "--dry-run", *argv[cut:])
    assert status == 0, err
    return json.loads(out)


def one_error_line(err: str) -> str:
    """The one `error: ...` line a refused command prints, with no traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


def nothing_written(*folders) -> None:
    """Nothing under the folders, and no job record or environment in MLJOB_HOME."""
    assert files_under(*folders) == []
    home = os.environ["MLJOB_HOME"]
    assert not os.path.exists(os.path.join(home, "jobs"))
    assert not os.path.exists(os.path.join(home, "envs"))
