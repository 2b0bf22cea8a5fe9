"""Credentials in tracking URIs never reach the store, the logs or the config artifacts.

A database or server URI may carry a password (``postgresql://user:password@host/db``). `masked`
replaces the password of every such URI in a text by ``***`` (the user name stays: it tells whose
store it is); `TrackedRun` passes every param, tag and text artifact through it, and the store's
errors and log lines show URIs masked. `env_uri` reads the URI of ``tracking=server`` from an
environment variable, so that it is never written in a config.
"""

from __future__ import annotations

import os
import re

from tamrun.errors import ConfigError

MASK = "***"
# scheme://user:password@ : the password is anything up to the last '@' before the host part.
_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*):(?P<secret>[^\s/]*)@")


def masked(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` replaced by ``***``."""
    return _CREDENTIALS.sub(lambda m: f"{m.group('head')}:{MASK}@", text)


def env_uri(variable: str) -> str:
    """The tracking URI held by the environment variable ``variable`` (``tracking.uri_env``)."""
    value = os.environ.get(variable, "").strip()
    if not value:
        raise ConfigError("tracking.uri_env", variable, f"the environment variable {variable} is unset or empty",
                          f"export {variable}=http://tracking-host:5000 (the team's tracking server) before "
                          "running, or set tracking.uri (e.g. tracking=mlflow for the local sqlite store)")
    return value
