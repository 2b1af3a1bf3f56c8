"""fsync by path: a file's bytes, or a directory's entries (a file created, renamed or removed in it), stay
after a crash."""

from __future__ import annotations

import os


def fsync_path(path: str) -> None:
    """fsync the file or directory ``path``. OSError as raised."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
