"""What a locked tracking server lets this client's user do, asked through MLflow's basic-auth REST API
before a write that tamrun refuses to such a user (``python -m tamrun.compare --register`` by a READ user,
docs/scale.md) or the server would refuse half-way (a version added to another user's registered model).

Any user may ask the server who they are (``GET /api/2.0/mlflow/users/current``) and their own
permission on an experiment or a registered model (``GET /api/3.0/mlflow/users/permissions/get`` with
their own name; another user's is refused). A server without the auth app (an open server, a local store)
answers neither: no user, no permission, and nothing is refused here; nor on an older auth app without
those endpoints: the server's own refusal is then named (`tamrun.tracking.store.server_access`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

CURRENT_USER = "/api/2.0/mlflow/users/current"
USER_PERMISSION = "/api/3.0/mlflow/users/permissions/get"
# The server cannot say: no such endpoint (no auth app, or an older one: 404), or the question itself refused
# (403: an auth app configured otherwise, e.g. with workspaces); the write is then left to the server.
CANNOT_SAY = (403, 404)


@dataclass
class User:
    """The user the server authenticated this client as."""

    name: str
    is_admin: bool


def asked(uri: str, endpoint: str, params: Optional[Dict[str, str]] = None) -> Optional[Dict[str, Any]]:
    """The server's JSON answer to GET ``endpoint``; None when it cannot say (`CANNOT_SAY`, an answer that
    is not JSON, a store that is not an http(s) server). Its 401 is a `ConfigError`
    (`server_access.access_error`)."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request, verify_rest_response

    from tamrun.tracking.store.server_access import access_error

    if not uri.startswith(("http://", "https://")):
        return None
    try:
        response = http_request(get_default_host_creds(uri), endpoint, "GET", params=params)
        if response.status_code in CANNOT_SAY:
            return None
        return verify_rest_response(response, endpoint).json()
    except ValueError:  # not JSON: not MLflow's auth app answering (a proxy's page, say)
        return None
    except MlflowException as exc:
        refused = access_error(uri, exc)
        if refused is None:
            raise
        raise refused from None


def current_user(uri: str) -> Optional[User]:
    """The user the server at ``uri`` takes this client for; None without an auth app."""
    answer = asked(uri, CURRENT_USER)
    if not answer or "user" not in answer:
        return None
    return User(answer["user"]["username"], bool(answer["user"].get("is_admin")))


def permission_on(uri: str, user: str, resource_type: str, resource_id: str) -> Optional[str]:
    """``user``'s permission (READ, EDIT, MANAGE, NO_PERMISSIONS, ...) on the ``resource_type``
    (experiment, registered_model) ``resource_id``, as the server resolves it; None when it cannot say."""
    answer = asked(uri, USER_PERMISSION, {"username": user, "resource_type": resource_type,
                                          "resource_id": resource_id})
    return answer.get("permission") if answer else None
