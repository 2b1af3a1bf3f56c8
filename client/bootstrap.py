"""Coordinator addresses as callers give them: ``host:port[,host:port…]``, checked before any call."""

from __future__ import annotations

import ipaddress
import os
import re
from typing import Sequence

from kvlease.common import errors

#: HOST:PORT with a host name, an IPv4 address or a bracketed IPv6 address.
_ADDRESS = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})")


def parse_bootstrap(bootstrap: str | Sequence[str]) -> list[str]:
    """``host:port[,host:port…]`` (or a list of them) -> the addresses; InvalidRequestError naming a
    malformed one (port 0 is a placeholder some callers use with ``locate``)."""
    addresses = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    addresses = [a.strip() for a in addresses if a.strip()]
    if not addresses:
        raise errors.InvalidRequestError("no coordinator address given (use --bootstrap host:port or --cluster DIR)")
    for address in addresses:
        m = _ADDRESS.fullmatch(address)
        if m is None or int(m.group(2)) > 65535:
            raise errors.InvalidRequestError(f"bad coordinator address {errors.show(address)}: expected HOST:PORT "
                                             "(port 1-65535), several separated by commas")
    return addresses


def refuse_path(bootstrap) -> None:
    """InvalidRequestError naming ``connect(cluster=…)`` if ``bootstrap`` is a path (a cluster directory)."""
    if isinstance(bootstrap, os.PathLike) or (isinstance(bootstrap, str) and ("/" in bootstrap or
                                                                             os.path.isdir(bootstrap))):
        path = os.fspath(bootstrap)
        raise errors.InvalidRequestError(
            f"AdminClient({errors.show(path)}): a path, not coordinator addresses: for a cluster directory use "
            f"kvlease.connect(cluster={path!r}).admin; AdminClient takes 'HOST:PORT[,HOST:PORT…]'")



def is_loopback(address: str) -> bool:
    """Whether ``HOST:PORT`` names this machine's loopback (127.0.0.0/8, ::1, localhost)."""
    host = address.rsplit(":", 1)[0].strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
