"""Where a secret may stand in a config: only where the one redaction masks it whole, whatever its value.

A secret-named environment variable's value (`tamrun.redact.secret_name`: ``AWS_SECRET_ACCESS_KEY``,
``MLFLOW_TRACKING_PASSWORD``, ...), interpolated (``${oc.env:NAME}``) or typed as it is, may stand only as
a URI's password (``tracking.uri=postgresql://u:${oc.env:DB_PASSWORD}@h/db``), a secret-named parameter's
value (``?password=...``) or the value of a secret-named key (``hydra.job.env_set.MLFLOW_TRACKING_PASSWORD``):
places `tamrun.redact.redacted` masks by their form. Anywhere else (the experiment's or the run's name, a
path, a folder of Hydra's, any other setting) it would be written in clear: a name is the store's key and
is shown to everyone who reads it, and a secret shorter than `tamrun.redact.SHORTEST_SECRET` is not masked
by its value at all. `check_secret_sources` makes it a `ConfigError` naming the field and the variable,
before anything is written (run by `tamrun.process.hydra_files` as a run or sweep starts, before Hydra
makes its folder, and by `tamrun.config.load.typed_config` for each job). `check_no_secret` refuses the
same way a secret of any form in a setting MLflow keeps in clear (the experiment's name, the artifact root).
"""

from __future__ import annotations

import itertools
import os
import re
from typing import Any, Iterable, Iterator, Mapping, Optional, Tuple

from omegaconf import DictConfig, ListConfig, OmegaConf

from tamrun.errors import ConfigError
from tamrun.redact import SHORTEST_SECRET, redacted, secret_name

# ${oc.env:NAME}, ${oc.env:NAME,default}, ${oc.env:'NAME'}: the variable an interpolation reads.
ENV_INTERPOLATION = re.compile(r"oc\.env\s*:\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)")
# Hydra's copies of the command line and its own state: the fields they set are checked themselves.
NOT_CHECKED = ("hydra.overrides", "hydra.runtime", "hydra.job.override_dirname")


def string_leaves(node: Any, raw: Any, prefix: str = "") -> Iterator[Tuple[str, str, Optional[str]]]:
    """(dotted key, text as written, resolved text or None when it cannot be resolved here) of every
    string leaf of the config ``node``; ``raw``: the same node unresolved (`OmegaConf.to_container`)."""
    items = raw.items() if isinstance(raw, dict) else enumerate(raw) if isinstance(raw, list) else ()
    for key, written in items:
        name = f"{prefix}[{key}]" if isinstance(raw, list) else f"{prefix}.{key}" if prefix else str(key)
        if name.startswith(NOT_CHECKED):
            continue
        try:
            child = node[key]
        except Exception:  # an interpolation that cannot be resolved here (its own error, or Hydra's later)
            child = None
        if isinstance(written, (dict, list)):
            if isinstance(child, (DictConfig, ListConfig)):
                yield from string_leaves(child, written, name)
        elif isinstance(written, str):
            yield name, written, None if child is None else str(child)


def secret_source(key: str, written: str, value: Optional[str], environ: Mapping[str, str]) -> Optional[str]:
    """The secret variable whose value the field ``key`` holds where the redaction would not mask it
    (module doc), or None."""
    if value is None or secret_name(key.rsplit(".", 1)[-1]):
        return None
    named = {name for name in ENV_INTERPOLATION.findall(written) if secret_name(name)}
    named |= {name for name, secret in environ.items()
              if secret_name(name) and len(secret) >= SHORTEST_SECRET and secret in value}
    unmasked = redacted(value, environ={})
    return next((name for name in sorted(named) if environ.get(name) and environ[name] in unmasked), None)


def override_leaves(overrides: Iterable[str]) -> Iterator[Tuple[str, str, Optional[str]]]:
    """`string_leaves` of every value the command line's ``overrides`` give, each choice of a sweep's
    (``tracking.run_name=${oc.env:X},b``: a multirun's composed config holds none of them)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for override in OverridesParser.create().parse_overrides(list(overrides)):
        if override.is_delete():
            continue
        try:
            values = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
        except Exception:  # a sweep that cannot be enumerated (interval, glob): no string of its own
            continue
        for value in values:
            node = OmegaConf.create({"value": value})
            for _, written, resolved in string_leaves(node, OmegaConf.to_container(node, resolve=False)):
                yield override.key_or_group, written, resolved


def check_secret_sources(cfg: Any, environ: Optional[Mapping[str, str]] = None) -> None:
    """Refuse a secret environment variable's value anywhere but a URI's password or a secret-named
    setting (module doc): a `ConfigError` naming the first such field and the variable. With Hydra's node
    (a run's or sweep's start), the command line's sweep choices too (`override_leaves`)."""
    if not isinstance(cfg, DictConfig):
        return
    environ = os.environ if environ is None else environ
    leaves = string_leaves(cfg, OmegaConf.to_container(cfg, resolve=False))
    overrides = OmegaConf.select(cfg, "hydra.overrides.task", default=None)  # as written: not resolved
    written_overrides = OmegaConf.to_container(overrides, resolve=False) if overrides is not None else []
    for key, written, value in itertools.chain(leaves, override_leaves(written_overrides)):
        name = secret_source(key, written, value, environ)
        if name is not None:
            raise ConfigError(key, written, f"it takes the value of the secret environment variable {name}, and "
                              f"{key} is written in clear (to the tracking store, the run's artifacts, Hydra's files or a "
                              "folder's name): a secret may stand only as a URI's password or a secret-named "
                              "setting, where it is masked",
                              f"give {key} a value of its own (the secret stays in {name}, read where it is needed)")


def check_no_secret(field: str, value: Optional[str], where: str, fix: str) -> None:
    """Refuse ``value`` of ``field`` when it holds a secret in any form (`tamrun.redact.redacted` would mask
    part of it): MLflow keeps it in clear ``where``."""
    if value and redacted(value) != value:
        raise ConfigError(field, value, f"it holds a secret (a password, a token or a secret environment "
                          f"variable's value), which MLflow would keep in clear {where}", fix)
