"""adaptive.method=kalman: the batched recursion against dense float64 references (recursive least squares
for q = 0, the joint least-squares problem over the whole path for q > 0, a case worked by hand), batched
groups and pairs against a loop, the day grid, the effects' contributions, and runs through the real
runner (Hydra composition, a real sqlite MLflow store) that pin that the test period never reaches the
selection, that a tight budget or a faked OOM changes nothing, and that bad settings are refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from mlflow.tracking import MlflowClient

import tamrun.adaptive.filtering
from tamrun.adaptive.filtering import FilterInputs, check_input_room, filter_cost, run_filters
from tamrun.adaptive.kalman import FilterState, kalman_filter
from tamrun.adaptive.state_space import day_grid, effect_contributions
from tamrun.config.load import typed_config
from tamrun.config.schema import KalmanState, OomConfig
from tamrun.errors import ConfigError, DataError, MemoryBudgetError
from tamrun.memory.guard import ChunkLoop, OomLog
from tamrun.machine.tracker import MemoryTracker
from tamrun.pipeline import build_features, load_splits
from tamrun.runner import run

from conftest import PRICED, assert_priced, by_name, csv_overrides, synthetic_frame

F64 = torch.float64


def random_series(seed: int, groups: int = 3, days: int = 40, rows: int = 2, k: int = 3):
    """inputs (G, T, R, k), target (G, T, R) from drifting weights, all rows learnt from."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(groups, days, rows, k, generator=gen, dtype=F64)
    theta = 1.0 + 0.1 * torch.randn(groups, days, 1, k, generator=gen, dtype=F64).cumsum(1)
    y = (x * theta).sum(-1) + 0.3 * torch.randn(groups, days, rows, generator=gen, dtype=F64)
    return x, y, torch.ones(groups, days, rows, dtype=torch.bool)


def run_filter(x, y, update, q: float, p0: float, theta0=None):
    """One pair over every series: (forecast (G, T, R), final state)."""
    theta0 = torch.zeros(x.shape[0], x.shape[-1], dtype=F64) if theta0 is None else theta0
    state = FilterState.initial(theta0, torch.full((x.shape[0],), p0, dtype=F64))
    forecast = kalman_filter(x, y, update, torch.tensor([q], dtype=F64), state)
    return forecast[0], state


