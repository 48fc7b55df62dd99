"""A small image for the container tests that need a container but not TensorFlow: this
machine's own Python (its executable, its standard library without tests or
site-packages, and the shared libraries they load), made into an image with
`podman import`, no network and no registry. Its tag is a hash of its inputs (each
file's path, size and modification time), so it is built once per machine and Python,
in seconds, and found afterwards: CI's fresh machine builds it in its first test.

Inside, `python3` and `python` are that Python, at its own path (it finds its standard
library there), so a replica's `containerCommand: [python3, -c, ...]` runs as on the
host. The base image of Debian's packages (`submit.local.image_build`) takes minutes;
the tests that run TensorFlow in containers use it, and are slow."""
from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import sys
import sysconfig
import tarfile

from submit.local import container_engine as ce

NAME = "localhost/mljob-fixture"
RECIPE = 1
# Parts of the standard library no replica imports (and the static library).
SKIPPED = re.compile(r"/(test|tests|idlelib|tkinter|turtledemo|ensurepip|lib2to3|"
                     r"site-packages|dist-packages|config-[^/]*)(/|$)|\.opt-[12]\.pyc$")


def _libraries(paths: list[str]) -> set[str]:
    """The shared libraries the executables and extension modules load (ldd's view)."""
    found: set[str] = set()
    for path in paths:
        out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
        for line in out.splitlines():
            match = re.search(r"(/\S+) \(0x", line)
            if match and os.path.exists(match[1]):
                found.add(match[1])
    return found


def inputs() -> list[str]:
    """Every file the image holds, as paths on this machine."""
    executable = os.path.realpath(sys.executable)
    stdlib = sysconfig.get_paths()["stdlib"]
    files = []
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = [d for d in dirs if not SKIPPED.search(os.path.join(root, d))]
        files += [os.path.join(root, n) for n in names
                  if not SKIPPED.search(os.path.join(root, n))]
    extensions = [f for f in files if f.endswith(".so")]
    return sorted({executable, *files, *_libraries([executable, *extensions])})


def tag(files: list[str]) -> str:
    digest = hashlib.sha256(repr(RECIPE).encode())
    for path in files:
        st = os.stat(path)
        digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:12]


def image(engine: ce.Engine) -> str:
    """`localhost/mljob-fixture:TAG`, imported when missing."""
    files = inputs()
    name = f"{NAME}:{tag(files)}"
    if ce.image_exists(engine, name):
        return name
    executable = os.path.realpath(sys.executable)
    proc = subprocess.Popen(engine.argv("import", "--change", 'CMD ["python3"]', "-", name),
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    assert proc.stdin is not None
    try:
        with tarfile.open(fileobj=proc.stdin, mode="w|") as tar:
            for folder in ("tmp", "etc", "usr/bin", "proc", "sys", "dev"):
                info = tarfile.TarInfo(folder)
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
                tar.addfile(info)
            for path in files:  # links resolved: each file at its own path
                tar.add(os.path.realpath(path), arcname=path.lstrip("/"), recursive=False)
            for link in ("usr/bin/python3", "usr/bin/python"):
                if "/" + link == executable:  # Debian's own: the file is there
                    continue
                info = tarfile.TarInfo(link)
                info.type, info.linkname = tarfile.SYMTYPE, executable
                tar.addfile(info)
            passwd = b"root:x:0:0:root:/root:/bin/sh\n"
            info = tarfile.TarInfo("etc/passwd")
            info.size = len(passwd)
            tar.addfile(info, io.BytesIO(passwd))
    finally:
        proc.stdin.close()
        assert proc.stderr is not None
        err = proc.stderr.read()
        proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"podman import of {name} failed: {err.decode()[-500:]}")
    return name
