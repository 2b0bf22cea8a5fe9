"""``--register NAME``: the best run's LoggedModel made a new version of the registered model NAME, with
an alias (default `DEFAULT_ALIAS`) moved to it: ``models:/NAME@champion`` then loads it.

Everything that can refuse is asked before anything is registered: the name and the alias
(`check_names`, before the store is opened), then on a locked server the user's permission
(`check_may_register`: EDIT or MANAGE on the run's experiment; EDIT on a registered model of that name
someone else made). A refusal is one `ConfigError`; nothing is left half registered.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any, Iterator

from tamrun.errors import ConfigError

DEFAULT_ALIAS = "champion"
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
# A registered model's name: MLflow's store holds 256 characters (its column) and refuses '/' and ':'; tamrun
# takes letters and digits of any script, '_', '-', '.' and inner single spaces, starting with a letter, digit
# or '_': a quote would break the registry's search filters, '@', '?', '#' and '%' a models:/NAME@ALIAS URI.
MODEL_NAME_MAX = 256
MODEL_NAME = re.compile(r"\w+(?:[.\-]+\w*| \w+)*")
# An alias, as MLflow's registry takes it: letters, digits, '_' and '-', at most 255 characters, not 'latest'
# nor a version ('v1').
ALIAS_MAX = 255
ALIAS = re.compile(r"[\w\-]+")
VERSION_ALIAS = re.compile(r"[vV]\d+")
# The permissions that may write into an experiment or a registered model (MLflow's basic-auth app).
WRITE_PERMISSIONS = ("EDIT", "MANAGE")


def check_names(name: str, alias: str) -> None:
    """Refuse a registered model's name or an alias MLflow's registry (or a models:/ URI) cannot take."""
    if not name.strip():
        raise ConfigError("--register", name, "an empty name", "give the registered model a name, e.g. load-forecast")
    if len(name) > MODEL_NAME_MAX:
        raise ConfigError("--register", name, f"a name of {len(name)} characters (MLflow's registry "
                          f"holds at most {MODEL_NAME_MAX})", f"use a name of at most {MODEL_NAME_MAX} characters")
    if not MODEL_NAME.fullmatch(name):
        bad = sorted({c for c in name if not (c.isalnum() or c in "_-. ")})
        held = (f"holds {', '.join(map(repr, bad))}" if bad else
                "starts with '.', '-' or a space, or holds a doubled or trailing space")
        kept = re.sub(r"[^\w.\- ]+", "-", name).strip(" .-") or "load-forecast"
        raise ConfigError("--register", name, f"the name {held}: a registered model's name here is letters, digits, "
                          "'_', '-', '.' and single inner spaces, starting with a letter, digit or '_' ('/' and ':' "
                          "MLflow refuses; quotes, '@', '?', '#' and '%' break registry searches and models:/NAME@ALIAS "
                          "URIs)", f"use a name such as {kept!r}")
    if not ALIAS.fullmatch(alias) or len(alias) > ALIAS_MAX or alias.lower() == "latest" or VERSION_ALIAS.fullmatch(alias):
        raise ConfigError("--alias", alias, "MLflow's registry refuses it as an alias (letters, digits, '_' and '-', "
                          f"at most {ALIAS_MAX} characters, not 'latest' nor a version such as 'v1')",
                          f"use an alias such as {DEFAULT_ALIAS!r}")


@contextlib.contextmanager
def tracking_uri_set(uri: str) -> Iterator[None]:
    """MLFLOW_TRACKING_URI set to ``uri`` for the block: a database registry looks a ``models:/<id>``
    source up with a default client, which would otherwise open (and create) the default store in the
    working directory."""
    before = os.environ.get(TRACKING_URI_ENV)
    os.environ[TRACKING_URI_ENV] = uri
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TRACKING_URI_ENV, None)
        else:
            os.environ[TRACKING_URI_ENV] = before


def check_may_register(client: Any, store: str, run: Any, name: str) -> Any:
    """On a locked server, refuse a user whose permission on the run's experiment is below EDIT, before
    the registry is asked anything (`tamrun.tracking.store.server_permissions`); returns the user (None:
    not a locked server, an admin, or a server that cannot say)."""
    from tamrun.tracking.store.server_access import register_refused
    from tamrun.tracking.store.server_permissions import current_user, permission_on

    user = current_user(store)
    if user is None or user.is_admin:
        return None
    experiment = run.info.experiment_id
    has = permission_on(store, user.name, "experiment", experiment)
    if has is not None and has not in WRITE_PERMISSIONS:
        title = client.get_experiment(experiment).name
        raise register_refused(store, user.name, f"experiment {title!r}", has, name,
                               f"registering its run '{run.info.run_name}' as a version of {name!r}")
    return user


def check_model_permission(store: str, user: Any, name: str) -> None:
    """``name`` exists already: refuse a user without EDIT on that registered model (another user's)."""
    from tamrun.tracking.store.server_access import register_refused
    from tamrun.tracking.store.server_permissions import permission_on

    has = permission_on(store, user.name, "registered_model", name)
    if has is not None and has not in WRITE_PERMISSIONS:
        raise register_refused(store, user.name, f"registered model {name!r}", has, name,
                               "adding a version to it (another user made it)")


def register(client: Any, best: Any, model_uri: str, name: str, store: str, alias: str = DEFAULT_ALIAS) -> Any:
    """A new version of the registered model ``name`` (created if absent) in ``store`` from ``model_uri``,
    the best run's LoggedModel, with ``alias`` moved to it; returns the ModelVersion. A model registered
    under ``name`` already keeps its version (registering twice adds none). A locked server's refusal is a
    `ConfigError` naming the user, the model and the permission (`tamrun.tracking.store.server_access`)."""
    from mlflow.exceptions import MlflowException

    from tamrun.tracking.store.server_access import access_error

    check_names(name, alias)
    user = check_may_register(client, store, best.run, name)
    try:
        try:
            client.create_registered_model(name, description="Registered by python -m tamrun.compare --register")
        except MlflowException as exc:
            if exc.error_code not in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS"):
                raise
            if user is not None:
                check_model_permission(store, user, name)
        versions = client.search_model_versions(f"name = '{name}'")
        version = next((v for v in versions if v.source == model_uri), None)
        with tracking_uri_set(store):
            version = version or client.create_model_version(
                name, source=model_uri, run_id=best.run.info.run_id, model_id=model_uri.removeprefix("models:/"),
                tags={"tamrun.metric": best.metric, "tamrun.value": repr(best.value)})
        client.set_registered_model_alias(name, alias, version.version)
    except MlflowException as exc:
        refused = access_error(store, exc, model=name)
        if refused is None:
            raise
        raise refused from None
    return version