def test_with_q_0_the_filter_is_recursive_least_squares():
    """q = 0: the state after the days before t minimises sum_i (y_i - psi_i' theta)^2 + |theta - theta_0|^2 / p0
    over those days' rows (a dense float64 solve per day); day t's forecasts use it. Tolerance 1e-9 relative."""
    x, y, update = random_series(0)
    theta0 = torch.full((3, 3), 0.5, dtype=F64)
    forecast, state = run_filter(x, y, update, 0.0, 2.0, theta0)
    k = x.shape[-1]
    for g in range(3):
        for t in range(x.shape[1] + 1):
            rows_x, rows_y = x[g, :t].reshape(-1, k), y[g, :t].reshape(-1)
            a = rows_x.T @ rows_x + torch.eye(k, dtype=F64) / 2.0
            theta = torch.linalg.solve(a, rows_x.T @ rows_y + theta0[g] / 2.0)
            if t < x.shape[1]:
                torch.testing.assert_close(forecast[g, t], x[g, t] @ theta, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(state.theta[g], theta, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(state.cov[g], torch.linalg.inv(a), rtol=1e-9, atol=1e-12)


def test_with_q_above_0_the_last_state_solves_the_joint_least_squares_problem():
    """q > 0: the filter's last mean is the last component of argmin over the path theta_0..theta_T of
    |theta_0 - m|^2 / p0 + sum_t |theta_t - theta_{t-1}|^2 / q + sum_{t, r} (y_tr - psi_tr' theta_t)^2
    (one dense float64 system of (T + 1) k unknowns). Tolerance 1e-8 relative."""
    x, y, update = random_series(1, groups=1, days=25, rows=2, k=2)
    q, p0, k, days = 0.05, 3.0, 2, 25
    _, state = run_filter(x, y, update, q, p0, torch.ones(1, k, dtype=F64))
    n = (days + 1) * k
    a, b = torch.zeros(n, n, dtype=F64), torch.zeros(n, dtype=F64)
    a[:k, :k] += torch.eye(k, dtype=F64) / p0
    b[:k] += 1.0 / p0
    for t in range(1, days + 1):
        prev, cur = slice((t - 1) * k, t * k), slice(t * k, (t + 1) * k)
        eye = torch.eye(k, dtype=F64) / q
        a[prev, prev] += eye
        a[cur, cur] += eye
        a[prev, cur] -= eye
        a[cur, prev] -= eye
        rows_x, rows_y = x[0, t - 1], y[0, t - 1]
        a[cur, cur] += rows_x.T @ rows_x
        b[cur] += rows_x.T @ rows_y
    path = torch.linalg.solve(a, b)
    torch.testing.assert_close(state.theta[0], path[-k:], rtol=1e-8, atol=1e-8)


def test_a_scalar_filter_worked_by_hand():
    """psi = 1, theta_0 = 0, p0 = 1, q = 0.5, y = 2 then 0.2:
    day 1: P = 1.5, forecast 0, f = 2.5, K = 0.6, theta = 1.2, P = 0.6;
    day 2: P = 1.1, forecast 1.2, f = 2.1, K = 11/21, theta = 1.2 - 11/21, P = 1.1 - 1.21/2.1;
    day 3 (not learnt from): P = P + 0.5, forecast theta."""
    x = torch.ones(1, 3, 1, 1, dtype=F64)
    y = torch.tensor([[[2.0], [0.2], [9.0]]], dtype=F64)
    update = torch.tensor([[[True], [True], [False]]])
    forecast, state = run_filter(x, y, update, 0.5, 1.0)
    theta2 = 1.2 - 11.0 / 21.0
    torch.testing.assert_close(forecast[0, :, 0], torch.tensor([0.0, 1.2, theta2], dtype=F64), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state.theta[0, 0], torch.tensor(theta2, dtype=F64), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state.cov[0, 0, 0], torch.tensor(1.1 - 1.21 / 2.1 + 0.5, dtype=F64),
                               rtol=1e-12, atol=1e-12)
    # sigma^2: the mean of e^2 / f over the two learnt rows
    torch.testing.assert_close(state.sigma2[0], torch.tensor((4 / 2.5 + 1.0 / 2.1) / 2, dtype=F64), rtol=1e-12, atol=0)


def test_batched_groups_and_pairs_equal_a_loop_over_each():
    """C pairs x G series as one recursion equal each (pair, series) filtered alone (1e-12 relative)."""
    x, y, update = random_series(2, groups=4, days=30, rows=3, k=3)
    update[1, 5:9] = False  # a series with days it does not learn from
    update[:, :, 2] = torch.rand(4, 30, generator=torch.Generator().manual_seed(3)) > 0.5  # ragged days
    pairs = [(0.0, 1.0), (1e-3, 0.5), (0.1, 4.0)]
    q = torch.tensor([p[0] for p in pairs], dtype=F64)
    p0 = torch.tensor([p[1] for p in pairs], dtype=F64).repeat_interleave(4)
    theta0 = torch.randn(4, 3, generator=torch.Generator().manual_seed(4), dtype=F64)
    state = FilterState.initial(theta0.repeat(3, 1), p0)
    weights = torch.zeros(3, 4, 30, 3, dtype=F64)
    batched = kalman_filter(x, y, update, q, state, weights)
    for c, (qc, pc) in enumerate(pairs):
        for g in range(4):
            alone, single = run_filter(x[g:g + 1], y[g:g + 1], update[g:g + 1], qc, pc, theta0[g:g + 1])
            torch.testing.assert_close(batched[c, g], alone[0], rtol=1e-12, atol=1e-10)
            torch.testing.assert_close(state.theta[c * 4 + g], single.theta[0], rtol=1e-12, atol=1e-10)
            torch.testing.assert_close(weights[c, g, -1], single.theta[0], rtol=1e-12, atol=1e-10)
            torch.testing.assert_close(state.sigma2[c * 4 + g], single.sigma2[0], rtol=1e-12, atol=0)


def test_rows_not_learnt_from_leave_the_weights_alone():
    """A day whose rows are all skipped moves neither theta nor P (but for the drift q)."""
    x, y, update = random_series(5, groups=2, days=10, rows=1, k=2)
    update[:, 4] = False
    y_changed = y.clone()
    y_changed[:, 4] += 1e6
    first, _ = run_filter(x, y, update, 1e-2, 1.0)
    second, _ = run_filter(x, y_changed, update, 1e-2, 1.0)
    torch.testing.assert_close(first, second, rtol=0, atol=0)


def test_the_day_grid_places_every_row_once_in_date_order():
    dates = np.array([["2024-01-01T10", "2024-01-01T08", "2024-01-03T00", "2262-04-11"],
                      ["2024-01-02T00", "2024-01-02T05", "2024-01-02T01", "2024-01-04T00"]], dtype="datetime64[ns]")
    real = np.array([[True, True, True, False], [True, True, True, True]])
    grid = day_grid(dates, real)
    assert list(grid.days.astype(str)) == ["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-04"]
    np.testing.assert_array_equal(grid.day, [[0, 0, 2, -1], [1, 1, 1, 3]])
    np.testing.assert_array_equal(grid.slot, [[1, 0, 0, -1], [0, 2, 1, 0]])
    assert grid.shape == (4, 3)
    placed = grid.place(torch.arange(8, dtype=F64).reshape(2, 4) + 1, fill=0.0)
    assert placed.shape == (2, 4, 3)
    assert placed[0, 0].tolist() == [2.0, 1.0, 0.0] and placed[1, 1].tolist() == [5.0, 7.0, 6.0]
    assert int((placed > 0).sum()) == 7


def test_the_effects_contributions_sum_to_the_static_forecast(compose_cfg, csv_path):
    cfg = compose_cfg(*csv_overrides(csv_path), "tracking=none")
    config, specs = typed_config(cfg)
    splits = load_splits(config, specs)
    features = build_features(config, specs, splits.train)
    design = features.design
    coef = torch.randn(features.train.x.shape[0], design.width, generator=torch.Generator().manual_seed(0), dtype=F64)
    parts = effect_contributions(design, coef, features.train.x, torch.device("cpu"), row_chunk=100)
    assert parts.shape[-1] == len(design.blocks) == 3  # intercept, sx, dow
    dense = design.design(features.train.x)
    torch.testing.assert_close(parts.sum(-1), (dense @ coef.unsqueeze(-1)).squeeze(-1), rtol=1e-12, atol=1e-9)
    sx = [b for b in design.blocks if b.name == "sx"][0]
    torch.testing.assert_close(parts[..., 1], (dense[..., sx.start:sx.stop] @ coef[:, sx.start:sx.stop].unsqueeze(-1))
                               .squeeze(-1), rtol=1e-12, atol=1e-9)


# ---- through the runner ---------------------------------------------------------------------------

def drifting_csv(path: Path, test_scale: float = 1.0) -> Path:
    """The synthetic table with a level that drifts over the days (what the filter adapts to); the test
    period's target (2021) multiplied by ``test_scale``."""
    frame = synthetic_frame(days=500)
    day = (frame["date"] - frame["date"].min()).dt.days.to_numpy()
    frame["y"] = frame["y"] + 0.004 * day
    frame.loc[frame["date"] >= "2021-01-01", "y"] *= test_scale
    frame.to_csv(path, index=False)
    return path


KALMAN = ["mode=adaptive", "adaptive.method=kalman", "split.validation_start=2020-10-01",
          "adaptive.kalman.q=[0,1e-4,1e-3]", "adaptive.kalman.p0=[1,10]"]


def kalman_run(compose_cfg, path: Path, *extra: str):
    return run(compose_cfg(*csv_overrides(path), *KALMAN, *extra))


def test_the_test_period_never_reaches_the_selection(compose_cfg, store_uri, tmp_path):
    """The same run on two tables that differ only in the test period's targets chooses the same pair on
    the same validation scores; the test scores differ. The filter beats the static model on a drift."""
    first = kalman_run(compose_cfg, drifting_csv(tmp_path / "a.csv"), *PRICED)
    second = kalman_run(compose_cfg, drifting_csv(tmp_path / "b.csv", test_scale=3.0))
    client = MlflowClient(store_uri)
    chosen = []
    for result in (first, second):
        assert client.get_run(result.run_id).info.status == "FINISHED"
        local = client.download_artifacts(result.run_id, "kalman/selection.json", str(tmp_path / result.run_id))
        chosen.append(json.loads(Path(local).read_text()))
    assert chosen[0] == chosen[1] and len(chosen[0]["pairs"]) == 6
    assert first.metrics["rmse_validation"] == second.metrics["rmse_validation"]
    assert first.metrics["rmse_test"] != second.metrics["rmse_test"]
    assert chosen[0]["chosen"]["q"] > 0  # a drifting level: a filter that adapts wins on validation
    assert first.metrics["rmse_test"] < first.metrics["rmse_test_static"]
    assert first.metrics["rmse_validation"] < first.metrics["rmse_validation_static"]
    assert_priced(by_name(client.get_run(first.run_id).data.metrics), "kalman_test_seconds", "static_fit_seconds")
    history = client.get_metric_history(first.run_id, "rmse_month")
    assert len(history) == 5  # 2021-01 to 2021-05 (500 days from 2020-01-01 end on 2021-05-14)


def test_a_tight_budget_and_a_faked_oom_change_nothing(compose_cfg, tmp_path, monkeypatch):
    """One group per chunk (a budget that holds one group's filters) and an OOM raised on purpose by the
    first chunk of the filters (a fake, to take the retry path) give the same forecasts, bit for bit."""
    path = drifting_csv(tmp_path / "a.csv")
    reference = kalman_run(compose_cfg, path, "tracking=none")
    real_filter, calls = tamrun.adaptive.filtering.kalman_filter, []

    def fail_once(inputs, *args, **kwargs):
        calls.append(inputs.shape[0])
        if len(calls) == 1 and inputs.shape[0] > 1:
            raise torch.OutOfMemoryError("fake OOM raised on purpose by the test")
        return real_filter(inputs, *args, **kwargs)

    monkeypatch.setattr(tamrun.adaptive.filtering, "kalman_filter", fail_once)
    faked = kalman_run(compose_cfg, path, "tracking=none")
    assert faked.metrics["oom_retries"] >= 1 and calls[0] == 3 and calls[1] < 3  # retried with fewer groups
    pd.testing.assert_frame_equal(faked.predictions, reference.predictions, check_exact=True)


def test_the_filters_take_as_many_groups_as_the_budget_holds_and_refuse_less_than_one():
    """run_filters' group chunk is budget // (overhead x one group's cost); the forecasts do not depend on
    it (bit for bit); a budget below one group's filters is a MemoryBudgetError naming the settings."""
    x, y, update = random_series(6, groups=5, days=20, rows=2, k=3)
    data = FilterInputs(None, x, y, update, update, torch.ones(5, 3, dtype=F64), ["a", "b", "c"], None, None)
    pairs = [(1e-3, 1.0), (1e-2, 2.0)]
    one_group = filter_cost(data, len(pairs), False).bytes(1, 0, 1.0)
    loop = ChunkLoop(OomConfig(), OomLog(), MemoryTracker(None, 1.0))
    whole = run_filters(data, pairs, 10, loop, budget=10 * one_group, overhead=1.0)
    chunked = run_filters(data, pairs, 10, loop, budget=2 * one_group, overhead=1.0)
    assert (whole.groups, chunked.groups) == (5, 2)
    torch.testing.assert_close(chunked.forecast, whole.forecast, rtol=0, atol=0)
    with pytest.raises(MemoryBudgetError, match=r"adaptive\.kalman.*Fix: give fewer \(q, p0\) pairs"):
        run_filters(data, pairs, 10, loop, budget=one_group - 1, overhead=1.0)


def test_inputs_beyond_the_budget_are_refused_before_they_are_built():
    """The inputs of every design column of a wide model over many rows: a MemoryBudgetError that names
    adaptive.kalman.state and the way out, before anything is allocated."""
    with pytest.raises(MemoryBudgetError, match=r"^adaptive\.kalman\.state='coefficients': .*Fix: use "
                                                r"adaptive\.kalman\.state=effects"):
        check_input_room(2 * (3211 + 2) * 4_700 * 48 * 8, 1 << 30, KalmanState.coefficients)
    check_input_room(1 << 20, 1 << 30, KalmanState.effects)  # fits: nothing raised


def test_the_coefficients_state_adapts_every_column(compose_cfg, tmp_path):
    """state=coefficients: psi is the design row and theta_0 the coefficients; with q = 0 and a tiny p0
    the filter holds the static forecast (up to p0's pull: 1e-6 relative)."""
    path = drifting_csv(tmp_path / "a.csv")
    held = run(compose_cfg(*csv_overrides(path), "mode=adaptive", "adaptive.method=kalman", "tracking=none",
                           "adaptive.kalman.state=coefficients", "adaptive.kalman.q=[0]", "adaptive.kalman.p0=[1e-12]"))
    table = held.predictions
    np.testing.assert_allclose(table["adaptive"], table["static"], rtol=1e-6)
    moving = run(compose_cfg(*csv_overrides(path), "mode=adaptive", "adaptive.method=kalman", "tracking=none",
                             "adaptive.kalman.state=coefficients", "adaptive.kalman.q=[1e-3]"))
    assert moving.metrics["rmse_test"] < moving.metrics["rmse_test_static"]


@pytest.mark.parametrize("override, field", [
    ("adaptive.kalman.q=[-1e-3]", "adaptive.kalman.q"),
    ("adaptive.kalman.p0=[0]", "adaptive.kalman.p0"),
    ("adaptive.kalman.q=[]", "adaptive.kalman.q"),
    ("split.validation_start=null", "split.validation_start"),  # 6 pairs and nothing to choose on
])
def test_bad_kalman_settings_are_refused_with_the_field_and_a_fix(compose_cfg, tmp_path, override, field):
    cfg = compose_cfg(*csv_overrides(drifting_csv(tmp_path / "a.csv")), *KALMAN, "tracking=none", override)
    with pytest.raises(ConfigError, match=rf"^{field}=.*Fix: .*"):
        run(cfg)


def test_a_skip_updates_column_missing_from_the_data_is_named(compose_cfg, tmp_path):
    cfg = compose_cfg(*csv_overrides(drifting_csv(tmp_path / "a.csv")), *KALMAN, "tracking=none",
                      "adaptive.kalman.skip_updates=[holiday]")
    with pytest.raises(DataError, match=r"adaptive\.kalman\.skip_updates\[0\]='holiday': no such column"):
        run(cfg)


def test_day_ahead_beats_1300_mw_on_2024_with_every_choice_made_on_2023(compose_cfg, store_uri):
    """The acceptance run of +experiment=day_ahead on the embedded national data: FINISHED, 2024 test RMSE
    <= 1,300 MW, the pair chosen on 2023 (logged), the static spline-with-holidays model beaten."""
    result = run(compose_cfg("+experiment=day_ahead", "tracking.log_plots=false"))
    run_info = MlflowClient(store_uri).get_run(result.run_id)
    assert run_info.info.status == "FINISHED"
    metrics = by_name(run_info.data.metrics)
    assert metrics["rmse_test"] <= 1300.0
    assert metrics["rmse_test"] < metrics["rmse_test_static"]
    assert metrics["rmse_validation"] < metrics["rmse_validation_static"]
    assert metrics["kalman_q"] in (1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4)
    for level in (80, 95):  # the intervals: calibrated on 2023's day-ahead residuals, adapted online over 2024
        assert abs(metrics[f"coverage_{level}_test"] - level) <= 2.0
        assert metrics[f"width_{level}_test"] < metrics[f"width_{level}_test_naive"]
