"""What the base image's first build shows while it works (submit.local.build_progress):
the cost of a first build on its first line, a line per phase, and while a phase runs
long, what it has done (Debian packages from debootstrap's own lines, the bytes in the
cache folders). The build itself runs in tests/e2e/test_containers.py (slow)."""
from __future__ import annotations

import threading

from submit.local import build_progress as bp

# debootstrap's own lines (1.0.128, --variant=minbase), as it prints them
DEBOOTSTRAP = """\
I: Retrieving InRelease
I: Checking Release signature
I: Valid Release signature (key id 4D64FEC119C2029067D6E791F8D2585B8783D481)
I: Retrieving Packages
I: Validating Packages
I: Resolving dependencies of required packages...
I: Resolving dependencies of base packages...
I: Checking component main on http://deb.debian.org/debian...
I: Retrieving adduser 3.134
I: Validating adduser 3.134
I: Retrieving apt 2.6.1
I: Validating apt 2.6.1
I: Chosen extractor for .deb packages: dpkg-deb
I: Extracting adduser...
I: Extracting apt...
I: Installing required packages...
I: Unpacking required packages...
I: Unpacking adduser...
I: Configuring required packages...
I: Configuring adduser...
I: Base system installed successfully.
"""


def test_debootstraps_lines_count_the_packages_it_fetched_and_unpacked(tmp_path):
    (tmp_path / "adduser_3.134_all.deb").write_bytes(b"x" * 1_500_000)
    deb = bp.Debootstrap()
    assert deb.status(str(tmp_path)).startswith("Debian packages: none yet")
    for line in DEBOOTSTRAP.splitlines()[:6]:
        deb.feed(line)
    assert deb.status(str(tmp_path)).endswith("now resolving dependencies)")
    for line in DEBOOTSTRAP.splitlines()[6:10]:
        deb.feed(line)
    assert deb.counts == {"retrieving": 1, "validating": 1}   # not the index files
    assert deb.status(str(tmp_path)) == ("Debian packages: 1 retrieving, 1 validating "
                                         "(1.5 MB in the cache; now validating adduser)")
    for line in DEBOOTSTRAP.splitlines()[10:]:
        deb.feed(line)
    assert deb.counts == {"retrieving": 2, "validating": 2, "extracting": 2,
                          "unpacking": 1, "configuring": 1}


def test_wheels_are_counted_with_their_bytes(tmp_path):
    (tmp_path / "a-1-py3-none-any.whl").write_bytes(b"x" * 2_000_000)
    (tmp_path / "b-1-py3-none-any.whl").write_bytes(b"x" * 500_000)
    assert bp.wheels_status(str(tmp_path)) == "wheels: 2 files, 2.5 MB"


def test_each_phase_has_a_line_and_a_long_one_says_what_it_did():
    lines: list[str] = []
    now = [100.0]
    said = threading.Event()

    def log(text):
        lines.append(text)
        if "so far" in text:
            said.set()

    progress = bp.Progress(log, phases=2, every=0.05, clock=lambda: now[0])
    with progress.phase("fetching", lambda: "so far: 3 packages"):
        now[0] += 42
        assert said.wait(30)
    with progress.phase("importing"):
        pass
    assert lines[0] == "  [1/2, 0 s] fetching"
    assert lines[1] == "      42 s: so far: 3 packages"
    assert lines[-1] == "  [2/2, 42 s] importing"
    assert "3 to 16 minutes" in bp.FIRST_BUILD and "400 MB" in bp.FIRST_BUILD
