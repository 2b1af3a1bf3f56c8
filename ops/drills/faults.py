"""The faults several drills make and undo: the remote storage taken away, a process paused.

:class:`RemoteOutage` takes a ``file://`` remote storage away: the machine
may run as root, so permissions cannot break a directory; the remote root is
swapped, atomically (``renameat2(RENAME_EXCHANGE)``), with a plain file.
Every path under it then fails (ENOTDIR) for every process, and swapping
back restores it as it was; :meth:`RemoteOutage.restore_interrupted` undoes
an outage a killed drill left behind. :func:`paused` holds a process with
SIGSTOP (a GC pause, or a partition) and SIGCONTs it on leaving, also on an
error. Used by the remote-outage, tablet-failover and chaos drills.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import urllib.parse
from pathlib import Path
from typing import Iterator

from kvlease.common.storage import FileStorage
from kvlease.ops.drills.cluster import ClusterShapeError
from kvlease.ops.drills.lease_layout import LEASE_FILES

ASIDE = ".remote-outage"  # suffix of the real directory's name during an outage
RENAME_EXCHANGE = 2
AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        if code in (errno.EINVAL, errno.ENOSYS):
            raise ClusterShapeError(f"the file system of {a} cannot swap two paths atomically "
                                    f"(renameat2 RENAME_EXCHANGE): {os.strerror(code)}")
        raise OSError(code, f"cannot swap {a} and {b}: {os.strerror(code)}")


class RemoteOutage:
    """The remote root swapped with a plain file while active; ``real`` is where its files are then."""

    def __init__(self, remote_uri: str) -> None:
        self.root = Path(urllib.parse.unquote(urllib.parse.urlparse(remote_uri).path))
        self.aside = self.root.with_name(self.root.name + ASIDE)
        self.active = False

    @property
    def real(self) -> Path:
        return self.aside if self.active else self.root

    def restore_interrupted(self) -> bool:
        """Swap back an outage a killed drill left behind; True if there was one."""
        if self.aside.is_dir() and self.root.is_file():
            _exchange(self.root, self.aside)
            self.aside.unlink()
            return True
        return False

    def begin(self) -> None:
        self.aside.write_text(f"kvlease drill remote-outage: the remote storage is away; its files are in {self.aside}\n")
        try:
            _exchange(self.root, self.aside)
        except BaseException:
            self.aside.unlink()
            raise
        self.active = True

    def end(self) -> None:
        if self.active:
            _exchange(self.root, self.aside)
            self.active = False
            self.aside.unlink()

    def lease_files(self) -> list[str]:
        return FileStorage(self.real.as_uri(), fsync=False).list(LEASE_FILES)


@contextlib.contextmanager
def paused(pid: int) -> Iterator[None]:
    """Process ``pid`` stopped (SIGSTOP) inside the ``with`` block, continued (SIGCONT) when it is left."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
