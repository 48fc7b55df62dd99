"""Mirror a local folder into a storage URL while a job runs, and completely at its end.

Used where replicas cannot write the job dir themselves (memory:// lives in the
submitting process only) and for logs of gs:// jobs. Files are uploaded when their size
or mtime changed since the last pass; files that vanished locally (old checkpoints the
trainer pruned) are removed remotely, but only those this mirror uploaded: the job
record and staged packages in the same job dir are left alone. Readers look for marker
files (`checkpoints/checkpoint`, `model/saved_model.pb`), so those go last in a pass.
"""
from __future__ import annotations

import functools
import logging
import os

from mljob import contracts, storage

log = logging.getLogger(__name__)
MARKERS = contracts.PUBLISH_MARKERS
OWNED_BY_LAUNCHER = ("jobs", "packages")  # the job record and staged packages


class Mirror:
    def __init__(self, local_dir: str, url: str):
        self.local_dir = local_dir
        self.url = url
        self._uploaded: dict[str, tuple[int, int]] = {}

    def _scan(self) -> dict[str, tuple[int, int]]:
        current = {}
        for dirpath, dirnames, names in os.walk(self.local_dir):
            if dirpath == self.local_dir:
                dirnames[:] = [d for d in dirnames if d not in OWNED_BY_LAUNCHER]
            for name in names:
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, self.local_dir)
                if ".tmp-" in rel or ".old-" in rel:
                    continue  # a publish in progress; its final name comes next pass
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    continue
                current[rel] = (st.st_size, st.st_mtime_ns)
        return current

    def sync(self) -> int:
        """One pass; returns how many files were uploaded or removed."""
        current = self._scan()
        changed = [rel for rel, sig in current.items() if self._uploaded.get(rel) != sig]
        changed.sort(key=lambda rel: (os.path.basename(rel) in MARKERS, rel))
        fs, root = storage.filesystem(self.url)
        count = 0
        for rel in changed:
            dst = f"{root.rstrip('/')}/{rel.replace(os.sep, '/')}"
            try:
                storage.retry(functools.partial(fs.put_file, os.path.join(self.local_dir, rel),
                                                dst), f"mirror to {self.url}")
            except FileNotFoundError:
                continue  # removed between the walk and the upload
            self._uploaded[rel] = current[rel]
            count += 1
        for rel in [r for r in self._uploaded if r not in current]:
            dst = f"{root.rstrip('/')}/{rel.replace(os.sep, '/')}"
            try:
                storage.retry(functools.partial(fs.rm_file, dst), f"mirror to {self.url}")
            except FileNotFoundError:
                pass
            del self._uploaded[rel]
            count += 1
        return count

    def seed(self) -> None:
        """Resume: copy what the URL already holds into the local folder first."""
        try:
            if storage.exists(self.url):
                storage.download_tree(self.url, self.local_dir)
        except FileNotFoundError:
            return
        self._uploaded = self._scan()  # already there: no need to upload it back
