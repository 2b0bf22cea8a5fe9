"""What a Ray sweep's jobs need from the launching shell's environment, handed to them through Ray's runtime
environment (``runtime_env={"env_vars": ...}`` of each job's task).

Ray starts its workers from each node's ``ray start``, not from the launching shell: without this, a job
sees none of the variables the launching process read for tracking, and records elsewhere than its
sweep's parent, or fails (``tracking=server`` with ``MLFLOW_TRACKING_URI`` exported). Handed over:

- every ``MLFLOW_*`` variable of the shell (``MLFLOW_TRACKING_URI``, the credentials
  ``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD`` / ``_TOKEN``, TLS settings, HTTP retries) and the one
  ``tracking.uri_env`` names;
- without ``tracking.uri`` nor either variable, the launching folder's default store (as
  ``MLFLOW_TRACKING_URI``), not the worker's folder's;
- the command's run tag and sweep id (`tamrun.process.run_folder`, `tamrun.tracking.sweep_record.sweep_files`).

A tracking variable that the launcher's own runtime environment (``ray.init.runtime_env`` or
``ray.remote.runtime_env``) sets to another value than the shell's, or that the shell lacks, is refused
before any job starts (`check_env`): the jobs would record elsewhere than the sweep's parent.

A secret never travels in the runtime environment: Ray writes a task's runtime environment, values
included, to every node's ``runtime_env_agent.log`` (readable by all) and keeps it in its cluster state.
`split_secrets` keeps the variables that are secret (a secret name, `tamrun.redact.secret_name`:
``MLFLOW_TRACKING_PASSWORD``, ``MLFLOW_TRACKING_TOKEN``, ``AWS_SECRET_ACCESS_KEY``, ...; or a value that
holds one, a URI with a password) apart: the launcher hands them to the task as an argument, and the task
sets them in its own environment before its job starts (`tamrun.sweeps.ray_launch.run_job_in_ray`).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Tuple

from tamrun.errors import ConfigError
from tamrun.process.run_folder import RUN_TAG
from tamrun.redact import redacted, secret_name
from tamrun.tracking.sweep_record.sweep_files import SWEEP_ENV

MLFLOW_PREFIX = "MLFLOW_"
URI_VARIABLE = "MLFLOW_TRACKING_URI"


def tracking_variable(name: str, tracking: Mapping[str, Any]) -> bool:
    """Whether the variable ``name`` is one the tracking reads (``MLFLOW_*``, or ``tracking.uri_env``'s)."""
    return name.startswith(MLFLOW_PREFIX) or name == tracking.get("uri_env")


def job_env(tracking: Mapping[str, Any]) -> Dict[str, str]:
    """The variables every job of the sweep gets (module doc), from this process's environment and its
    ``tracking`` settings."""
    from tamrun.tracking.mlflow_run import default_tracking_uri

    env = {name: value for name, value in os.environ.items() if tracking_variable(name, tracking)}
    if (tracking.get("enabled", True) and not tracking.get("uri") and not tracking.get("uri_env")
            and not env.get(URI_VARIABLE, "").strip()):
        env[URI_VARIABLE] = default_tracking_uri()
    env.update({RUN_TAG: os.environ.get(RUN_TAG, ""), SWEEP_ENV: os.environ.get(SWEEP_ENV, "")})
    return env


def split_secrets(env: Mapping[str, str]) -> Tuple[Dict[str, str], Dict[str, str]]:
    """(the variables of ``env`` that may travel in a runtime environment, the secret ones): a variable is
    secret when its name is (`tamrun.redact.secret_name`) or its value holds a secret (`redacted` changes
    it)."""
    public: Dict[str, str] = {}
    secret: Dict[str, str] = {}
    for name, value in env.items():
        (secret if secret_name(name) or redacted(value) != value else public)[name] = value
    return public, secret


def given_env(options: Mapping[str, Any]) -> Dict[str, str]:
    """The ``env_vars`` of a ``ray.init`` or ``ray.remote`` option set's ``runtime_env``."""
    return {str(k): str(v) for k, v in ((options.get("runtime_env") or {}).get("env_vars") or {}).items()}


def check_env(tracking: Mapping[str, Any], init: Mapping[str, Any], remote: Mapping[str, Any]) -> None:
    """Refuse a tracking variable that the launcher's runtime environment sets otherwise than the shell."""
    shell = job_env(tracking)
    for where, options in (("hydra.launcher.ray.remote", remote), ("hydra.launcher.ray.init", init)):
        for name, value in given_env(options).items():
            if tracking_variable(name, tracking) and shell.get(name) != value:
                ours = f"{name}={redacted(shell[name])!r}" if name in shell else f"no {name}"
                raise ConfigError(
                    f"{where}.runtime_env.env_vars.{name}", redacted(value),
                    f"the launching shell has {ours}, with which the sweep's parent run is recorded: the jobs "
                    "would record elsewhere (tamrun hands every job the shell's tracking variables)",
                    f"remove {name} from {where}.runtime_env, or export {name} with that value before launching")


def remote_options(remote: Mapping[str, Any], env: Mapping[str, str]) -> Dict[str, Any]:
    """``ray.remote``'s options with ``env`` added to the task's ``runtime_env.env_vars``."""
    runtime_env = dict(remote.get("runtime_env") or {})
    runtime_env["env_vars"] = {**given_env(remote), **env}
    return {**remote, "runtime_env": runtime_env}
