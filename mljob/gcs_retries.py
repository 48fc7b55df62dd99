"""gcsfs's own retries of each HTTP request, capped at MLJOB_STORAGE_REQUEST_RETRIES
(read when `mljob.storage` is imported), so that `mljob.storage.retry` holds the whole
budget (docs/reliability.md)."""
from __future__ import annotations

import logging
import os

log = logging.getLogger("mljob.storage")


def cap_request_retries() -> None:
    """Make every HTTP request of gcsfs be tried at most MLJOB_STORAGE_REQUEST_RETRIES
    times (gcsfs fixes 6 when its classes are defined).

    gcsfs retries with a decorator on private methods, and which class defines them
    varies between versions (its extended filesystem overrides the download methods and
    calls the decorated ones through `super()`), so every class gcsfs may register for
    gs:// is searched and each retried method is decorated again, in the class that
    defines it, with the capped count. A subclass would leave the methods reached
    through `super()` uncapped."""
    tries = max(int(os.environ["MLJOB_STORAGE_REQUEST_RETRIES"]), 1)
    try:
        import gcsfs
        import gcsfs.core
        from gcsfs.retry import retry_request
    except ImportError:
        return
    loop = getattr(retry_request, "__wrapped__", None)  # the loop the decorator runs
    classes = [gcsfs.GCSFileSystem, gcsfs.core.GCSFileSystem]
    try:
        from gcsfs.extended_gcsfs import ExtendedGcsFileSystem
        classes.append(ExtendedGcsFileSystem)
    except ImportError:
        pass
    capped = 0
    for klass in {k for cls in classes for k in cls.__mro__}:
        for name, method in list(vars(klass).items()):
            if loop is not None and _retried_by(method, loop):
                setattr(klass, name, retry_request(retries=tries)(method.__wrapped__))
                capped += 1
    if not capped:
        log.warning("storage: MLJOB_STORAGE_REQUEST_RETRIES is ignored: this gcsfs "
                    "version retries in a way mljob does not know")


def _retried_by(method, loop) -> bool:
    """True for a function wrapped by gcsfs's retry decorator (the `decorator` package
    keeps the loop it calls in the wrapper's closure)."""
    if not callable(method) or getattr(method, "__wrapped__", None) is None:
        return False
    cells = getattr(method, "__closure__", None) or ()
    for cell in cells:
        try:
            if cell.cell_contents is loop:
                return True
        except ValueError:  # an empty cell
            continue
    return False
