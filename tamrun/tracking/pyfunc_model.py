"""The fitted model as an MLflow 3 LoggedModel named "model": ``mlflow.pyfunc.load_model("runs:/<run id>/model")``
(or ``models:/<model_id>``, or a registered ``models:/<name>@champion``).

The model holds data only, no Python source: the `tamrun.fit.fitted.FittedModel` on the CPU
(`tamrun.tracking.model_state`: its tensors in safetensors, the rest in JSON; loading it unpickles
nothing): the design with its per-group feature ranges and each effect's state, the (G, D)
coefficients, the group order and the data recipe (derived columns, the time index's origin, the date,
target and group columns). Its MLmodel names the installed tamrun's loader (`LOADER_MODULE`,
`tamrun.tracking.pyfunc_loader`), which checks every file of the model against the sha256 digests the
run recorded in the tracking store (`tamrun.tracking.model_files`) before it reads any of them.

Where tamrun is not installed, ``mlflow models serve`` and ``mlflow models predict`` build the model's
environment from its requirements: tamrun's dependencies at this environment's versions, torch from
PyTorch's CPU index (`requirements`), and tamrun itself as the one wheel logged with the model, pinned
by its sha256 (`tamrun.tracking.model_files.wheel_requirement`).

Its input is the user's raw table: the group column, the effects' columns that are read from the
file, and what the derived columns are computed from (the date for a time index, an ``isin``'s
column, the columns an expression names): `FittedModel.raw_columns`, which its input example lists; the
date as text, as in the file and in a CSV or JSON request (``2024-01-01 00:30:00``), or as a pandas
datetime column. Its signature has no input schema: MLflow enforces one before the model sees the rows,
and none of its column types passes both (a string type refuses a datetime64 column; a datetime type
makes the scoring server read a CSV request with a dtype pandas refuses; ``AnyType`` has no pandas dtype
for a CSV request either). The model checks its rows itself, as a run would (`tamrun.fit.served_rows`:
columns present, no missing or non-finite value, dates that are dates, features within the training
support, forecasts a run accepts). Its output is a table, one row per
input row in the input's order: the date and group columns as given, and `PREDICTION`
(`prediction_table`). The LoggedModel is linked to its run (the UI's Models column) and registered by
``python -m tamrun.compare --best --register <name>``.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator, List, Optional

import mlflow.pyfunc
import numpy as np
import pandas as pd

import tamrun
from tamrun.errors import TamrunError
from tamrun.process.filesystem import writing
from tamrun.fit.fitted import FittedModel
from tamrun.fit.served_rows import check_forecasts, check_inputs
from tamrun.machine.placement import HOST
from tamrun.tracking.model_files import MANIFEST_TAG, file_digests, manifest_text, tamrun_wheel, wheel_requirement
from tamrun.tracking.model_state import load_state, save_state
from tamrun.tracking.store.store import local_folder

log = logging.getLogger(__name__)

FITTED_ARTIFACT = "fitted"  # the FittedModel's state folder, among the model's artifacts
# The LoggedModel's name: MLflow resolves runs:/<run id>/<name> to the run's LoggedModel of that name
# first, so runs:/<run id>/model loads it (the run's artifact folders are named apart: fit/, plots/, ...).
LOGGED_MODEL_NAME = "model"
PREDICTION = "predicted"  # the output table's prediction column
DATE_TEXT = "%Y-%m-%d %H:%M:%S"  # how the input example writes a date (any text pandas parses is read)
LOADER_MODULE = "tamrun.tracking.pyfunc_loader"  # the pyfunc flavor's loader: a module of the installed tamrun
EXAMPLE_ROWS = 5


@contextlib.contextmanager
def served_refusals() -> Iterator[None]:
    """A `TamrunError` raised inside (`tamrun.fit.served_rows`) becomes an `MlflowException` of
    INVALID_PARAMETER_VALUE whose message is its one ``tamrun:`` line (MLflow's scoring server answers such an
    exception with HTTP 400 and its message)."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    try:
        yield
    except TamrunError as error:
        raise MlflowException(error.report_line().strip(), error_code=INVALID_PARAMETER_VALUE) from error


class TamPyfuncModel(mlflow.pyfunc.PythonModel):
    """A fitted tamrun model behind MLflow's pyfunc interface (its state read by `load_context`)."""

    def __init__(self, fitted: Optional[FittedModel] = None) -> None:
        self.model = fitted

    def load_context(self, context: Any) -> None:
        self.model = load_state(Path(context.artifacts[FITTED_ARTIFACT]))

    def predict(self, context: Any, model_input: pd.DataFrame, params: Optional[dict] = None) -> pd.DataFrame:
        """`prediction_table` of ``model_input``, held to a run's standard (`tamrun.fit.served_rows`: a
        refusal, unseen groups or levels among them, is an MlflowException of one ``tamrun:`` line)."""
        with served_refusals():
            check_inputs(self.model, model_input)
            table = prediction_table(self.model, model_input)
            check_forecasts(self.model, table[PREDICTION].to_numpy())
        return table


