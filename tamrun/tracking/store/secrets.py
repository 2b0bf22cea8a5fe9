"""A tracking URI kept out of the config: `env_uri` reads the URI of ``tracking=server`` from an
environment variable, so that it is never written in a config (what is secret in a text, and its
redaction wherever text leaves the process, is `tamrun.redact`).
"""

from __future__ import annotations

import os

from tamrun.errors import ConfigError


def env_uri(variable: str) -> str:
    """The tracking URI held by the environment variable ``variable`` (``tracking.uri_env``)."""
    value = os.environ.get(variable, "").strip()
    if not value:
        raise ConfigError("tracking.uri_env", variable, f"the environment variable {variable} is unset or empty",
                          f"export {variable}=http://tracking-host:5000 (the team's tracking server) before "
                          "running, or set tracking.uri (e.g. tracking=mlflow for the local sqlite store)")
    return value
