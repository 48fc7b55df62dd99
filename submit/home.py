"""mljob's home: where the job index, records, package environments, sdists and models
live on this machine (`$MLJOB_HOME`, default `~/.mljob`)."""
from __future__ import annotations

import os


def mljob_home() -> str:
    return os.path.abspath(os.path.expanduser(os.environ.get("MLJOB_HOME") or "~/.mljob"))
