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


def at_once(argvs: list[list[str]]) -> list[int]:
    """Each `python -m submit` argv in a process of its own (forked from this one, its
    imports done), all let go at the same moment; their exit statuses."""
    go_r, go_w = os.pipe()
    pids = []
    for argv in argvs:
        pid = os.fork()
        if pid == 0:  # the child: wait for the start, run the command, exit with it
            status = 3
            try:
                os.close(go_w)
                os.read(go_r, 1)
                status = main(argv, standalone_mode=False)
            finally:
                os._exit(status if isinstance(status, int) else 3)
        pids.append(pid)
    os.close(go_r)
    os.close(go_w)  # every child's read returns now
    return [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
