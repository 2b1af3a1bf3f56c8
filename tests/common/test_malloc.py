"""common/malloc.py: the arena cap is set through glibc's mallopt (this test machine runs glibc)."""

import platform

import pytest

from kvlease.common.malloc import limit_arenas


def test_arena_cap_is_set_on_glibc_and_zero_leaves_the_default():
    assert limit_arenas(0) is False
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc")
    assert limit_arenas(8) is True  # glibc's own default on this 2-core machine would be 16; any test may run later
