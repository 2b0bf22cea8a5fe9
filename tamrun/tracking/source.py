"""What a run came from, as MLflow's own tags (the UI's Source and User columns read them):

    mlflow.source.name / .type        the entry point ("python -m tamrun") and LOCAL
    mlflow.source.git.commit / .branch / .repoURL   the checkout tamrun runs from, when it is a git clone
    mlflow.user                        the login of the process
"""

from __future__ import annotations

import getpass
import subprocess
from pathlib import Path
from typing import Dict, Optional

import tamrun

SOURCE_NAME = "python -m tamrun"
GIT_TIMEOUT_S = 5.0


def git(*args: str) -> Optional[str]:
    """``git <args>`` run in tamrun's own folder: its stripped output, or None (no git, not a clone)."""
    try:
        out = subprocess.run(["git", *args], cwd=Path(tamrun.__file__).parent, capture_output=True, text=True,
                             timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def git_commit() -> Optional[str]:
    """The checkout's HEAD commit when tamrun runs from a git clone, else None."""
    return git("rev-parse", "HEAD")


def user() -> Optional[str]:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name for this uid (some containers)
        return None


def source_tags() -> Dict[str, str]:
    """MLflow's source and user tags of this process (those it cannot tell are left out)."""
    tags = {"mlflow.source.name": SOURCE_NAME, "mlflow.source.type": "LOCAL"}
    commit = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
        branch, remote = git("rev-parse", "--abbrev-ref", "HEAD"), git("config", "--get", "remote.origin.url")
        if branch and branch != "HEAD":
            tags["mlflow.source.git.branch"] = branch
        if remote:
            tags["mlflow.source.git.repoURL"] = remote
    login = user()
    if login:
        tags["mlflow.user"] = login
    return tags
