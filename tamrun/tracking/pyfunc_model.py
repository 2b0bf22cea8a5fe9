"""The fitted model as an MLflow 3 LoggedModel: ``mlflow.pyfunc.load_model("models:/<model_id>")``.

The model is logged as code (`tamrun.tracking.pyfunc_code`, MLflow's models-from-code: no object is
cloudpickled) plus one artifact folder, the `tamrun.fitted.FittedModel` on the CPU as data
(`tamrun.tracking.model_state`: its tensors in safetensors, the rest in JSON; loading it unpickles
nothing): the design with its per-group feature ranges and each effect's state, the (G, D)
coefficients, the group order and the data recipe (derived columns, the time index's origin, the date,
target and group columns).

Its input is the user's raw table: the group column, the effects' columns that are read from the
file, and what the derived columns are computed from (the date for a time index, an ``isin``'s
column, the columns an expression names): `FittedModel.raw_columns`, which its signature lists.
Its output is one prediction per input row, in the input's order (`FittedModel.predict_values`).
The LoggedModel is linked to its run (the UI's Models column) and registered in one command:
``mlflow.register_model("models:/<model_id>", "<name>")``.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator, List, Optional

import mlflow.pyfunc
import numpy as np
import pandas as pd
import torch

import tamrun
from tamrun.filesystem import writing
from tamrun.fitted import FittedModel
from tamrun.placement import HOST
from tamrun.tracking.model_state import load_state, save_state
from tamrun.tracking.store import local_folder

log = logging.getLogger(__name__)

FITTED_ARTIFACT = "fitted"  # the FittedModel's state folder, among the model's artifacts
CODE_FILE = Path(__file__).with_name("pyfunc_code.py")
EXAMPLE_ROWS = 5


class TamPyfuncModel(mlflow.pyfunc.PythonModel):
    """A fitted tamrun model behind MLflow's pyfunc interface (its state read by `load_context`)."""

    def __init__(self, fitted: Optional[FittedModel] = None) -> None:
        self.model = fitted

    def load_context(self, context: Any) -> None:
        self.model = load_state(Path(context.artifacts[FITTED_ARTIFACT]))

    def predict(self, context: Any, model_input: pd.DataFrame, params: Optional[dict] = None) -> np.ndarray:
        """One prediction per row of ``model_input`` (unseen groups or levels: `tamrun.errors.DataError`)."""
        return self.model.predict_values(model_input)


def requirements() -> List[str]:
    import safetensors

    return [f"tamrun=={tamrun.__version__}", f"torch=={torch.__version__.split('+')[0]}",
            f"mlflow=={mlflow.__version__}", f"pandas=={pd.__version__}", f"safetensors=={safetensors.__version__}"]


@contextlib.contextmanager
def installed_requirements_trusted() -> Iterator[None]:
    """MLflow's save_model without its check that this environment satisfies the model's requirements:
    `requirements` are this environment's own versions, and the check maps every installed distribution
    to its modules first (importlib_metadata.packages_distributions: 0.36 s of a 9 s command on a
    2-core machine, for a check that cannot fail). Absent from an MLflow that renamed it: nothing to do."""
    from mlflow.utils import environment

    check = getattr(environment, "warn_dependency_requirement_mismatches", None)
    if check is None:
        yield
        return
    environment.warn_dependency_requirement_mismatches = lambda requirements: None
    try:
        yield
    finally:
        environment.warn_dependency_requirement_mismatches = check


def log_pyfunc_model(tracked: Any, name: str, fitted: FittedModel, example: pd.DataFrame) -> str:
    """Log ``fitted`` as a LoggedModel ``name`` of ``tracked``'s run (a `TrackedRun`), its signature and
    input example taken from the first rows of ``example`` (a table of the run's data); returns its id.
    ``name`` must not be one of the run's artifact folders: MLflow resolves ``runs:/<id>/<name>`` to
    the run's LoggedModel of that name first."""
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus
    from mlflow.models import Model, infer_signature

    model = fitted.to(HOST)  # every tensor of it: it loads on a machine without a GPU
    sample = example[model.raw_columns(example.columns)].head(EXAMPLE_ROWS).reset_index(drop=True)
    client = tracked.client
    logged = client.create_logged_model(tracked.experiment_id, name=name, source_run_id=tracked.run_id,
                                        model_type="tamrun", tags={"tamrun_version": tamrun.__version__})
    try:
        client.log_outputs(tracked.run_id, [LoggedModelOutput(logged.model_id, step=0)])
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(), installed_requirements_trusted():
            # MLflow hints that integer columns (groups, levels) cannot hold missing values; the model
            # refuses missing values anyway (tamrun.errors.DataError), so the hint only adds noise.
            warnings.filterwarnings("ignore", message="Hint: Inferred schema contains integer", category=UserWarning)
            state = Path(tmp) / "fitted"
            save_state(model, state)
            info = Model(artifact_path=logged.artifact_location, model_uuid=logged.model_id, run_id=tracked.run_id,
                         model_id=logged.model_id)
            path = Path(tmp) / "model"
            mlflow.pyfunc.save_model(str(path), python_model=str(CODE_FILE), artifacts={FITTED_ARTIFACT: str(state)},
                                     signature=infer_signature(sample, model.predict_values(sample)),
                                     input_example=sample, pip_requirements=requirements(), mlflow_model=info)
            with writing(local_folder(logged.artifact_location)):
                client.log_model_artifacts(logged.model_id, str(path))
    except BaseException:
        client.finalize_logged_model(logged.model_id, LoggedModelStatus.FAILED)
        raise
    client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
    log.info("model logged: models:/%s (mlflow.pyfunc.load_model; register it with "
             "mlflow.register_model('models:/%s', '<name>'))", logged.model_id, logged.model_id)
    return logged.model_id
