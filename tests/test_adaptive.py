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
import tamrun.adaptive.fit
import tamrun.fit.dispatcher
from tamrun.solve.assembly import solve_normal_equations as real_solve

from conftest import PRICED, assert_priced, by_name, csv_overrides

NATIONAL = ["mode=adaptive", "adaptive.window=730", "split.test_end=2024-01-12"]  # 12 daily refits


def reference_loop(cfg) -> tuple:
    """For every refit k: the window's rows [t_k - window, t_k) batched on their own, Phi dense, and
    beta_k = (Phi'Phi / n + P + jitter I)^-1 Phi'y / n by torch.linalg.solve in float64; the forecast of
    [t_k, t_k + horizon). Returns (coef (K, G, D), forecast rows: list of (k, group, date, prediction))."""
    config, specs = typed_config(cfg)
    splits = load_splits(config, specs)
    train, test = splits.train, splits.test
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


def test_a_tenth_of_the_adaptive_peak_gives_the_same_results(compose_cfg):
    """memory.limit = 1/10 of the uncapped run's measured working peak (adaptive phase): fewer windows
    per batch, the same Grams (the running sum goes window by window whatever the batch), the same
    coefficients and forecasts."""
    free = run(compose_cfg(*NATIONAL, "tracking=none", "hw=cpu"))  # the CPU's working memory
    peak = free.metrics["working_peak_bytes"]
    assert 0 < peak <= 1.25 * free.metrics["predicted_batch_bytes"]
    limit = int(peak / 10)
    capped = run(compose_cfg(*NATIONAL, "tracking=none", "hw=cpu", f"memory.limit={limit}"))
    assert capped.metrics["windows_per_batch"] < free.metrics["windows_per_batch"]
    assert capped.metrics["working_peak_bytes"] <= limit
    assert capped.metrics["tracker_peak_bytes"] <= capped.metrics["window_budget_bytes"]
    assert relative(capped.coef, free.coef) <= 1e-12
    assert capped.metrics["rmse_test"] == pytest.approx(free.metrics["rmse_test"], rel=1e-12)
    # one window of 48 groups does not fit in 30 MiB: one window of fewer groups per batch
    fewer = run(compose_cfg(*NATIONAL, "tracking=none", "hw=cpu", "memory.limit=30MiB"))
    assert fewer.metrics["windows_per_batch"] == 1 and fewer.metrics["groups_per_batch"] < 48
    assert relative(fewer.coef, free.coef) <= 1e-12


