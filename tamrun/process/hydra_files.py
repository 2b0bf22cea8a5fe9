"""What Hydra writes for a job and a sweep, redacted: its own files (private to their owner) and its logs.

Hydra writes a job's composed config, its own config and the command line's overrides to
``<output dir>/.hydra/{config,hydra,overrides}.yaml`` before the job starts, and a sweep's config to
``<sweep dir>/multirun.yaml``, in clear and readable by all (0644): a password given on the command line
(``tracking.uri=postgresql://user:pw@host/db``) or held by a secret environment variable would stay there.
`RedactedHydraFiles`, a Hydra callback listed first in conf/config.yaml, rewrites each of them through
`tamrun.redact.redacted` and makes it 0600 as the job starts (Hydra has just written them) and as the sweep
ends. It also puts `tamrun.redact.RedactFilter` on every log handler Hydra configured (`filter_handlers`:
its own logging as a run or sweep starts, the job's, ``<output dir>/tamrun.log`` among them, as the job
starts), whatever ``hydra/job_logging`` and ``hydra/hydra_logging`` are; and, as a run or sweep starts,
before Hydra makes its folder, refuses a secret environment variable's value where it would be written in
clear (`refuse_secret_sources`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Iterable

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from tamrun.config.secret_sources import check_secret_sources
from tamrun.errors import Abort, ConfigError
from tamrun.redact import RedactFilter, redacted

log = logging.getLogger(__name__)

PRIVATE = 0o600  # owner read and write: Hydra's files may name a store, a user, a host
SWEEP_FILE = "multirun.yaml"


def redact_files(paths: Iterable[Path]) -> None:
    """Rewrite each existing file of ``paths`` with its secrets masked (`tamrun.redact.redacted`), mode
    0600. A file that cannot be read or written is left as it is, with a warning (it is Hydra's, not the
    run's)."""
    for path in paths:
        if not path.is_file():
            continue
        try:
            os.chmod(path, PRIVATE)
            text = path.read_text(encoding="utf-8", errors="replace")
            clean = redacted(text)
            if clean != text:
                path.write_text(clean, encoding="utf-8")
        except OSError as exc:
            log.warning("could not redact Hydra's file %s (%s)", path, exc.strerror or exc)


def job_files(config: DictConfig) -> Iterable[Path]:
    """Hydra's files of the job ``config`` (its ``.hydra`` folder's YAML) and of its sweep, if any."""
    hydra = config.hydra
    subdir = hydra.get("output_subdir")
    output_dir = hydra.runtime.get("output_dir")
    found = []
    if subdir is not None and output_dir:
        found.extend(sorted((Path(str(output_dir)) / str(subdir)).glob("*.yaml")))
    if str(hydra.get("mode")) == "RunMode.MULTIRUN":
        found.append(Path(str(hydra.sweep.dir)) / SWEEP_FILE)
    return found


def filter_handlers() -> None:
    """`RedactFilter` on every handler of every logger now configured (once each)."""
    loggers = [logging.getLogger()] + [logger for logger in logging.Logger.manager.loggerDict.values()
                                       if isinstance(logger, logging.Logger)]
    for handler in {handler for logger in loggers for handler in logger.handlers}:
        if not any(isinstance(existing, RedactFilter) for existing in handler.filters):
            handler.addFilter(RedactFilter())


def refuse_secret_sources(config: DictConfig) -> None:
    """A secret environment variable's value where it would be written in clear, Hydra's folders included
    (`tamrun.config.secret_sources`), refused before Hydra makes the run's or the sweep's folder: the
    `ConfigError` carried past Hydra's callbacks (which would make it a warning) as an `Abort`."""
    try:
        check_secret_sources(config)
    except ConfigError as error:
        raise Abort(error) from None


class RedactedHydraFiles(Callback):
    """Hydra's files redacted and private: a job's as it starts, the sweep's as it ends; its log handlers
    filtered as they are configured (module doc)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        filter_handlers()
        refuse_secret_sources(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        filter_handlers()
        refuse_secret_sources(config)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        filter_handlers()
        redact_files(job_files(config))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        redact_files([Path(str(config.hydra.sweep.dir)) / SWEEP_FILE])
