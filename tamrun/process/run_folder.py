"""One Hydra folder per command: the tag that ends ``hydra.run.dir`` and ``hydra.sweep.dir``.

conf/config.yaml writes both folders as ``<date>/<time>${oc.env:TAMRUN_RUN_TAG,''}``; the entry point sets
the variable to a new tag for each command (`new_run_tag`), so that two runs or sweeps started in the
same second, in one process or in two, never share a folder or a log (Hydra's default is the second
alone). A sweep's jobs read the launching command's tag: processes forked or spawned from it inherit
the variable, and `tamrun.sweeps.ray_launch` hands it to Ray's workers.
"""

from __future__ import annotations

import os
import secrets

RUN_TAG = "TAMRUN_RUN_TAG"
TAG_HEX_BYTES = 2  # random bytes after the pid (4 hex digits): hosts that share a folder tell their runs apart


def new_run_tag() -> str:
    """``-<pid>-<4 random hex digits>``, never the tag of this process's previous command."""
    while True:
        tag = f"-{os.getpid()}-{secrets.token_hex(TAG_HEX_BYTES)}"
        if tag != os.environ.get(RUN_TAG):
            return tag
