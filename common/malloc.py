"""The C allocator's settings of a server process (glibc ``mallopt``; elsewhere nothing happens).

glibc gives threads that allocate at the same time their own arenas, up to 8
per core. A buffer freed in an arena stays there for that arena's next
allocations: a tablet server whose many gRPC and read-ahead threads each
build and free multi-MB scan batches ends up holding a batch or two of freed
memory per arena, and its RSS grows with the number of threads, not with the
work in hand. Capping the arenas lets every thread reuse the same freed
batches (the GIL serializes most allocations anyway, so they hardly contend).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_ARENA_MAX = -8  # glibc malloc.h


def limit_arenas(count: int) -> bool:
    """Cap the malloc arenas of threads created from now on at ``count`` (0: leave glibc's default).

    Returns whether the cap is in place (False where the C library is not glibc).
    """
    if count <= 0:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        log.debug("no mallopt in this C library: malloc arenas not capped")
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt(M_ARENA_MAX, count) == 1
