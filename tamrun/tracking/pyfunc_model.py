"""The fitted model as an MLflow pyfunc: ``mlflow.pyfunc.load_model(uri).predict(frame)``.

The pyfunc holds one `tamrun.fitted.FittedModel` on the CPU (design with its per-group feature
ranges and each effect's state, the (G, D) coefficients, the group order, the data recipe). Its
input is a table with the group column and the columns the effects read (derived columns are
computed by the recipe when absent); its output is one prediction per input row, in the input's
order (`FittedModel.predict_values`).
"""

from __future__ import annotations

import copy
import logging
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, List, Optional

import mlflow.pyfunc
import numpy as np
import pandas as pd
import torch

import tamrun
from tamrun.fitted import FittedModel

log = logging.getLogger(__name__)

ARTIFACT_PATH = "model/pyfunc"


class TamPyfuncModel(mlflow.pyfunc.PythonModel):
    """A fitted tamrun model behind MLflow's pyfunc interface."""

    def __init__(self, fitted: FittedModel) -> None:
        self.model = replace(fitted, design=copy.deepcopy(fitted.design).to(torch.device("cpu")),
                             coef=fitted.coef.detach().cpu())

    @property
    def input_columns(self) -> List[str]:
        """The group column (if any), then the effects' columns."""
        return self.model.input_columns

    def predict(self, context: Any, model_input: pd.DataFrame, params: Optional[dict] = None) -> np.ndarray:
        """One prediction per row of ``model_input`` (unseen groups or levels: `tamrun.errors.DataError`)."""
        return self.model.predict_values(model_input)


def log_pyfunc_model(log_dir: Callable[[str, str], None], fitted: FittedModel, example: pd.DataFrame) -> None:
    """Save the model with its signature and a 5-row input example, and log the folder with
    ``log_dir(local_folder, artifact_path)`` at `ARTIFACT_PATH`."""
    from mlflow.models import infer_signature

    model = TamPyfuncModel(fitted)
    sample = example[model.input_columns].head(5).reset_index(drop=True)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        # MLflow hints that integer columns (groups, levels) cannot hold missing values; the model
        # refuses missing values anyway (tamrun.errors.DataError), so the hint only adds noise.
        warnings.filterwarnings("ignore", message="Hint: Inferred schema contains integer", category=UserWarning)
        signature = infer_signature(sample, model.predict(None, sample))
        path = Path(tmp) / "pyfunc"
        mlflow.pyfunc.save_model(str(path), python_model=model, signature=signature, input_example=sample,
                                 pip_requirements=[f"tamrun=={tamrun.__version__}", f"torch=={torch.__version__.split('+')[0]}",
                                                   f"mlflow=={mlflow.__version__}", f"pandas=={pd.__version__}"])
        log_dir(str(path), ARTIFACT_PATH)
    log.info("model logged as an MLflow pyfunc at %s", ARTIFACT_PATH)
