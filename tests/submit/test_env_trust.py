"""A cached package environment is checked before its interpreter runs: a pre-planted
`envs/<key>` link (its `bin/python` ran, and the job SUCCEEDED), a foreign owner, a
marker for another key or an install changed since the build are rebuilt."""
from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import stat

import pytest

from submit.packaging import envtrust, package
from tests.support.submit_cli import write_package


def _sdist(tmp_path) -> package.Package:
    folder = tmp_path / "src"
    write_package(folder, "print('fakejob ran')\n")
    built = package.build(str(folder), str(tmp_path / "dist"))
    return dataclasses.replace(built, url=built.local_file)


def _planted(tmp_path, key: str) -> str:
    """An environment someone else made: a bin/python that leaves a trace, a marker."""
    evil = tmp_path / "elsewhere"
    (evil / "bin").mkdir(parents=True)
    python = evil / "bin" / "python"
    python.write_text(f"#!/bin/sh\ntouch {tmp_path}/planted-python-ran\n")
    python.chmod(0o755)
    (evil / package.ENV_MARKER).write_text(json.dumps({"key": key, "packages": []}))
    return str(evil)


def test_a_planted_link_is_replaced_by_a_built_environment(tmp_path, caplog):
    pkg = _sdist(tmp_path)
    key = package.environment_key([pkg])
    root = tmp_path / "envs"
    root.mkdir(mode=0o700)
    os.symlink(_planted(tmp_path, key), root / key)
    with caplog.at_level(logging.WARNING):
        env, created = package.ensure_environment([pkg], key, root=str(root))
    assert created and env == str(root / key)
    assert envtrust.BUILD_DIR.fullmatch(os.readlink(env))
    assert any("is not used: it points to" in r.getMessage() for r in caplog.records)
    assert not (tmp_path / "planted-python-ran").exists()
    assert (tmp_path / "elsewhere" / "bin" / "python").exists()  # unlinked, not followed
    # the built one is trusted and reused; then each tampering makes it untrusted
    assert package.ensure_environment([pkg], key, root=str(root)) == (env, False)
    folder = os.path.realpath(env)
    assert envtrust.untrusted(str(root), key, package.ENV_MARKER) is None

    record = glob.glob(os.path.join(folder, "lib", "python*", "site-packages",
                                    "fakejob-*.dist-info", "RECORD"))[0]
    original = open(record, "rb").read()
    with open(record, "ab") as f:
        f.write(b"fakejob/extra.py,,\r\n")
    assert envtrust.untrusted(str(root), key, package.ENV_MARKER) == \
        "what is installed in it changed since it was built"
    with open(record, "wb") as f:
        f.write(original)
    pth = glob.glob(os.path.join(folder, "lib", "python*", "site-packages"))[0]
    with open(os.path.join(pth, "zz-evil.pth"), "w") as f:
        f.write("import os\n")
    assert envtrust.untrusted(str(root), key, package.ENV_MARKER) == \
        "what is installed in it changed since it was built"
    os.remove(os.path.join(pth, "zz-evil.pth"))
    assert envtrust.untrusted(str(root), key, package.ENV_MARKER) is None

    marker = os.path.join(folder, package.ENV_MARKER)
    data = json.load(open(marker))
    json.dump(dict(data, key="0" * 64), open(marker, "w"))
    assert envtrust.untrusted(str(root), key, package.ENV_MARKER) == \
        "its marker does not name this environment"
    json.dump(data, open(marker, "w"))

    os.chmod(folder, 0o777)
    assert envtrust.untrusted(str(root), key, package.ENV_MARKER) == \
        "its folder is not this user's alone"
    os.chmod(folder, 0o755)
    if os.geteuid() == 0:
        os.chown(folder, 65534, 65534)
        assert envtrust.untrusted(str(root), key, package.ENV_MARKER) == \
            "its folder is not this user's alone"
        os.chown(folder, 0, 0)
    os.chmod(root, 0o777)
    assert "is not this user's alone" in envtrust.untrusted(str(root), key,
                                                            package.ENV_MARKER)
    os.chmod(root, 0o700)
    assert envtrust.untrusted(str(root), key, package.ENV_MARKER) is None
    assert stat.S_ISLNK(os.lstat(env).st_mode)


@pytest.mark.parametrize("kind", ["folder", "link to a sibling with another key",
                                  "absolute link into the cache"])
def test_what_is_not_the_caches_own_link_is_untrusted(tmp_path, kind):
    key = "a" * 64
    root = tmp_path / "envs"
    root.mkdir(mode=0o700)
    if kind == "folder":
        (root / key).mkdir()
        want = "it is not the link this cache makes"
    elif kind == "link to a sibling with another key":
        other = f"{'b' * 64}.1-deadbeef"
        (root / other).mkdir()
        os.symlink(other, root / key)
        want = "it points to"
    else:
        own = f"{key}.1-deadbeef"
        (root / own).mkdir()
        os.symlink(str(root / own), root / key)
        want = "it points to"
    assert envtrust.untrusted(str(root), key, package.ENV_MARKER).startswith(want)
