"""A locked tracking server's sign-in by token (MLflow's auth app, ``authorization_function`` of its
configuration, tests/servers.py `locked_server`): a request with ``Authorization: Bearer <token>`` is the user
`TOKENS` names, as a server behind a gateway that issues tokens sees it; any other request goes to MLflow's
basic auth. tests/test_locked_server.py runs a job with a token: its run's user is the token's (issue 61)."""

from __future__ import annotations

TOKENS = {"writer-token-4f2a9c": "writer"}


def authenticate():
    """The user of the request's bearer token (a 401 for a token not in `TOKENS`), else basic auth's answer."""
    from flask import request
    from mlflow.server.auth import authenticate_request_basic_auth, make_basic_auth_response
    from werkzeug.datastructures import Authorization

    kind, _, token = request.headers.get("Authorization", "").partition(" ")
    if kind.lower() != "bearer":
        return authenticate_request_basic_auth()
    user = TOKENS.get(token.strip())
    return Authorization("basic", {"username": user}) if user else make_basic_auth_response()
