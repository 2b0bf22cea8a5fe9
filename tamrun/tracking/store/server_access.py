"""A locked tracking server's refusals, each as one `ConfigError` naming the setting to change and how.

A team's `mlflow server --app-name basic-auth` behind TLS (docs/scale.md) refuses a caller these ways:

- no credentials (HTTP 401): ``MLFLOW_TRACKING_USERNAME`` named, unset;
- a wrong password or an unknown user (HTTP 401): ``MLFLOW_TRACKING_PASSWORD`` named, its value never shown;
- a user whose permission does not allow the call (HTTP 403: READ, or none, on the experiment a job writes;
  no EDIT on a registered model another user made): ``MLFLOW_TRACKING_USERNAME`` named, with the
  permission the call needs (`register_refused`: tamrun's own refusal of ``--register`` before the call);
- a Host header the server's ``--allowed-hosts`` does not list (HTTP 403 "Invalid Host header"): the URI
  named, with the name to add there;
- a certificate the client does not trust (`check_tls`, a TLS handshake with the client's own trust before
  any call: MLflow's HTTP client retries such a failure for minutes), named by its cause (`tls_refusal`):
  a certificate for other names than the URI's, an expired (or not yet valid) one, or one not signed by
  what ``MLFLOW_TRACKING_SERVER_CERT_PATH`` holds.
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
# OpenSSL's verification results (ssl.SSLCertVerificationError.verify_code) named by their cause, and its flag
# X509_V_FLAG_NO_CHECK_TIME (a chain verified without its dates: to read an expired certificate's).
NOT_YET_VALID, EXPIRED, NAME_MISMATCH = 9, 10, (62, 64)  # 62: a host name, 64: an IP address
NO_CHECK_TIME = 0x200000
INVALID_HOST = "Invalid Host header"  # MLflow's 403 for a Host its --allowed-hosts does not list
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
        raise tls_refusal(uri, (host, port, cafile, connect_timeout_s), exc) from None
    except ssl.SSLError as exc:
        raise ConfigError("tracking.uri", redacted(uri), f"no TLS handshake with the tracking server "
                          f"{server_name(uri)} ({exc.reason or exc})",
                          "write http:// for a server without TLS, https:// for one with it") from None
    except OSError as exc:
        raise ConfigError("tracking.uri", redacted(uri), f"the tracking server {server_name(uri)} closed the "
                          f"connection during the TLS handshake ({exc})",
                          "check the URI's port and that the server serves TLS there") from None


def presented_certificate(host: str, port: int, cafile: str, timeout_s: float, relax: str) -> dict:
    """The server's certificate as `ssl` decodes it, from a second handshake that checks everything but
    the check that failed (``relax``: "name" or "dates"); {} when that one fails too."""
    context = ssl.create_default_context(cafile=cafile)
    if relax == "name":
        context.check_hostname = False
    else:
        context.verify_flags |= NO_CHECK_TIME
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            with context.wrap_socket(sock, server_hostname=host) as tls:
                return tls.getpeercert() or {}
    except (OSError, ssl.SSLError):
        return {}


def certificate_date(certificate: dict, key: str) -> str:
    """The certificate's ``notAfter`` or ``notBefore`` as an ISO date and time (UTC); '?' when absent."""
    import datetime

    if key not in certificate:
        return "?"
    moment = datetime.datetime.fromtimestamp(ssl.cert_time_to_seconds(certificate[key]), datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def tls_refusal(uri: str, address: tuple, error: ssl.SSLCertVerificationError) -> ConfigError:
    """The error for a certificate the handshake refused, by its cause (``error.verify_code``): a
    certificate for other names than the URI's, one out of its dates, else one the trust does not hold
    (`untrusted`). ``address``: (host, port, the trusted PEM file, the timeout)."""
    host, port = address[0], address[1]
    reason = error.verify_message or str(error)
    where = f"the tracking server {server_name(uri)}"
    if error.verify_code in NAME_MISMATCH:
        names = [name for kind, name in presented_certificate(*address, "name").get("subjectAltName", ())
                 if kind in ("DNS", "IP Address")]
        held = f"a certificate for {', '.join(names)}" if names else "a certificate for other names"
        return ConfigError("tracking.uri", redacted(uri), f"{where} presents {held}, not for {host!r}, the name the "
                           f"URI gives (TLS: {reason})", "reach the server by a name its certificate holds"
                           + (f" (https://{names[0]}:{port})" if names else "") + f", or have the server's admin issue "
                           f"a certificate that names {host} (and list {host}:{port} in its --allowed-hosts)")
    if error.verify_code == EXPIRED:
        expired = certificate_date(presented_certificate(*address, "dates"), "notAfter")
        return ConfigError("tracking.uri", redacted(uri), f"{where} presents a certificate that expired on {expired} "
                           f"(TLS: {reason})", "the server's admin renews the certificate and restarts the server (a "
                           f"self-signed one: and hands the new file out for {CERT_PATH})")
    if error.verify_code == NOT_YET_VALID:
        start = certificate_date(presented_certificate(*address, "dates"), "notBefore")
        return ConfigError("tracking.uri", redacted(uri), f"{where} presents a certificate valid only from {start} "
                           f"(TLS: {reason})", "check this machine's clock (date -u); if it is right, the server's "
                           "admin reissues the certificate starting now")
    return untrusted(uri, reason)


def access_error(uri: str, error: BaseException, experiment: Optional[str] = None, needs: str = "EDIT",
                 model: Optional[str] = None) -> Optional[ConfigError]:
    """The error for a locked server's refusal ``error`` (an MlflowException) of a call about ``experiment``
    that ``needs`` a permission (EDIT: a run written; READ: runs read), or of a write to the registered
    model ``model``, by its kind (module doc); None for any other error."""
    code = getattr(error, "error_code", None)
    text = str(error)
    if any(word in text for word in TLS_WORDS):
        return untrusted(uri, "certificate verify failed")
    user = os.environ.get(USERNAME, "").strip() or urlsplit(uri).username
    where = f"the tracking server {server_name(uri)}"
    if code == UNAUTHENTICATED:
        return unauthenticated(where, user)
    if code != PERMISSION_DENIED:
        return None
    if INVALID_HOST in text:
        return ConfigError("tracking.uri", redacted(uri), f"{where} refused the Host header {server_name(uri)!r} "
                           f"(HTTP 403 {INVALID_HOST!r}: the server answers only the host names its --allowed-hosts "
                           "lists, its guard against DNS rebinding)", f"the server's admin adds {server_name(uri)} to "
                           "the server's --allowed-hosts, or reach it by a name listed there")
    if model is not None:
        return register_refused(uri, user or "", f"registered model {model!r}", None, model, "adding a version to it")
    what = f"experiment {experiment!r}" if experiment else "this experiment"
    doing, lacking = ("a write", "READ or no permission") if needs == "EDIT" else ("a read", "no permission")
    other = "record in an experiment this user may edit (tracking.experiment=...)" if needs == "EDIT" else \
        "name an experiment this user may read (--experiment)"
    return ConfigError(USERNAME, user or "", f"{where} refused user {user!r} {doing} in {what} (HTTP 403: it "
                       f"needs {needs} on the experiment; this user has {lacking} there)",
                       f"ask the server's admin for {needs} on {what}, or {other}")


def unauthenticated(where: str, user: Optional[str]) -> ConfigError:
    """The error for a 401 of the server ``where``: no credentials, a refused token, or a refused user."""
    if os.environ.get(TOKEN, "").strip():
        return ConfigError(TOKEN, MASK, f"{where} refused the token (HTTP 401)",
                           f"renew {TOKEN}, or use {USERNAME} and {PASSWORD}")
    if not user:
        return ConfigError(USERNAME, "", f"{where} asks for credentials (HTTP 401) and none are given",
                           CREDENTIALS_FIX)
    return ConfigError(PASSWORD, MASK, f"{where} refused the credentials of user {user!r} (HTTP 401: an unknown "
                       "user or a wrong password)", f"check {USERNAME} and {PASSWORD} (the server's admin resets a "
                       "forgotten password)")


def register_refused(uri: str, user: str, what: str, has: Optional[str], model: str, doing: str) -> ConfigError:
    """The error for ``--register`` by ``user``, whose permission ``has`` (None: the server refused with
    403) on ``what`` (an experiment, a registered model) is below the EDIT that ``doing`` needs (docs/scale.md,
    "What READ users may do in the model registry")."""
    told = f"user {user!r} has {has} on {what}" if has else f"user {user!r} was refused (HTTP 403) {what}"
    return ConfigError(USERNAME, user, f"on the tracking server {server_name(uri)} {told}; {doing} needs EDIT "
                       "there (nothing was registered)", f"ask the server's admin (or a user with MANAGE on "
                       f"{what}) for EDIT on {what}, or register under a name of your own (--register "
                       "<another name>)" if what.startswith("registered") else f"ask the server's admin for EDIT on "
                       f"{what}, or have a user who may EDIT it register the model")
