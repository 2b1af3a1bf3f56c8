"""Classes composed of parts: the owner delegates to each part method by method, showing the part's text.

An owner (e.g. :class:`kvlease.client.admin.AdminClient`, :class:`kvlease.tablet.bucket.store.BucketStore`) holds its parts
and calls them from methods of its own; :func:`documented_by` gives such a method the docstring of the
part's method it calls, so the text is written once, next to the code it describes.
"""

from __future__ import annotations

import functools
from typing import Callable


def documented_by(part_method: Callable) -> Callable[[Callable], Callable]:
    """Give the decorated delegating method ``part_method``'s docstring (the one text, in the part's module)."""
    def decorate(method: Callable) -> Callable:
        method.__doc__ = part_method.__doc__
        return method
    return decorate


def delegate(part: str, part_method: Callable) -> Callable:
    """A method of the owner that calls ``part_method`` on its part ``self.<part>``, with that method's name,
    docstring and signature (for a part method whose keyword arguments the owner would only copy)."""
    @functools.wraps(part_method)
    def call(self, *args, **kwargs):
        return getattr(getattr(self, part), part_method.__name__)(*args, **kwargs)
    return call
