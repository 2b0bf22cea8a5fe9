"""The loader of a logged tamrun model: the pyfunc flavor's ``loader_module``, a module of the installed tamrun.

MLflow loads a model by importing the module its MLmodel names and calling its ``_load_pyfunc(data_path)``
(``mlflow.pyfunc.load_model``, ``mlflow models serve``, a registered ``models:/<name>@<alias>``). A tamrun
model names this module, so nothing of the artifact runs as code: `_load_pyfunc` first compares every
file of the model with the sha256 its run recorded in the tracking store (`verify_files`: the store of
``MLFLOW_TRACKING_URI``, or of ``mlflow.set_tracking_uri``), then reads the state as data, each tensor
checked against the JSON (`tamrun.tracking.model_state`), and only then builds the model. A file that
changed, went missing or was added, or an entry that is not a regular file (a FIFO, socket, device or link,
never opened), is refused with one line (`ModelFileError`) naming it.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

import pandas as pd

from tamrun.redact import redacted
from tamrun.tracking.model_files import MANIFEST_TAG, ModelFileError, first_difference

log = logging.getLogger(__name__)

MLMODEL = "MLmodel"
RELOG = "run the run again to log the model anew (or restore the artifact store's copy of it from a backup)"
# MLflow's error codes of a store that answered that it holds no such model (any other error: it did not answer).
NO_RECORD = ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND")
UNANSWERED = ("start the tracking server or make it reachable from here, or set MLFLOW_TRACKING_URI to the store "
              "its run logged it to")
UNRECORDED = "run the run again: it logs the model anew, its files recorded"


class LoadedModel:
    """What MLflow's pyfunc calls: ``predict(model_input, params)`` of the verified model;
    ``python_model`` (`tamrun.tracking.pyfunc_model.TamPyfuncModel`) for ``unwrap_python_model()``."""

    def __init__(self, python_model: Any) -> None:
        self.python_model = python_model

    def predict(self, model_input: pd.DataFrame, params: Optional[dict] = None) -> pd.DataFrame:
        return self.python_model.predict(None, model_input, params)


def model_root(data_path: Path) -> Path:
    """The model's folder: the nearest folder above ``data_path`` (or itself) that holds its MLmodel."""
    for folder in [Path(data_path), *Path(data_path).parents]:
        if (folder / MLMODEL).is_file():
            return folder
    raise ModelFileError("data_path", str(data_path), "no MLmodel file in it or above it",
                         "load the model's folder as MLflow logged it")


def model_id_of(root: Path) -> str:
    from mlflow.models import Model

    model_id = Model.load(str(root / MLMODEL)).model_id
    if not model_id:
        raise ModelFileError(MLMODEL, str(root / MLMODEL), "names no model id, so its record cannot be found", RELOG)
    return model_id


def recorded_files(model_id: str, tracking_uri: Optional[str] = None) -> Dict[str, str]:
    """The sha256 of each file of the LoggedModel ``model_id``, as its run recorded them in the tracking
    store (``tracking_uri``, else MLflow's current one); a `ModelFileError` when it has no record, or when it
    does not answer (MLflow retries first: ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` and ``MLFLOW_HTTP_REQUEST_TIMEOUT``
    bound the wait; they are the process's settings, left as they are)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    where = f"models:/{model_id}"
    if tracking_uri is None and not mlflow.is_tracking_uri_set():
        raise ModelFileError(where, "no tracking store", "its files cannot be checked against what its run "
                             "recorded", "set MLFLOW_TRACKING_URI to the store its run logged it to")
    uri = tracking_uri or mlflow.get_tracking_uri()
    try:
        logged = mlflow.MlflowClient(tracking_uri=uri).get_logged_model(model_id)
    except MlflowException as exc:
        if exc.error_code in NO_RECORD:
            raise ModelFileError(where, uri, f"the tracking store has no record of this model ({exc.message})",
                                 "set MLFLOW_TRACKING_URI to the store its run logged it to") from None
        raise ModelFileError(where, uri, f"the tracking store {redacted(uri)} did not answer ({exc.message}): "
                             "whether it records this model is not known", UNANSWERED) from None
    text = logged.tags.get(MANIFEST_TAG)
    if not text:
        raise ModelFileError(where, MANIFEST_TAG, "the store records no digest of its files (a model logged "
                             "before tamrun recorded its files, or the tag was removed)", UNRECORDED)
    try:
        recorded = json.loads(text)
    except ValueError:
        recorded = None
    if not isinstance(recorded, dict):
        raise ModelFileError(where, MANIFEST_TAG, "the store's record of its files is not the JSON a run writes",
                             UNRECORDED)
    return recorded


def verify_files(root: Path, tracking_uri: Optional[str] = None) -> str:
    """Check every file of the model folder ``root`` against the digests its run recorded (`recorded_files`);
    returns its model id. The first file that differs is a `ModelFileError` naming it."""
    model_id = model_id_of(root)
    difference = first_difference(root, recorded_files(model_id, tracking_uri))
    if difference is not None:
        name, how = difference
        raise ModelFileError(f"models:/{model_id}", name, f"{how}: the model is refused unread",
                             f"do not serve this copy; {RELOG}")
    return model_id


def verify_logged_model(client: Any, model_id: str) -> None:
    """`verify_files` of the LoggedModel ``model_id`` of ``client``'s store, where its artifacts lie (a local
    folder), else downloaded first: before it is registered, nothing of it is loaded. A model whose run
    recorded no digests is refused before its artifacts are looked for."""
    import mlflow

    from tamrun.tracking.store.store import local_folder

    recorded_files(model_id, client.tracking_uri)
    logged = client.get_logged_model(model_id)
    folder = local_folder(logged.artifact_location)
    if folder is not None:
        verify_files(folder, client.tracking_uri)
        return
    with tempfile.TemporaryDirectory() as tmp:
        local = mlflow.artifacts.download_artifacts(artifact_uri=logged.artifact_location, dst_path=tmp,
                                                    tracking_uri=client.tracking_uri)
        verify_files(Path(local), client.tracking_uri)


def _load_pyfunc(data_path: str) -> LoadedModel:
    """MLflow's entry (the module doc): the files verified, then the state read as data."""
    from tamrun.tracking.model_state import load_state
    from tamrun.tracking.pyfunc_model import TamPyfuncModel

    model_id = verify_files(model_root(Path(data_path)))
    log.info("models:/%s: every file as its run recorded it", model_id)
    return LoadedModel(TamPyfuncModel(load_state(Path(data_path))))
