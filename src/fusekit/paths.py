"""Where fusekit keeps its caches, and how every cache file is written.

One folder, one way to write, one way to lock, shared by every part (``hw``, ``search``,
``stitch``), so that this module sits below all of them::

    cache_dir()                 platformdirs' user cache folder of "fusekit":
                                $XDG_CACHE_HOME/fusekit on Linux (~/.cache/fusekit when unset)
    cache_dir("stitch")         a subfolder of it
    write_atomic(path, text)    a temporary file in the same folder, then os.replace: a reader
                                sees the old file or the new one, never half of one
    locked(path)                an exclusive lock on ``path.lock`` (filelock) held across a
                                read-merge-write of ``path`` by several processes
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import filelock
import platformdirs

APP = "fusekit"


def cache_dir(*parts: str) -> Path:
    """The cache folder of fusekit (not created), or a subfolder of it.

    Args:
        parts: subfolder or file names below the folder.

    Returns:
        ``platformdirs.user_cache_dir("fusekit") / parts...``, which honours ``XDG_CACHE_HOME``
        on Linux.
    """
    return Path(platformdirs.user_cache_dir(APP, appauthor=False)).joinpath(*parts)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename.

    Args:
        path: the file; its folder is created when missing.
        text: the whole new content.

    Raises:
        OSError: the folder or the file cannot be written (the temporary file is removed).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive inter-process lock on ``path`` (a side file ``path.lock``).

    Args:
        path: the file the lock protects; its folder is created when missing.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(path.with_name(path.name + ".lock"))):
        yield
