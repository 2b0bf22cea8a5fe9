"""The validation split carved out of training, and progress reporting without a terminal."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest
import torch

from tamrun.config.schema import SplitConfig
from tamrun.data.split import carve_validation
from tamrun.errors import ConfigError, DataError
from tamrun.fit.progress import ChunkProgress, IterationProgress
from tamrun.solve.cg import CgProgress, conjugate_gradient

from conftest import synthetic_frame


def test_the_validation_period_leaves_training_and_never_touches_the_test_period():
    frame = synthetic_frame(days=400)
    train = frame[frame["date"] < "2021-01-01"]
    cfg = SplitConfig(train_end="2020-12-31", test_start="2021-01-01", validation_start="2020-12-01")
    fit, validation = carve_validation(train, cfg, "date")
    assert validation["date"].min() == pd.Timestamp("2020-12-01")
    assert validation["date"].max() == pd.Timestamp("2020-12-31 23:00")
    assert fit["date"].max() < pd.Timestamp("2020-12-01") and len(fit) + len(validation) == len(train)
    same, none = carve_validation(train, SplitConfig(), "date")  # no validation split
    assert same is train and none is None


@pytest.mark.parametrize("start,end,error,field", [
    ("2020-12-01", "2021-01-15", ConfigError, "split.validation_end"),   # reaches into the test period
    ("2020-12-01", "2020-11-01", ConfigError, "split.validation_end"),   # ends before it starts
    ("2020-13-01", None, ConfigError, "split.validation_start"),         # not a date
    ("2019-01-01", "2019-12-31", DataError, "split.validation_start"),   # no rows there
])
def test_a_bad_validation_period_names_the_field(start, end, error, field):
    train = synthetic_frame(days=366)
    cfg = SplitConfig(train_end="2020-12-31", test_start="2021-01-01", validation_start=start, validation_end=end)
    with pytest.raises(error, match=field):
        carve_validation(train, cfg, "date")


def test_progress_without_a_terminal_is_plain_log_lines(caplog):
    caplog.set_level(logging.INFO, logger="tamrun.fit.progress")
    chunks = ChunkProgress(mode="log")
    for last in (15, 31, 47):
        chunks("fit/direct", last + 1, 48)
    iterations = IterationProgress(mode="log")
    for solve, residuals in enumerate(((1e-1, 1e-3, 8.1e-7), (4e-1, 2e-3, 5e-7))):
        for i, residual in enumerate(residuals):
            iterations(CgProgress(i, residual, 1e-6, 0 if residual > 1e-6 else 48, 48))
        iterations(CgProgress(len(residuals) - 1, residuals[-1], 1e-6, 48, 48, final=True))
    lines = [r.getMessage() for r in caplog.records]
    assert "fit/direct: 48/48 groups" in lines
    # each solve's last line is its own final state (not the next solve's first residual), with no total
    assert lines[-2:] == ["CG: 2 iterations, residual 8.10e-07 / tol 1e-06, 48/48 groups converged",
                          "CG: 2 iterations, residual 5.00e-07 / tol 1e-06, 48/48 groups converged"]
    silent = ChunkProgress(mode="off")
    caplog.clear()
    silent("fit/direct", 4, 4)
    assert not caplog.records


def test_a_cg_solve_logs_its_iterations_and_worst_residual_against_the_tolerance(caplog):
    caplog.set_level(logging.INFO, logger="tamrun.fit.progress")
    rng = np.random.default_rng(0)
    phi = torch.tensor(rng.normal(size=(4, 60, 20)))
    a = phi.transpose(1, 2) @ phi / 60 + 1e-3 * torch.eye(20, dtype=torch.float64)
    b = torch.tensor(rng.normal(size=(4, 20)))
    result = conjugate_gradient(lambda v: (a @ v.unsqueeze(-1)).squeeze(-1), b, None, tol=1e-6, max_iter=2000,
                                on_iteration=IterationProgress(mode="log"))
    assert bool(result.converged.all())
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("CG:")]
    worst = float(result.relative_residual.max())
    assert lines == [f"CG: {int(result.iterations.max())} iterations, residual {worst:.2e} / tol 1e-06, "
                     "4/4 groups converged"]
    assert worst <= 1e-6 and "/2000" not in caplog.text


def test_the_time_left_is_the_pace_so_far_and_the_cg_s_is_its_residual_s_mean_decrease():
    from tamrun.fit.progress import cg_left, time_left

    assert time_left(12, 48, 6.0) == ", 6 s elapsed, about 18 s left"   # 12 groups in 6 s: 36 more in 18 s
    assert time_left(0, 48, 3.0) == ", 3 s elapsed" and time_left(5, None, 3.0) == ", 3 s elapsed"
    assert time_left(48, 48, 10.0) == ""                                   # done: nothing left to say
    # 1e-1 -> 1e-3 in 2 iterations (one decade each): 3 more decades to 1e-6, at 2 s an iteration
    assert cg_left(1e-1, 1e-3, 1e-6, 2, 4.0) == ", about 3 iterations (6 s) left"
    assert cg_left(1e-1, 1e-1, 1e-6, 3, 4.0) == ""                          # no decrease yet: no guess
    assert cg_left(1e-1, 5e-7, 1e-6, 9, 4.0) == ""                          # at the tolerance
