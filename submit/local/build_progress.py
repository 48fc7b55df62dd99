"""What a base image build shows while it works (`submit.local.image_build`): the first
line says what a first build costs, then each phase gets a line as it starts, and a
phase that runs long a line every `every` seconds with what it has done so far: the
Debian packages debootstrap fetched and unpacked (from its own `I:` lines), the wheels
pip downloaded (files and bytes in the cache folder), the bytes of the root filesystem
being imported. Nothing here runs a build; it only reads what the build leaves."""
from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterator

FIRST_BUILD = ("a first build downloads about 400 MB (Debian's packages and pip's wheels) "
               "and writes about 2 GB; it takes 3 to 16 minutes by the machine's load "
               "and network, once: later jobs reuse the image")
DEBOOTSTRAP_LINE = re.compile(r"^I: (Retrieving|Validating|Extracting|Unpacking|"
                              r"Configuring) (\S+)")


def megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def folder_size(path: str) -> tuple[int, int]:
    """(files, bytes) under a folder."""
    files = size = 0
    for root, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                size += os.lstat(os.path.join(root, name)).st_size
                files += 1
    return files, size


class Debootstrap:
    """What debootstrap has done, from its `I:` lines (fed one by one)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.last = "starting"

    def feed(self, line: str) -> None:
        if line.startswith(("I: Retrieving InRelease", "I: Retrieving Packages")):
            self.last = "reading the archive's index"
        elif line.startswith("I: Resolving dependencies"):
            self.last = "resolving dependencies"
        match = DEBOOTSTRAP_LINE.match(line.strip())
        # a package's line, not an index's (Release, Packages) or a stage's
        # ("Unpacking required packages...")
        if match and match[2] not in ("InRelease", "Release", "Packages") \
                and not line.rstrip().endswith("packages..."):
            verb = match[1].lower()
            self.counts[verb] = self.counts.get(verb, 0) + 1
            self.last = f"{verb} {match[2].rstrip('.')}"

    def status(self, debs: str) -> str:
        _, size = folder_size(debs)
        done = ", ".join(f"{n} {verb}" for verb, n in self.counts.items()) or "none yet"
        return f"Debian packages: {done} ({megabytes(size)} in the cache; now {self.last})"


def wheels_status(folder: str) -> str:
    files, size = folder_size(folder)
    return f"wheels: {files} files, {megabytes(size)}"


class Progress:
    """Phase lines, and a line every `every` seconds while a phase runs long."""

    def __init__(self, log: Callable[[str], None], phases: int, every: float = 15.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log, self.phases, self.every, self.clock = log, phases, every, clock
        self.started = clock()
        self.done = 0

    def elapsed(self) -> str:
        return f"{self.clock() - self.started:.0f} s"

    @contextlib.contextmanager
    def phase(self, text: str, status: Callable[[], str] | None = None) -> Iterator[None]:
        self.done += 1
        self.log(f"  [{self.done}/{self.phases}, {self.elapsed()}] {text}")
        stop = threading.Event()
        ticker = threading.Thread(target=self._tick, args=(status, stop), daemon=True)
        if status is not None:
            ticker.start()
        try:
            yield
        finally:
            stop.set()
            if ticker.is_alive():
                ticker.join()

    def _tick(self, status: Callable[[], str], stop: threading.Event) -> None:
        while not stop.wait(self.every):
            try:
                text = status()
            except Exception as exc:  # a status is a courtesy: never the build's end
                text = f"({exc})"
            self.log(f"      {self.elapsed()}: {text}")