def prediction_table(model: FittedModel, frame: pd.DataFrame) -> pd.DataFrame:
    """One row per row of ``frame``, in its order: its date column (when it has it) and group column as given
    (a derived group, data.group read from the date: the value the model derived), `PREDICTION` and, for a
    model with intervals, each level's (lower_80, upper_80, ...)."""
    frame = pd.DataFrame(frame).reset_index(drop=True)
    date, group = model.recipe.date_column, model.recipe.group
    table = frame[[date] if date in frame.columns else []].copy()
    predicted, codes = model.predict_with_groups(frame)
    if group:
        table[group] = frame[group] if group in frame.columns else np.asarray(model.groups, dtype=object)[codes]
    table[PREDICTION] = predicted
    if model.intervals is not None:
        table = table.assign(**model.intervals.columns(predicted, codes))
    return table


def dates_as_text(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """``frame`` with its date ``column`` (when it has it, parsed) written as text, ``2024-01-01 00:30:00``:
    the model's input example shows the date as a CSV or a JSON request carries it."""
    if column not in frame.columns or not pd.api.types.is_datetime64_any_dtype(frame[column]):
        return frame
    return frame.assign(**{column: frame[column].dt.strftime(DATE_TEXT).astype(object)})


def declared_dependencies() -> List[str]:
    """tamrun's declared dependencies: its installed metadata, else (a source checkout on PYTHONPATH, not
    installed) the ``[project] dependencies`` of the pyproject.toml beside the package; [] without either."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        return list(requires("tamrun") or [])
    except PackageNotFoundError:
        try:
            import tomllib
        except ImportError:  # Python 3.10
            return []
        pyproject = Path(tamrun.__file__).parent.parent / "pyproject.toml"
        if not pyproject.is_file():
            return []
        return list(tomllib.loads(pyproject.read_text()).get("project", {}).get("dependencies", []))


def requirements() -> List[str]:
    """tamrun's own dependencies (not its extras) pinned at this environment's versions, a local version
    such as torch's +cpu dropped: plain requirements that the default index alone satisfies, no index
    option (an index the serving machine cannot reach made pip retry it for every package). Where pip is
    also given PyTorch's CPU index (docs/serving.md), it prefers that index's CPU build of the same
    version. tamrun itself is added as the wheel logged with the model."""
    from importlib.metadata import version

    from packaging.requirements import Requirement

    names = [Requirement(line).name for line in declared_dependencies() if "extra ==" not in line]
    return [f"{name}=={version(name).split('+')[0]}" for name in sorted(set(names) | {"mlflow", "torch"})]


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
    from mlflow.models import Model, ModelSignature, infer_signature

    model = fitted.to(HOST)  # every tensor of it: it loads on a machine without a GPU
    given = [name for name in model.recipe.continued(model.input_columns) if name in example.columns]
    rows = example[list(dict.fromkeys([*model.raw_columns(example.columns), *given]))]  # given: the table's rows are
    # at or before its end, where a smooth is not continued (`DataRecipe.continued`)
    rows = rows.tail(EXAMPLE_ROWS) if model.recipe.tail is not None else rows.head(EXAMPLE_ROWS)  # tail: their history
    sample = dates_as_text(rows.reset_index(drop=True), model.recipe.date_column)
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
            # outputs only: no input schema MLflow enforces passes both a CSV request and a datetime column (module doc)
            signature = ModelSignature(outputs=infer_signature(sample, prediction_table(model, sample)).outputs)
            wheel = tamrun_wheel(declared_dependencies(), Path(tmp))
            mlflow.pyfunc.save_model(str(path), loader_module=LOADER_MODULE, data_path=str(state), signature=signature,
                                     input_example=sample, pip_requirements=[*requirements(), wheel_requirement(wheel)],
                                     mlflow_model=info)
            shutil.copy(wheel, path / wheel.name)
            client.set_logged_model_tags(logged.model_id, {MANIFEST_TAG: manifest_text(file_digests(path))})
            with writing(local_folder(logged.artifact_location)):
                client.log_model_artifacts(logged.model_id, str(path))
    except BaseException:
        client.finalize_logged_model(logged.model_id, LoggedModelStatus.FAILED)
        raise
    client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
    log.info("model logged: runs:/%s/%s (models:/%s; mlflow.pyfunc.load_model or mlflow models serve -m; the best "
             "run's registered by python -m tamrun.compare --best --register <name>)", tracked.run_id, name,
             logged.model_id)
    return logged.model_id
