"""pip's configuration, read once as pip itself resolves it, and handed to uv.

A package environment installs "with pip's own configuration" whichever tool installs:
uv reads none of pip's files or `PIP_*` variables, so what a user set for pip (an
index or mirror, find-links, constraints, a certificate bundle, a proxy) is turned into
uv's flags and variables.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

# Later wins, as pip applies them: global < user < site < the environment's PIP_* vars.
_RANK = {"global": 0, "install": 1, "user": 2, "site": 3, ":env:": 4}
_LINE = re.compile(r"^(:env:|global|install|user|site)\.([\w-]+)=(['\"])(.*)\3$")


def pip_settings() -> dict[str, str]:
    """pip's effective settings for `pip install` (`pip config list`), name -> value."""
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                              capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    ranked: dict[str, tuple[int, str]] = {}
    for line in proc.stdout.splitlines():
        found = _LINE.match(line.strip())
        if found is None:
            continue
        section, name, _, value = found.groups()
        rank = _RANK[section]
        if name not in ranked or rank >= ranked[name][0]:
            ranked[name] = (rank, value)
    return {name: value for name, (_, value) in ranked.items()}


def uv_settings(pip: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """uv's flags and environment for pip's settings."""
    flags: list[str] = []
    env = dict(os.environ)
    lists = (("index-url", "--index-url"), ("extra-index-url", "--extra-index-url"),
             ("find-links", "--find-links"), ("constraint", "--constraint"),
             ("trusted-host", "--allow-insecure-host"))
    for name, flag in lists:
        for value in pip.get(name, "").split():
            flags += [flag, value]
    if pip.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        flags.append("--no-index")
    if pip.get("cert"):
        env["SSL_CERT_FILE"] = pip["cert"]
    if pip.get("proxy"):
        env.setdefault("HTTPS_PROXY", pip["proxy"])
        env.setdefault("HTTP_PROXY", pip["proxy"])
    timeout = pip.get("timeout") or pip.get("default-timeout")
    if timeout:
        env.setdefault("UV_HTTP_TIMEOUT", timeout)
    return flags, env


__all__ = ["pip_settings", "uv_settings"]
