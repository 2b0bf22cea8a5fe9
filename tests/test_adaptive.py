"""mode=adaptive: sliding-window refits against a plain loop of independent static fits (float64 dense
solves on each window's rows with the design fitted on the training split), capped runs, faked OOMs,
bad input and what MLflow records. Real Hydra composition, real sqlite store, real tensors."""

from __future__ import annotations

from typing import List

import numpy as np
import pandas as pd
import pytest
import torch
from mlflow.tracking import MlflowClient

from tamrun.config.load import typed_config
from tamrun.data.batch import build_batch
from tamrun.errors import ConfigError
from tamrun.pipeline import build_features, load_splits
from tamrun.runner import run
from tamrun.solve.dispatcher import Dispatcher

from conftest import csv_overrides

NATIONAL = ["mode=adaptive", "adaptive.window=730", "split.test_end=2024-01-12"]  # 12 daily refits


def reference_loop(cfg) -> tuple:
    """For every refit k: the window's rows [t_k - window, t_k) batched on their own, Phi dense, and
    beta_k = (Phi'Phi / n + P + jitter I)^-1 Phi'y / n by torch.linalg.solve in float64; the forecast of
    [t_k, t_k + horizon). Returns (coef (K, G, D), forecast rows: list of (k, group, date, prediction))."""
    config, specs = typed_config(cfg)
    train, test = load_splits(config, specs)
    design = build_features(config, specs, train).design
    ada, data = config.adaptive, config.data
    frame = pd.concat([train, test]).sort_values(data.date_column, kind="stable")
    dates = frame[data.date_column]
    start = pd.Timestamp(config.split.test_start)
    refits = pd.date_range(start, test[data.date_column].max().normalize(), freq=f"{ada.step}D")
    horizon = ada.horizon or ada.step
    penalty = design.penalty()
    groups = sorted(train[data.group].unique().tolist()) if data.group else [0]
    coefs, rows = [], []
    for k, t in enumerate(refits):
        window = frame[(dates >= t - pd.Timedelta(days=ada.window)) & (dates < t)]
        batch = build_batch(window, design.columns, data.target, data.group, torch.float64, groups=groups)
        phi = design.design(batch.x.double()) * batch.weight.unsqueeze(-1)
        n = batch.counts.view(-1, 1, 1)
        a = phi.mT @ phi / n + penalty + config.solver.jitter * torch.eye(design.width, dtype=torch.float64)
        b = (phi.mT @ (batch.y * batch.weight).unsqueeze(-1)) / n
        beta = torch.linalg.solve(a, b).squeeze(-1)
        coefs.append(beta)
        ahead = frame[(dates >= t) & (dates < t + pd.Timedelta(days=horizon))]
        fb = build_batch(ahead, design.columns, data.target, data.group, torch.float64, groups=groups)
        predicted = (design.design(fb.x) @ beta.unsqueeze(-1)).squeeze(-1)
        real = fb.row_index >= 0
        for g in range(len(groups)):
            for i in np.nonzero(real[g])[0]:
                rows.append((k, groups[g], ahead[data.date_column].iloc[fb.row_index[g, i]], float(predicted[g, i])))
    return torch.stack(coefs), rows


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest per-(window, group) relative 2-norm difference."""
    return float((torch.linalg.vector_norm(a - b, dim=-1) / torch.linalg.vector_norm(b, dim=-1)).max())


def assert_forecast_matches(result, rows: List[tuple], tol: float) -> None:
    """Every test row's adaptive forecast is the reference forecast of the latest refit before it."""
    latest = {}
    for k, group, date, value in rows:  # a later refit overwrites an earlier one's forecast of the same row
        latest[(group, pd.Timestamp(date))] = value
    table = result.predictions
    expected = np.array([latest[(g, pd.Timestamp(d))] for g, d in zip(table["group"], table["date"])])
    scale = np.abs(table["actual"].to_numpy()).max()
    assert np.abs(table["adaptive"].to_numpy() - expected).max() <= tol * scale


@pytest.mark.parametrize("extra", [[], ["adaptive.refresh=0"], ["adaptive.refresh=1"]],
                         ids=["refresh-5", "updated-only", "recomputed-only"])
def test_national_fourier_equals_a_loop_of_static_fits(compose_cfg, extra):
    """Up/down-dated Grams (refresh 0: only the first window's Gram from its rows), recomputed ones
    (refresh 1) and a mix give the reference coefficients and forecasts within 1e-9."""
    cfg = compose_cfg(*NATIONAL, "tracking=none", "adaptive.refresh=5", *extra)
    result = run(cfg)
    coef, rows = reference_loop(cfg)
    assert result.route == "direct" and result.coef.shape == coef.shape == (12, 48, result.width)
    assert relative(result.coef, coef) <= 1e-9
    assert_forecast_matches(result, rows, 1e-9)
    assert result.metrics["windows_per_batch"] == 12 and result.metrics["oom_retries"] == 0
