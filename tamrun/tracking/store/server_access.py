"""A locked tracking server's refusals, each as one `ConfigError` naming the setting to change and how.

A team's `mlflow server --app-name basic-auth` behind TLS (docs/scale.md) refuses a caller four ways:

- no credentials (HTTP 401): ``MLFLOW_TRACKING_USERNAME`` named, unset;
- a wrong password or an unknown user (HTTP 401): ``MLFLOW_TRACKING_PASSWORD`` named, its value never shown;
- a user whose permission does not allow the call (HTTP 403: READ, or none, on the experiment a job writes):
  ``MLFLOW_TRACKING_USERNAME`` named, with the permission a run needs;
- a certificate the client does not trust: ``MLFLOW_TRACKING_SERVER_CERT_PATH`` named (`check_tls`, a TLS
  handshake with the client's own trust before any call: MLflow's HTTP client retries such a failure for
  minutes).
"""

from __future__ import annotations

import os
import socket
import ssl
from typing import Optional
from urllib.parse import urlsplit

from tamrun.errors import ConfigError
from tamrun.redact import MASK, redacted

USERNAME, PASSWORD, TOKEN = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"
CERT_PATH, INSECURE_TLS = "MLFLOW_TRACKING_SERVER_CERT_PATH", "MLFLOW_TRACKING_INSECURE_TLS"
# requests' own variables for the certificates it trusts when MLflow's CERT_PATH is unset (in its order).
REQUESTS_CA_VARIABLES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
UNAUTHENTICATED, PERMISSION_DENIED = "UNAUTHENTICATED", "PERMISSION_DENIED"  # MLflow's codes for 401, 403
TLS_WORDS = ("CERTIFICATE_VERIFY_FAILED", "SSLCertVerificationError")
CREDENTIALS_FIX = (f"export {USERNAME}=<user> and {PASSWORD}=<password> (an account the server's admin created; "
                   f"or {TOKEN}) before running")
CERT_FIX = (f"export {CERT_PATH}=<the server's certificate, or its CA's, as a PEM file> (the file the server's "
            "admin hands out), or reach the server by a name its certificate holds")


def server_name(uri: str) -> str:
    """``host:port`` of an http(s) URI (for messages: no user, no password)."""
    parts = urlsplit(uri)
    return f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


def trusted_certificates() -> Optional[str]:
    """The PEM file the client trusts, as MLflow's HTTP client (requests) picks it: `CERT_PATH`, else
    requests' variables, else its bundle (certifi); None when `INSECURE_TLS` turns verification off."""
    if os.environ.get(INSECURE_TLS, "").strip().lower() == "true":
        return None
    for name in (CERT_PATH, *REQUESTS_CA_VARIABLES):
        if os.environ.get(name, "").strip():
            return os.environ[name].strip()
    from requests.utils import DEFAULT_CA_BUNDLE_PATH

    return DEFAULT_CA_BUNDLE_PATH


def untrusted(uri: str, reason: str) -> ConfigError:
    """The error for a server certificate the client does not trust (``reason``: the TLS library's)."""
    given = os.environ.get(CERT_PATH, "").strip()
    problem = f"the tracking server {server_name(uri)} presents a certificate this client does not trust ({reason})"
    if given:
        return ConfigError(CERT_PATH, given, f"{problem}: it is not signed by this file's certificates", CERT_FIX)
    return ConfigError("tracking.uri", redacted(uri), f"{problem}; {CERT_PATH} is unset", CERT_FIX)


def check_tls(uri: str, host: str, port: int, connect_timeout_s: float) -> None:
    """Refuse an https server whose certificate the client's trust (`trusted_certificates`) does not
    accept, or a `CERT_PATH` that cannot be read, with a TLS handshake within ``connect_timeout_s``."""
    cafile = trusted_certificates()
    if cafile is None:
        return
    try:
        context = ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(CERT_PATH, cafile, f"the certificate file cannot be read as PEM ({exc})", CERT_FIX) from None
    try:
        with socket.create_connection((host, port), timeout=connect_timeout_s) as sock:
            context.wrap_socket(sock, server_hostname=host).close()
    except ssl.SSLCertVerificationError as exc:
        raise untrusted(uri, exc.verify_message or str(exc)) from None
    except ssl.SSLError as exc:
        raise ConfigError("tracking.uri", redacted(uri), f"no TLS handshake with the tracking server "
                          f"{server_name(uri)} ({exc.reason or exc})",
                          "write http:// for a server without TLS, https:// for one with it") from None
    except OSError as exc:
        raise ConfigError("tracking.uri", redacted(uri), f"the tracking server {server_name(uri)} closed the "
                          f"connection during the TLS handshake ({exc})",
                          "check the URI's port and that the server serves TLS there") from None


def access_error(uri: str, error: BaseException, experiment: Optional[str] = None,
                 needs: str = "EDIT") -> Optional[ConfigError]:
    """The error for a locked server's refusal ``error`` (an MlflowException) of a call about ``experiment``
    that ``needs`` a permission (EDIT: a run written; READ: runs read), by its kind (module doc); None for
    any other error."""
    code = getattr(error, "error_code", None)
    text = str(error)
    if any(word in text for word in TLS_WORDS):
        return untrusted(uri, "certificate verify failed")
    user = os.environ.get(USERNAME, "").strip() or urlsplit(uri).username
    where = f"the tracking server {server_name(uri)}"
    if code == UNAUTHENTICATED:
        if os.environ.get(TOKEN, "").strip():
            return ConfigError(TOKEN, MASK, f"{where} refused the token (HTTP 401)",
                               f"renew {TOKEN}, or use {USERNAME} and {PASSWORD}")
        if not user:
            return ConfigError(USERNAME, "", f"{where} asks for credentials (HTTP 401) and none are given",
                               CREDENTIALS_FIX)
        return ConfigError(PASSWORD, MASK, f"{where} refused the credentials of user {user!r} (HTTP 401: an unknown "
                           "user or a wrong password)", f"check {USERNAME} and {PASSWORD} (the server's admin resets a "
                           "forgotten password)")
    if code == PERMISSION_DENIED:
        what = f"experiment {experiment!r}" if experiment else "this experiment"
        doing, lacking = ("a write", "READ or no permission") if needs == "EDIT" else ("a read", "no permission")
        other = "record in an experiment this user may edit (tracking.experiment=...)" if needs == "EDIT" else \
            "name an experiment this user may read (--experiment)"
        return ConfigError(USERNAME, user or "", f"{where} refused user {user!r} {doing} in {what} (HTTP 403: it "
                           f"needs {needs} on the experiment; this user has {lacking} there)",
                           f"ask the server's admin for {needs} on {what}, or {other}")
    return None
