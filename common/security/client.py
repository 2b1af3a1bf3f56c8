"""The credentials a client presents: from config, and the cluster's own for its internal calls."""

from __future__ import annotations

from kvlease.common import config as cfg


def credentials(config: cfg.Config) -> tuple[str, str] | None:
    """``(username, password)`` a client sends on every call, or None (security off, or identified by its
    mutual-TLS certificate). A username without a password is a ConfigError naming the key."""
    if not config[cfg.SECURITY_ENABLED]:
        return None
    user, password = config[cfg.SECURITY_USERNAME], config[cfg.SECURITY_PASSWORD]
    if not user:
        return None
    if not password:
        raise cfg.ConfigError(f"config key {cfg.SECURITY_USERNAME.name!r} is set but {cfg.SECURITY_PASSWORD.name!r} "
                              f"is not (env {cfg.SECURITY_PASSWORD.env_var})", key=cfg.SECURITY_PASSWORD.name)
    return user, password


def internal_credentials(config: cfg.Config) -> tuple[str, str] | None:
    """The cluster's own credentials (None: security off, or mutual TLS with the node certificate)."""
    if not config[cfg.SECURITY_ENABLED] or not config[cfg.INTERNAL_PASSWORD]:
        return None
    return config[cfg.INTERNAL_USERNAME], config[cfg.INTERNAL_PASSWORD]


def internal_client_config(config: cfg.Config) -> cfg.Config:
    """``config`` as a client of the cluster's own principal (a tablet server's calls to the coordinator)."""
    if not config[cfg.SECURITY_ENABLED]:
        return config
    return config.with_overrides({cfg.SECURITY_USERNAME.name: config[cfg.INTERNAL_USERNAME],
                                  cfg.SECURITY_PASSWORD.name: config[cfg.INTERNAL_PASSWORD]})
