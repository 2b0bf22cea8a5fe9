"""The fitted model as an MLflow pyfunc: ``mlflow.pyfunc.load_model(uri).predict(frame)``.

The model holds the fitted design (per-group feature ranges, each effect's state), the (G, D)
coefficients and the group order, all on the CPU. Its input is a table with the group column and
the columns the effects read (derived columns included, as the runner computed them); its output
is one prediction per input row, in the input's order.
"""

from __future__ import annotations

import copy
import logging
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, List, Optional

import mlflow.pyfunc
import numpy as np
import pandas as pd
import torch

import tamrun
from tamrun.pipeline import FittedModel, prediction_batch

log = logging.getLogger(__name__)

ARTIFACT_PATH = "model/pyfunc"
ROWS_PER_CHUNK = 4096  # rows per design chunk when predicting (bounds the memory of a call)


class TamPyfuncModel(mlflow.pyfunc.PythonModel):
    """A fitted tamrun model behind MLflow's pyfunc interface (build it with `from_fitted`)."""

    def __init__(self, fitted: FittedModel) -> None:
        cpu = torch.device("cpu")
        self.config = fitted.config
        self.design = copy.deepcopy(fitted.design).to(cpu)
        self.coef = fitted.coef.detach().to(cpu)
        self.groups = list(fitted.groups)
        self.dtype = fitted.train.x.dtype
        self.group_chunk = max(1, fitted.stats.group_chunk)  # groups per product: as many as the fit held

    @property
    def input_columns(self) -> List[str]:
        """The group column (if any), then the effects' columns."""
        group = self.config.data.group
        return ([group] if group else []) + [c for c in self.design.columns if c != group]

    def predict(self, context: Any, model_input: pd.DataFrame, params: Optional[dict] = None) -> np.ndarray:
        """One prediction per row of ``model_input`` (unseen groups or levels: `tamrun.errors.DataError`)."""
        frame = pd.DataFrame(model_input).reset_index(drop=True)
        target = self.config.data.target
        if target not in frame.columns:
            frame = frame.assign(**{target: 0.0})  # the batch carries a target; it is not used here
        batch = prediction_batch(self.config, self.design, self.groups, frame, self.dtype)
        out = np.zeros(len(frame))
        real = batch.row_index >= 0
        coef = self.coef.to(batch.x.dtype)
        for g0 in range(0, len(self.groups), self.group_chunk):
            groups = slice(g0, g0 + self.group_chunk)
            for r0 in range(0, batch.x.shape[1], ROWS_PER_CHUNK):
                rows = slice(r0, r0 + ROWS_PER_CHUNK)
                predicted = self.design.chunk(batch.x[groups, rows], groups).matvec(coef[groups]).numpy()
                keep = real[groups, rows]
                out[batch.row_index[groups, rows][keep]] = predicted[keep]
        return out


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
