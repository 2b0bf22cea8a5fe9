"""Loaded at the start of every Python child of a quick-tier run (tests/conftest.py puts this folder first
on PYTHONPATH and names a folder in TAMRUN_QUICK_IMPORTS): at its exit, the names of the tamrun modules
the child imported go to a file of its own there, which the tier's check reads."""

import atexit
import os
import sys


def _record() -> None:
    folder = os.environ.get("TAMRUN_QUICK_IMPORTS")
    if folder and os.path.isdir(folder):
        names = [name for name in list(sys.modules) if name.split(".")[0] in ("tamrun", "hydra_plugins")]
        with open(os.path.join(folder, f"{os.getpid()}.txt"), "a", encoding="utf-8") as handle:
            handle.write("\n".join(names) + "\n")


atexit.register(_record)
