"""What a user of the source reads of an error: one line, kvlease's (docs/spark.md, "Options").

Spark puts the traceback of a source's error in the exception it raises. An
option error (:class:`~kvlease.spark_source.options.OptionError`) is the
user's to fix, not the parser's insides: :func:`option_errors` raises it
with none of the frames it came through below the method Spark called.
"""

from __future__ import annotations

import functools

from kvlease.spark_source.options import OptionError


def option_errors(method):
    """``method`` raising an :class:`OptionError` without the frames it came through."""
    @functools.wraps(method)
    def checked(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except OptionError as exc:
            raise exc.with_traceback(None) from None
    return checked
