"""Where each metric shows in MLflow (tamrun/tracking/metric_keys.py): the model metrics at the top level,
the others under system/ and the prefix MLflow's charts group by; read back by either name, and from runs
logged with the earlier prefixes."""

from __future__ import annotations

import pytest

from tamrun.tracking.metric_keys import logged_value, metric_key, metric_name


@pytest.mark.parametrize("name, key", [
    ("rmse_test", "rmse_test"), ("mape_validation", "mape_validation"), ("fit_seconds", "fit_seconds"),
    ("peak_memory_mib", "peak_memory_mib"), ("rmse_test_best_expert", "rmse_test_best_expert"),
    ("sweep_jobs", "sweep_jobs"), ("groups_unsupported", "groups_unsupported"), ("best_rmse_validation", "best_rmse_validation"),
    ("coverage_80_test", "system/interval/coverage_80_test"),
    ("pinball_test_naive", "system/interval/pinball_test_naive"),
    ("solve_seconds", "system/time/solve_seconds"), ("seconds_per_refit", "system/time/seconds_per_refit"),
    ("peak_memory_bytes", "system/memory/peak_memory_bytes"),
    ("working_peak_ratio", "system/memory/working_peak_ratio"), ("oom_retries", "system/memory/oom_retries"),
    ("predict_chunk_rows", "system/memory/predict_chunk_rows"), ("cg_iterations", "system/solver/cg_iterations"),
    ("gcv_score", "system/solver/gcv_score"), ("kalman_q", "system/solver/kalman_q"),
    ("n_train_rows", "system/data/n_train_rows"), ("system/memory/oom_retries", "system/memory/oom_retries"),
    ("memory/oom_retries", "system/memory/oom_retries"), ("interval/coverage_80_test", "system/interval/coverage_80_test"),
])
def test_every_metric_has_its_place(name, key):
    assert metric_key(name) == key and metric_name(key) == name.rsplit("/", 1)[-1]


def test_a_value_is_read_by_either_name_and_from_a_run_logged_before_the_prefixes():
    logged = {"solver/cg_iterations": 12.0, "rmse_test": 3.0, "peak_memory_bytes": 5.0,
              "system/time/solve_seconds": 2.0, "interval/coverage_80_test": 0.8}
    assert logged_value(logged, "cg_iterations") == logged_value(logged, "solver/cg_iterations") == 12.0
    assert logged_value(logged, "solve_seconds") == logged_value(logged, "system/time/solve_seconds") == 2.0
    assert logged_value(logged, "coverage_80_test") == 0.8  # a run logged before: its interval/ key
    assert logged_value(logged, "rmse_test") == 3.0
    assert logged_value(logged, "peak_memory_bytes") == 5.0  # an older run's plain key
    assert logged_value(logged, "oom_retries") is None
