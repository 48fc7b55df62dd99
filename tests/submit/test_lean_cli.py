"""The command line loads what a command needs: `python -m submit --help` and
`python -m submit jobs list` read no config, so neither imports pydantic (config.yaml's
schema), numpy nor TensorFlow; each is run in a fresh interpreter and its sys.modules
read at the end."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.common import ROOT

HEAVY = ("pydantic", "numpy", "tensorflow", "keras")
# runs the CLI as `python -m submit ARGS` does, then prints the top-level modules loaded
WRAPPER = ("import json, runpy, sys\n"
           "sys.argv = ['submit'] + sys.argv[1:]\n"
           "try:\n    runpy.run_module('submit', run_name='__main__', alter_sys=True)\n"
           "except SystemExit as e:\n    code = e.code\n"
           "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})), "
           "file=sys.stderr)\n")


def loaded(args: list[str], home: str) -> tuple[set[str], str]:
    done = subprocess.run([sys.executable, "-c", WRAPPER, *args], cwd=ROOT, timeout=120,
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT, "MLJOB_HOME": home})
    return set(json.loads(done.stderr.strip().splitlines()[-1])), done.stdout


def test_help_and_jobs_list_load_no_config_schema_numpy_or_tensorflow(tmp_path):
    for args, shown in ((["--help"], "jobs"), (["jobs", "list"], "JOB_ID")):
        modules, out = loaded(args, str(tmp_path))
        assert shown in out, (args, out)            # the command ran
        assert {"click", "submit"} <= modules        # and the probe sees what it loaded
        assert not modules & set(HEAVY), (args, sorted(modules & set(HEAVY)))