def test_faked_ooms_shrink_the_window_batches_and_mlflow_records_the_run(compose_cfg, store_uri, monkeypatch):
    """A fake torch.OutOfMemoryError (raised on purpose by the test) whenever one solve holds more than
    4 windows x 48 groups: the guard shrinks the batch 12 -> 8 -> 5 -> 3 windows, the results do not
    change, and MLflow records the stepped metrics, the batches, the budget, the OOM events and the plot."""
    clean = run(compose_cfg(*NATIONAL, "tracking=none"))
    sizes = []

    def solve_normal_equations(gram, *args, **kwargs):
        sizes.append(gram.shape[0])
        if gram.shape[0] > 4 * 48:
            raise torch.OutOfMemoryError("fake OOM raised by the test")
        return real_solve(gram, *args, **kwargs)

    monkeypatch.setenv("OOM_DELAY_MS", "0")
    for module in (tamrun.fit.dispatcher, tamrun.adaptive.fit):  # the static fit's and the windows' solves
        monkeypatch.setattr(module, "solve_normal_equations", solve_normal_equations)
    result = run(compose_cfg(*NATIONAL, *PRICED))
    assert [s // 48 for s in sizes[1:5]] == [12, 8, 5, 3]  # sizes[0]: the static fit's 48 groups
    assert result.metrics["oom_retries"] == 3 and result.metrics["windows_per_batch"] == 3
    assert relative(result.coef, clean.coef) <= 1e-12

    client = MlflowClient(tracking_uri=store_uri)
    logged = client.get_run(result.run_id)
    assert logged.info.status == "FINISHED"
    metrics = by_name(logged.data.metrics)
    assert metrics["oom_retries"] == 3 and metrics["windows_per_batch"] == 3 and metrics["window_batches"] == 4
    assert_priced(metrics, "static_fit_seconds", "adaptive_fit_seconds")
    assert metrics["window_budget_bytes"] > 0 and metrics["rmse_test"] == pytest.approx(result.metrics["rmse_test"])
    assert metrics["rmse_test_static"] > 0 and metrics["seconds_per_refit"] > 0
    history = client.get_metric_history(result.run_id, "rmse_step")
    assert sorted(m.step for m in history) == list(range(12))
    table = result.predictions
    first_day = table[table["refit"] == table["refit"].min()]  # horizon = step: refit 0's horizon is its own day
    step0 = [m.value for m in history if m.step == 0][0]
    assert step0 == pytest.approx(float(np.sqrt(((first_day["actual"] - first_day["adaptive"]) ** 2).mean())), rel=1e-9)
    assert logged.data.params["adaptive.window"] == "730" and logged.data.params["route"] == "direct"
    paths = {a.path for folder in ("plots", "predictions", "memory") for a in client.list_artifacts(result.run_id, folder)}
    assert {"plots/adaptive_forecast.png", "predictions/adaptive.csv", "memory/adaptive.json"} <= paths
    events = open(client.download_artifacts(result.run_id, "memory/adaptive.json")).read()
    assert '"size_before": 12' in events and '"size_after": 8' in events


EVERY_EFFECT = [
    "+model.effects.lin={kind: linear, column: x, ap: -4}",
    "+model.effects.fx={kind: fourier, column: x, m: 3, ap: -4}",
    "+model.effects.fr={kind: forest, column: x, others: [dow], n_trees: 4, max_depth: 3, ap: -3}",
    "+model.effects.cr={kind: crossing, left: {kind: forest, column: x, n_trees: 2, max_depth: 2, ap: -3}, "
    "right: {kind: fourier, column: x, m: 2, ap: -3}, ap: -3}",
]


@pytest.mark.parametrize("route, overrides, tol", [
    ("direct", ["solver=direct", "adaptive.window=30", "adaptive.refresh=3"], 1e-9),
    ("dual", ["solver=direct", "adaptive.window=4"], 1e-9),  # 32 rows per window < D: the N x N dual form
    ("cg", ["solver=cg", "solver.tol=1e-13", "solver.max_iter=5000", "adaptive.window=30"], 1e-8),
], ids=["direct-updated", "direct-dual", "cg-warm-started"])
def test_every_effect_type_on_every_route_equals_the_loop(compose_cfg, csv_path, route, overrides, tol):
    """Spline, categorical, linear, Fourier, forest and forest x Fourier on the synthetic CSV: weekly
    refits (horizon 10 days) on each route; CG to a relative residual of 1e-13 (hence 1e-8)."""
    cfg = compose_cfg(*csv_overrides(csv_path), *EVERY_EFFECT, "mode=adaptive", "tracking=none",
                      "adaptive.step=7", "adaptive.horizon=10", *overrides)
    result = run(cfg)
    coef, rows = reference_loop(cfg)
    assert result.route == ("direct" if route == "dual" else route)
    assert result.plan.dual == (route == "dual")
    assert result.coef.shape == coef.shape and coef.shape[0] == 5
    assert relative(result.coef, coef) <= tol
    assert_forecast_matches(result, rows, tol)


@pytest.mark.parametrize("override, field", [
    ("adaptive.window=400", "adaptive.window"),  # the training data holds 366 days
    ("adaptive.step=0", "adaptive.step"),
    ("adaptive.horizon=3", "adaptive.horizon"),  # shorter than the 7-day step
    ("adaptive.refresh=-1", "adaptive.refresh"),
    ("split.validation_start=2020-11-01", "split.validation_start"),  # would leave a gap in the windows
])
def test_bad_adaptive_settings_are_refused_with_the_field_and_a_fix(compose_cfg, csv_path, override, field):
    cfg = compose_cfg(*csv_overrides(csv_path), "mode=adaptive", "tracking=none", "adaptive.step=7", override)
    with pytest.raises(ConfigError, match=rf"^{field}=.*Fix: .*"):
        run(cfg)
