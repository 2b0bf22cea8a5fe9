"""The log of one run, kept in memory and logged as the run's artifact ``logs/run.log``."""

from __future__ import annotations

import io
import logging
import traceback
from typing import Optional

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class RunLog:
    """Records what reaches the root logger at ``level`` and up between `start` and `stop`
    (tamrun's loggers are lowered to ``level`` meanwhile if they were above it)."""

    def __init__(self, level: int = logging.INFO) -> None:
        self.level = level
        self.buffer = io.StringIO()
        self.handler: Optional[logging.Handler] = None
        self._tamrun_level = logging.NOTSET

    def start(self) -> None:
        self.handler = logging.StreamHandler(self.buffer)
        self.handler.setFormatter(logging.Formatter(FORMAT))
        self.handler.setLevel(self.level)
        logging.getLogger().addHandler(self.handler)
        tamrun_logger = logging.getLogger("tamrun")
        self._tamrun_level = tamrun_logger.level
        if tamrun_logger.getEffectiveLevel() > self.level:
            tamrun_logger.setLevel(self.level)

    def add_exception(self, exc_type, exc, tb) -> None:
        """The traceback, in the log artifact only (the console shows one line for bad input)."""
        self.buffer.write("".join(traceback.format_exception(exc_type, exc, tb)))

    def stop(self) -> str:
        if self.handler is not None:
            logging.getLogger().removeHandler(self.handler)
            logging.getLogger("tamrun").setLevel(self._tamrun_level)
            self.handler = None
        return self.buffer.getvalue()
