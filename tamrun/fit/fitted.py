"""The fitted model: everything needed to predict from a raw table, and the one chunked prediction.

    FittedModel = design (effects' state, per-group scaling) + coef (G, D) + group order
                  + data recipe (derived columns, date / target / group columns) + dtype + chunk sizes

`predict_rows` is the only place where Phi beta is evaluated for prediction: the runner's train and
test forecasts, the logged MLflow model, the partial-effect plots and the adaptive forecasts all
call it. It works ``group_chunk`` groups x ``row_chunk`` rows at a time (each chunk's design built,
multiplied and dropped), optionally through a guarded `ChunkLoop` (tracker, OOM retry).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Optional, Tuple

import numpy as np
import pandas as pd
import torch

from tamrun.data.batch import GroupedBatch, build_batch
from tamrun.data.derive import DataRecipe
from tamrun.effects.categorical import CategoricalEffect
from tamrun.effects.design import AdditiveDesign
from tamrun.errors import DataError
from tamrun.fit.intervals import GroupBands
from tamrun.fit.support import TrainingSupport
from tamrun.memory.footprint import StepCost
from tamrun.memory.guard import ChunkLoop
from tamrun.machine.sampling import repeating
from tamrun.machine.placement import HOST, to_device
from tamrun.solve.assembly import row_spans


def predict_rows(design: AdditiveDesign, coef: torch.Tensor, x: torch.Tensor, device: torch.device,
                 group_chunk: int = 0, row_chunk: int = 0, weight: Optional[torch.Tensor] = None,
                 loop: Optional[ChunkLoop] = None, cost: Optional[StepCost] = None,
                 label: str = "predict") -> torch.Tensor:
    """Phi(x_g) beta_g (G, N) on the host for raw features x (G, N, F, on the host) of the design's groups
    and coef (G, D); multiplied by ``weight`` (G, N) when given (0 on padding). The one place a
    prediction places its tensors: the design's state and the coefficients move to ``device`` as a whole
    (`tamrun.machine.placement.to_device`), each chunk of x follows, each result comes back. ``group_chunk`` /
    ``row_chunk``: groups and rows per chunk (0: all). ``loop``: run the group chunks under the
    guard, each charged ``cost`` (the plan's predict cost), their progress named ``label``."""
    n_groups, n_rows = x.shape[:2]
    out = torch.zeros(n_groups, n_rows, dtype=x.dtype)
    rows = max(1, min(row_chunk or n_rows, n_rows))
    design = design.to(device)
    coef_dev = coef.to(device=device, dtype=x.dtype)

    def step(start: int, size: int) -> None:
        groups = slice(start, start + size)
        with repeating(("predict", size, x.shape[1:], rows, coef_dev.shape[1], x.dtype)):  # chunks of a size alike
            loop = object()  # names this chunk's row chunks: they allocate alike, the shorter last one less
            for r0, r1 in row_spans(n_rows, rows):
                with repeating(("predict rows", loop), r1 - r0):
                    chunk = design.chunk(x[groups, r0:r1].to(device), groups)
                    out[groups, r0:r1] = chunk.matvec(coef_dev[groups]).cpu()
                    del chunk

    group_chunk = max(1, group_chunk or n_groups)
    if loop is None:
        for start, stop in row_spans(n_groups, group_chunk):
            step(start, stop - start)
    else:
        loop.run(step, n_groups, group_chunk, "predict", cost or StepCost(0, 0), rows=rows, label=label)
    return out if weight is None else out.mul_(weight)


def prediction_batch(design: AdditiveDesign, groups: list, recipe: DataRecipe, dtype: torch.dtype,
                     frame: pd.DataFrame) -> GroupedBatch:
    """Rows of ``frame`` (derived columns added if absent) as a batch of the fitted ``groups``; a
    categorical level or a group unseen in training raises `DataError`. A missing target is read as 0
    (it is not used to predict)."""
    frame = recipe.apply(frame, design.columns)
    if recipe.target not in frame.columns:
        frame = frame.assign(**{recipe.target: 0.0})
    levels = {effect.column for effect in design.effects if isinstance(effect, CategoricalEffect)}
    frame = numbers_read(frame, [c for c in design.columns if c not in levels and c != recipe.group and c in frame])
    for effect in design.effects:
        if isinstance(effect, CategoricalEffect):
            unseen = effect.unseen_levels(frame[effect.column].to_numpy())
            if unseen:
                raise DataError(f"model.effects.{effect.name}.column", effect.column,
                                f"level(s) {unseen[:5]} appear in the rows to predict but never in training",
                                "train on a period that contains every level, or merge rare levels")
    return build_batch(frame, design.columns, recipe.target, recipe.group, dtype, groups=groups)


def numbers_read(frame: pd.DataFrame, columns: List[str]) -> pd.DataFrame:
    """``frame`` with its text ``columns`` read as numbers (a served model's JSON may quote them); a value
    that is not a number is a `DataError` naming its column."""
    texts = [column for column in columns if not pd.api.types.is_numeric_dtype(frame[column])]
    if not texts:
        return frame
    read = {}
    for column in texts:
        read[column] = pd.to_numeric(frame[column], errors="coerce")
        bad = read[column].isna() & frame[column].notna()
        if bad.any():
            raise DataError(column, frame[column][bad].iloc[0], f"{int(bad.sum())} value(s) of the column to predict "
                            "from are not numbers", "give numbers in that column (as in the training data)")
    return frame.assign(**read)


@dataclass
class FittedModel:
    """A fitted additive model, every tensor of it on the host (`to` moves them all); picklable (a sweep's
    processes), a pickle always holds it on the host; the MLflow model stores it as data
    (`tamrun.tracking.model_state`), on the host, so that it loads without a GPU and without unpickling.

    ``coef`` (G, D) in the order of ``groups``; ``group_chunk`` x ``row_chunk``: its predictions'
    chunks (the group chunk the fit kept and the plan's predict rows: they fitted in memory)."""

    design: AdditiveDesign
    coef: torch.Tensor
    groups: list
    recipe: DataRecipe
    dtype: torch.dtype
    group_chunk: int
    row_chunk: int
    intervals: Optional[GroupBands] = None  # its prediction intervals (tamrun/fit/intervals.py), when calibrated
    # what its training data supports (tamrun/fit/support.py): a served forecast is held to it; None in a
    # model logged before it was kept
    support: Optional[TrainingSupport] = None

    @property
    def input_columns(self) -> List[str]:
        """The columns a table to predict needs besides the derived ones: the group column (if
        any), then the effects' columns."""
        group = self.recipe.group
        return ([group] if group else []) + [c for c in self.design.columns if c != group]

    def raw_columns(self, available: Iterable[str]) -> List[str]:
        """The columns of a raw table (the data's own columns, ``available``) the model reads: the group
        column, then each effect's column or, for a derived one, what it is computed from
        (`DataRecipe.raw_sources`); each once, in that order."""
        available = list(available)
        raw = [source for column in self.input_columns for source in self.recipe.raw_sources(column, available)]
        return list(dict.fromkeys(raw))

    def batch(self, frame: pd.DataFrame) -> GroupedBatch:
        """Rows of ``frame`` as a batch of the fitted groups (`prediction_batch`)."""
        return prediction_batch(self.design, self.groups, self.recipe, self.dtype, frame)

    def to(self, device: torch.device) -> "FittedModel":
        """A copy with every tensor (design, effects' state, coefficients) on ``device``."""
        return to_device(self, device)

    def __getstate__(self) -> dict:
        return {key: to_device(value, HOST) for key, value in vars(self).items()}

    def predict(self, batch: GroupedBatch, device: torch.device = HOST) -> torch.Tensor:
        """Predictions (G, N) of a batch of the fitted groups, computed on ``device``, returned on the
        host; 0 on padding."""
        return predict_rows(self.design, self.coef, batch.x, device, self.group_chunk, self.row_chunk, batch.weight)

    def predict_values(self, frame: pd.DataFrame) -> np.ndarray:
        """One prediction per row of ``frame``, in its order (the MLflow model's output)."""
        return self.predict_with_groups(frame)[0]

    def predict_with_groups(self, frame: pd.DataFrame) -> Tuple[np.ndarray, np.ndarray]:
        """(predictions (n,), the index in ``groups`` of each row's group (n,)) of ``frame``'s rows, in its order."""
        frame = pd.DataFrame(frame).reset_index(drop=True)
        batch = self.batch(frame)
        predicted = self.predict(batch).numpy()
        out, codes = np.zeros(len(frame)), np.zeros(len(frame), dtype=np.int64)
        real = batch.row_index >= 0
        out[batch.row_index[real]] = predicted[real]
        codes[batch.row_index[real]] = np.nonzero(real)[0]
        return out, codes
