"""The log follower `jobs stream-logs` and the console read with: a big log is read in
bounded pieces from where the last read ended (a 400 MB job log took the console from
46 MB to 1.1 GB when each file was read whole), a character split between two pieces is
decoded whole, and a line with no end is passed on in bounded pieces."""
from __future__ import annotations

import tracemalloc

from submit import logs


def test_a_big_log_is_followed_in_bounded_pieces(tmp_path):
    line = "INFO\t2026-11-28 12:00:00 +0000\tmaster-replica-0\t" + "x" * 60 + "é"
    count = 12 * (1 << 20) // (len(line.encode()) + 1)  # about 12 MB
    with open(tmp_path / "master-replica-0.log", "w", encoding="utf-8") as f:
        f.write((line + "\n") * count)
    long = "y" * (3 * logs.MAX_LINE + 5)  # no end: a writer still on it, or no newline
    (tmp_path / "worker-replica-0.log").write_text("short\n" + long)
    tracemalloc.start()
    try:
        seen = bad = 0
        pieces = []
        for text in logs.follow(str(tmp_path), done=lambda: True):
            if text.startswith("INFO"):
                seen += 1
                bad += text != line
            else:
                pieces.append(len(text))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (seen, bad) == (count, 0)  # every line, each `é` whole across piece edges
    assert pieces == [5, logs.MAX_LINE, logs.MAX_LINE, logs.MAX_LINE]
    assert peak < 12 * (1 << 20), f"peak {peak / (1 << 20):.1f} MiB for a 12 MB log"
