"""The one decision of what is secret in a text that leaves the process, and its redaction.

`redacted(text)` is the only function that decides; every place that writes text outside the process goes
through it: the errors' messages (`tamrun.errors`), the log lines of every handler Hydra configures
(`RedactFilter`, put on them by `tamrun.process.hydra_files`), the MLflow params, tags
and text artifacts (`tamrun.tracking.mlflow_run`), Hydra's own files
(`tamrun.process.hydra_files`) and what is handed to Ray (`tamrun.cluster.env`). What it replaces by ``***``:

- the password of a URI, ``scheme://user:password@host``: everything between the user's ``:`` and the
  last ``@`` before the host, ``/``, ``:`` and ``?`` included (``postgresql://u:pa/ss@h/db``), whatever the
  scheme (s3, ftp, http, gs, abfs, hdfs, ...), percent-encoded or not, and also after a path's
  normalisation collapsed its ``//`` (``s3:/user:password@bucket``, what ``Path("s3://...")`` prints);
- a URI's user when it is a token rather than a name (``https://ghp_...@github.com``: `looks_like_credential`);
- the value of a secret-named query parameter or setting, ``?password=...``, ``&token=...``,
  ``AWS_SECRET_ACCESS_KEY=...``, ``password: ...``: a name that contains password, passwd, pwd, secret,
  token, credential, api_key/apikey, access_key, private_key, signature or sig, or is ``key``;
- a password hash as crypt(3) writes it (``$6$salt$hash``, ``$y$...``, ``$2b$...``: a line of /etc/shadow);
- the value of every secret-named environment variable of this process (`secret_name`: MLflow's
  ``MLFLOW_TRACKING_PASSWORD`` and ``MLFLOW_TRACKING_TOKEN``, ``AWS_SECRET_ACCESS_KEY``,
  ``AZURE_STORAGE_CONNECTION_STRING``, ...) wherever it appears, whatever the form around it.

A user name stays (it says whose store it is) unless it looks like a token; so does a host. The redaction is idempotent. The entry
points (``python -m tamrun``, ``python -m tamrun.compare``) run under `redacted_output`, so that what a
library prints itself is redacted too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import traceback
from typing import Any, Dict, Iterable, Iterator, Mapping, Optional

MASK = "***"
SHORTEST_SECRET = 6  # an environment value shorter than this is not searched for (it would mask common words)
# Names that look secret and are not: the shell's working folders (pwd).
NOT_SECRET = frozenset({"PWD", "OLDPWD"})

# A name that holds a secret: in an environment variable, a query parameter or a key: value setting.
_SECRET_WORD = (r"(?:passw(?:or)?d|pwd|secret|token|credentials?|api[_-]?key|apikey|access[_-]?key|"
                r"private[_-]?key|account[_-]?key|signature|connection[_-]?string|sas)")
_SECRET_NAME = re.compile(rf"(?i)(?:^|[_.-]){_SECRET_WORD}(?:$|[_.-])|^(?:key|sig|pass)$|{_SECRET_WORD}$")
# scheme://user:password@ : the password runs to the last '@' before whitespace or a quote, within
# `LONGEST_URI_SECRET` characters. One '/' is enough: a path's normalisation (pathlib) writes s3://u:pw@b as
# s3:/u:pw@b; a ':' may be escaped, as Hydra writes an override's value (http\://u\:pw@h) and JSON that value
# again (http\\://u\\:pw@h). (A scheme's and a password's lengths are bounded: each position of a long text is
# tried a bounded number of times, so that a 1 MB value is redacted in linear time.)
LONGEST_URI_SECRET = 256
_URI_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]{0,31}\\*:/+[^:/@\s'\"\\]*)(?P<sep>\\*:)"
                           rf"(?P<secret>[^\s'\"]{{0,{LONGEST_URI_SECRET}}})@")
# scheme://user@ : a user alone, masked when it is a token (`looks_like_credential`).
_URI_USER = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]{0,31}\\*:/+)(?P<user>[^:/@\s'\"\\]+)@")
# Prefixes of the tokens services issue (GitHub, GitLab, Slack, OpenAI/Stripe, AWS key ids, Google, npm,
# PyPI, Hugging Face): such a word is a credential whatever its length.
_TOKEN_PREFIX = re.compile(r"(?:gh[pousr]_|github_pat_|glpat-|xox[abposr]-|sk-|sk_live_|rk_live_|AKIA|ASIA|AIza|"
                           r"ya29\.|npm_|pypi-|hf_)[A-Za-z0-9_.-]{8,}")
SHORTEST_PASSWORD = 8  # characters: a shorter word is not taken for a password by its look alone
SHORTEST_TOKEN = 16  # characters: a longer word a quarter of whose characters are digits is a token (hex, base36)
# A password hash as crypt(3) writes it (/etc/shadow: $1$, $5$, $6$, $y$ yescrypt, $2b$ bcrypt, $argon2id$, ...).
_CRYPT_HASH = re.compile(r"\$(?:1|2[abxy]?|5|6|7|y|gy|sha1|md5|argon2(?:id|i|d)?|scrypt|pbkdf2[\w-]*)\$[^\s:,;'\"]+")
# ?name=value or &name=value: a URI's query parameter.
_QUERY = re.compile(r"(?P<head>[?&;](?P<name>[^=&#;?\s]+)=)(?P<value>[^&#;\s'\"]*)")
# name=value or name: value where the name is secret (environment lines, YAML, JSON, messages); not a URI's
# scheme (``https://``).
_ASSIGNED = re.compile(r"(?<![A-Za-z0-9_.-])(?P<dashes>-*)(?P<name>[A-Za-z][A-Za-z0-9_.-]*)(?P<sep>\"?[ \t]*[=:](?!//)[ \t]*[\"']?)"
                       r"(?P<value>[^\s&;,'\"\x00}\]]+)")


def secret_name(name: str) -> bool:
    """Whether a variable, parameter or key named ``name`` holds a secret (``MLFLOW_TRACKING_PASSWORD``,
    ``password``, ``AWS_SESSION_TOKEN``, ``key``, ``X-Amz-Signature``, ...)."""
    return name not in NOT_SECRET and bool(_SECRET_NAME.search(name))


def looks_like_credential(word: str) -> bool:
    """Whether ``word`` (no whitespace) looks like a password or a token rather than a name: a service's
    token prefix (``ghp_``, ``glpat-``, ``AKIA``, ...); at least `SHORTEST_PASSWORD` characters mixing
    digits with upper- and lower-case letters, or with a sign other than ``_ . - + %`` (``Tr0ub4dor&3``);
    or at least `SHORTEST_TOKEN` characters of letters and digits, a quarter of them digits (a hex or
    base36 token). A name such as ``alice``, ``temp_2m`` or ``sales_2023`` is not one."""
    if not word or any(char.isspace() for char in word):
        return False
    if _TOKEN_PREFIX.fullmatch(word):
        return True
    digits = sum(char.isdigit() for char in word)
    letters = sum(char.isalpha() for char in word)
    if not digits or not letters:
        return False
    cases = any(char.isupper() for char in word) and any(char.islower() for char in word)
    sign = any(not char.isalnum() and char not in "_.-+%" for char in word)
    return (len(word) >= SHORTEST_PASSWORD and (cases or sign)) or \
        (len(word) >= SHORTEST_TOKEN and digits * 4 >= len(word))


def _secret_values(environ: Mapping[str, str]) -> Iterable[str]:
    """The values of ``environ``'s secret-named variables, longest first (a value inside another is
    masked with it)."""
    values = {value for name, value in environ.items() if secret_name(name) and len(value) >= SHORTEST_SECRET}
    return sorted(values, key=len, reverse=True)


def environment_now() -> Dict[str, str]:
    """``os.environ`` copied: another thread may unset a variable while it is read (MLflow's telemetry
    does), which iterating ``os.environ.items()`` meets as a KeyError; a variable gone meanwhile is left out."""
    copy = {}
    for name in list(os.environ):  # the names at once (a list of the dict's keys), each value read after
        value = os.environ.get(name)
        if value is not None:
            copy[name] = value
    return copy


def redacted(text: str, environ: Optional[Mapping[str, str]] = None) -> str:
    """``text`` with every secret replaced by ``***`` (the module's docstring lists what is secret);
    ``environ`` (default ``os.environ``) gives the secret variables whose values are masked anywhere."""
    if not text:
        return text
    for value in _secret_values(environment_now() if environ is None else environ):
        text = text.replace(value, MASK)
    text = _URI_PASSWORD.sub(lambda m: f"{m.group('head')}{m.group('sep')}{MASK}@", text)
    text = _URI_USER.sub(lambda m: f"{m.group('head')}{MASK}@" if looks_like_credential(m.group("user"))
                         else m.group(0), text)
    text = _CRYPT_HASH.sub(MASK, text)
    text = _QUERY.sub(lambda m: f"{m.group('head')}{MASK}" if secret_name(m.group("name")) and m.group("value")
                      else m.group(0), text)
    return _ASSIGNED.sub(lambda m: f"{m.group('dashes')}{m.group('name')}{m.group('sep')}{MASK}" if secret_name(m.group("name"))
                         else m.group(0), text)


def redacted_value(name: str, value: str) -> str:
    """The value of a param, tag or setting named ``name`` (dotted: its last part counts) as it may be
    written: ``***`` when the name is secret (`secret_name`), else ``value`` redacted."""
    return MASK if value and secret_name(name.rsplit(".", 1)[-1]) else redacted(value)


def redacted_traceback(error: BaseException) -> str:
    """``error``'s traceback as Python prints it, redacted (a message may quote a URI or a file)."""
    return redacted("".join(traceback.format_exception(type(error), error, error.__traceback__)))


class RedactFilter(logging.Filter):
    """A handler's filter that redacts each record's message (arguments merged in) and its exception's
    text before the handler formats it (`tamrun.process.hydra_files` puts it on Hydra's and the job's handlers)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redacted(message)
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = redacted(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redacted(record.exc_text)
        return True


class RedactedStream:
    """A text stream that writes to ``stream`` what it is given, redacted; anything else is ``stream``'s
    (``isatty``, ``fileno``, ``encoding``, ...)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(redacted(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextlib.contextmanager
def redacted_output() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` redacted while the block runs: what a library prints itself
    (Hydra's ``--cfg job``, its warnings and errors, MLflow's links) passes the one redaction too."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactedStream(out), RedactedStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
