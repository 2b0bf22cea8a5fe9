"""What a run came from, as MLflow's own tags (the UI's Source and User columns read them):

    mlflow.source.name / .type        the entry point ("python -m tamrun") and LOCAL
    mlflow.source.git.commit / .branch / .repoURL   the checkout tamrun runs from, when it is a git clone
    mlflow.user                        the login of the process; on a tracking server, the account the
                                       run is made by (`account_tags`), which MLflow also takes as the
                                       run's user id
"""

from __future__ import annotations

import getpass
import os
import subprocess
from pathlib import Path
from typing import Dict, Optional

import tamrun

SOURCE_NAME = "python -m tamrun"
USER_TAG = "mlflow.user"
USERNAME_ENV, TOKEN_ENV = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_TOKEN"
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
        tags[USER_TAG] = login
    return tags


def account(uri: str) -> Optional[str]:
    """The tracking account a run on the server ``uri`` is made by: MLFLOW_TRACKING_USERNAME, else (a token,
    MLFLOW_TRACKING_TOKEN) the user the server reports (`server_permissions.current_user`); None on a store
    that is not an http(s) server, without either, or when the server cannot say."""
    if not uri.startswith(("http://", "https://")):
        return None
    name = os.environ.get(USERNAME_ENV, "").strip()
    if name or not os.environ.get(TOKEN_ENV, "").strip():
        return name or None
    from tamrun.tracking.store.server_permissions import current_user

    found = current_user(uri)
    return found.name if found else None


def account_tags(uri: str) -> Dict[str, str]:
    """``mlflow.user`` as the tracking account (`account`) when there is one: two users' runs on one server
    are told apart, not both the OS user; {} otherwise (the OS user of `source_tags` stays)."""
    name = account(uri)
    return {USER_TAG: name} if name else {}
