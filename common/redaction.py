"""Credentials out of log lines and error messages: the values a process holds are blanked wherever they show.

kvlease never logs a credential on purpose (configs are logged through
:meth:`kvlease.common.config.Config.redacted`), but libraries may: botocore's debug
log shows the ``Authorization`` header (the S3 access key id), kazoo's
lowest level the digest it authenticates with, and a library's error message
may quote what it was given. So every component that takes a credential
registers it here (:func:`protect`), and

- :func:`scrub` blanks registered values in a string (error messages sent to
  clients go through it: :func:`kvlease.common.wire.error_pb`, storage errors);
- a log-record factory, installed by the first :func:`protect`, blanks them in
  every record's message and traceback before any handler sees it, whichever
  logger made it.

Registration only adds; values are kept for the life of the process.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Iterable

REDACTED = "<redacted>"
_MIN_LENGTH = 8  # a shorter value (e.g. moto's "testing") would blank ordinary words everywhere

_lock = threading.Lock()
_secrets: tuple[str, ...] = ()  # longest first, so a value containing another is blanked whole
_previous_factory: Any = None


def protect(values: Iterable[str]) -> None:
    """Register credential values (empty and very short ones are ignored) and make sure logs are filtered."""
    global _secrets, _previous_factory
    new = {v for v in values if v and len(v) >= _MIN_LENGTH} - set(_secrets)
    if not new:
        return
    with _lock:
        _secrets = tuple(sorted(set(_secrets) | new, key=len, reverse=True))
        if _previous_factory is None:
            _previous_factory = logging.getLogRecordFactory()
            logging.setLogRecordFactory(_make_record)


def scrub(text: str) -> str:
    """``text`` with every registered credential replaced by :data:`REDACTED`."""
    for value in _secrets:
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def _make_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
    record = _previous_factory(*args, **kwargs)
    if not _secrets:
        return record
    try:
        message = record.getMessage()
    except Exception:  # a bad format: let the handler report it as usual
        return record
    clean = scrub(message)
    if clean != message:
        record.msg, record.args = clean, ()
    if record.exc_info and record.exc_info[0] is not None:
        text = logging.Formatter().formatException(record.exc_info)
        clean = scrub(text)
        if clean != text:
            record.exc_text = clean
    return record
