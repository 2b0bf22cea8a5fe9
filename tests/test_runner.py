"""run(cfg) end to end on real Hydra composition and a real sqlite MLflow store."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

import tamrun
from tamrun.errors import DataError
from tamrun.numbers import significant
from tamrun.runner import run
from tamrun.machine.threads import applied_wait_policy, job_threads

from conftest import by_name, csv_overrides

PEER_RMSE = {"fourier": 1659.2, "spline": 1586.6}  # tam-ml 1.5.0, same data, split and formula


def read_run(store_uri: str, run_id: str):
    client = MlflowClient(tracking_uri=store_uri)
    return client, client.get_run(run_id)


def artifact_paths(client: MlflowClient, run_id: str, path: str = "") -> set:
    out = set()
    for item in client.list_artifacts(run_id, path):
        out |= artifact_paths(client, run_id, item.path) if item.is_dir else {item.path}
    return out


@pytest.mark.parametrize("model", ["fourier", "spline"])
def test_national_preset_matches_the_peer_and_is_recorded(compose_cfg, store_uri, tmp_path, model):
    result = run(compose_cfg(f"model={model}"), overrides=[f"model={model}"])
    assert result.metrics["rmse_test"] <= 1.02 * PEER_RMSE[model]
    assert result.route == "direct" and result.coef.shape == (48, result.width)

    client, logged = read_run(store_uri, result.run_id)
    assert logged.info.status == "FINISHED"
    params = logged.data.params
    assert params["model.name"] == model and params["route"] == "direct"
    assert params["D"] == str(result.width) and params["data.group"] == "tod"
    # params are the experiment's settings: the preset's effects and the axes of every comparison, not the
    # schema's untouched defaults, the tracking settings, other modes' settings or the plan's outcomes
    assert {"model.effects.toy.ap", "dtype", "solver.name", "split.test_start", "data.name"} <= set(params)
    assert not {"memory.dense_fraction", "tracking.uri", "adaptive.window", "route_reason", "chunk_groups",
                "progress"} & set(params), sorted(params)
    assert logged.data.tags["route_reason"].startswith("D=")
    # a single run's torch threads on the CPU: every usable core (at most OMP_NUM_THREADS), and why
    # (tamrun.machine.threads); on a GPU torch's CPU threads are not set, nor tagged
    threads = job_threads(None)
    if logged.data.tags["device_kind"] == "cpu":
        assert (logged.data.tags["threads"], logged.data.tags["threads_reason"]) == (str(threads.count), threads.reason)
        # how they wait between parallel regions: this process's policy (pytest's: not set by tamrun)
        assert logged.data.tags["omp_wait"] == applied_wait_policy()
    else:
        assert "threads" not in logged.data.tags
    assert "single run: all " in threads.reason
    inputs = {i.tags[0].value: i.dataset for i in logged.inputs.dataset_inputs}  # context -> dataset
    assert set(inputs) == {"training", "testing"} and inputs["testing"].name == "national"
    assert json.loads(inputs["testing"].profile)["num_rows"] == 17_568 and inputs["testing"].digest != inputs["training"].digest
    assert json.loads(inputs["training"].source)["uri"].endswith("force_national.csv.gz")
    # the limit the plan fitted under: on the CPU one of the host's (the RAM, typically), on a GPU its memory
    assert params["memory_bound_by"] == result.plan.bound_by
    host_limits = ("available RAM", "cgroup", "RLIMIT_AS", "RLIMIT_DATA")
    assert result.plan.bound_by in (host_limits if logged.data.tags["device_kind"] == "cpu" else ("device memory",))
    # the decisive metrics at the top level, the others grouped by the prefix MLflow's chart view groups on
    assert {"rmse_test", "fit_seconds", "peak_memory_mib", "system/memory/oom_retries", "system/time/predict_seconds",
            "system/data/n_train_rows", "system/interval/coverage_80_test"} <= set(logged.data.metrics)
    metrics = by_name(logged.data.metrics)
    for name in ("rmse_train", "rmse_test", "mape_train", "mape_test", "fit_seconds", "predict_seconds",
                 "peak_memory_bytes", "oom_retries", "predicted_peak_bytes", "working_peak_bytes",
                 "working_peak_solve_bytes", "peak_memory_solve_bytes", "minimal_limit_bytes", "chunk_rows"):
        assert name in metrics, name
    assert metrics["rmse_test"] == pytest.approx(result.metrics["rmse_test"], rel=1e-12)
    assert metrics["oom_retries"] == 0 and metrics["peak_memory_bytes"] > 0
    assert metrics["peak_memory_mib"] == pytest.approx(metrics["peak_memory_bytes"] / 2**20)  # the UI's column
    # the plan's working-memory prediction beside the measured working peak of the phases it plans, apart
    # from the process's peak; the run's log says the three
    planned = max(metrics["working_peak_solve_bytes"], metrics["working_peak_predict_bytes"])
    assert metrics["working_peak_planned_bytes"] == planned > 0
    assert metrics["working_peak_ratio"] == pytest.approx(planned / metrics["predicted_peak_bytes"], rel=1e-12)
    assert metrics["peak_memory_bytes"] > metrics["working_peak_planned_bytes"]
    run_log = open(client.download_artifacts(result.run_id, "logs/run.log", str(tmp_path))).read()
    assert f"memory: working peak {significant(planned / 2**20)} MiB of the fit and predictions against " \
           f"{significant(metrics['predicted_peak_bytes'] / 2**20)} MiB predicted" in run_log
    tags = logged.data.tags
    assert tags["tamrun_version"] and tags["device"].startswith("cpu") and tags["mlflow.source.name"] == "python -m tamrun"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(tamrun.__file__).parent, capture_output=True,
                          text=True) if shutil.which("git") else None
    if head is not None and head.returncode == 0:  # running from a git checkout
        assert tags["mlflow.source.git.commit"] == head.stdout.strip()
    paths = artifact_paths(client, result.run_id)
    assert {"config/resolved.yaml", "config/overrides.txt", "predictions/predictions.parquet",
            "plots/forecast.png", "fit/coefficients.csv", "memory/report.json", "memory/report.txt",
            "plots/memory_timeline.png"} <= paths
    local = client.download_artifacts(result.run_id, "predictions/predictions.parquet", str(tmp_path))
    logged_predictions = pd.read_parquet(local)
    test = logged_predictions[logged_predictions["split"] == "test"]
    assert len(test) == 17_568  # every half-hour of 2024
    rmse = float(np.sqrt(np.mean((test["actual"] - test["predicted"]) ** 2)))
    assert rmse == pytest.approx(result.metrics["rmse_test"], rel=1e-9)
    overrides = open(client.download_artifacts(result.run_id, "config/overrides.txt", str(tmp_path))).read()
    assert f"model={model}" in overrides


def test_a_failing_run_is_left_failed_with_the_error(compose_cfg, store_uri):
    cfg = compose_cfg("model.effects.temp.column=no_such_column")
    with pytest.raises(DataError, match="model.effects.temp.column"):
        run(cfg)
    runs = MlflowClient(tracking_uri=store_uri).search_runs(["1"])
    assert len(runs) == 1
    assert runs[0].info.status == "FAILED"
    assert runs[0].data.tags["error_type"] == "DataError"
    assert "no_such_column" in runs[0].data.tags["error"]


def test_user_csv_with_direct_and_float32_cg(compose_cfg, store_uri, csv_path):
    direct = run(compose_cfg(*csv_overrides(csv_path), "solver=direct"))
    assert direct.route == "direct" and direct.metrics["rmse_test"] < 0.15  # noise sd 0.1
    # Jacobi: block-Jacobi would invert this all-dense model's whole system (one iteration)
    cg = run(compose_cfg(*csv_overrides(csv_path), "solver=cg", "dtype=float32", "solver.preconditioner=jacobi"))
    assert cg.route == "cg" and cg.coef.dtype.is_floating_point
    assert cg.metrics["rmse_test"] == pytest.approx(direct.metrics["rmse_test"], rel=1e-3)
    client = MlflowClient(tracking_uri=store_uri)
    statuses = {client.get_run(r.run_id).info.status for r in (direct, cg)}
    assert statuses == {"FINISHED"}
    assert client.get_run(cg.run_id).data.params["data.source"] == "file"
    history = client.get_metric_history(cg.run_id, "system/solver/cg_residual")
    assert len(history) > 2 and history[-1].value < history[0].value


def test_forest_preset_matches_the_peer_with_leaf_indices_and_cg(compose_cfg):
    result = run(compose_cfg("model=forest", "tracking=none"))
    assert result.route == "cg" and result.width == 1 + 1 + 8 + 1 + 50 * 64
    assert result.stats.cg_unconverged_groups == 0 and result.stats.cg_final_residual <= 1e-6
    assert result.metrics["rmse_test"] <= 1.02 * 1683.5  # the peer's forest RMSE, same formula


def test_cg_warm_start_from_a_logged_run_needs_fewer_iterations(compose_cfg, store_uri, csv_path):
    """solver.warm_start takes the coefficients.csv an earlier run logged; a wrong file is refused."""
    from tamrun.errors import ConfigError

    overrides = csv_overrides(csv_path) + ["solver=cg", "solver.preconditioner=jacobi", "solver.tol=1e-10"]
    cold = run(compose_cfg(*overrides))
    client = MlflowClient(tracking_uri=store_uri)
    path = client.download_artifacts(cold.run_id, "fit/coefficients.csv")
    warm = run(compose_cfg(*overrides, f"solver.warm_start={path}"))
    assert cold.stats.cg_iterations > 5 and warm.stats.cg_iterations <= 1
    np.testing.assert_allclose(warm.coef.numpy(), cold.coef.numpy(), rtol=1e-6, atol=1e-9)
    wrong = Path(path).with_name("wrong.csv")
    pd.read_csv(path).iloc[:, :3].to_csv(wrong, index=False)
    with pytest.raises(ConfigError, match="solver.warm_start.*coefficient columns"):
        run(compose_cfg(*overrides, f"solver.warm_start={wrong}"))


def test_the_metrics_come_from_the_predictions_and_the_table_is_built_only_on_use(compose_cfg, csv_path):
    """With tracking off nothing records the predictions table, so the run never builds it (it would be
    held above the planning baseline); the metrics match the table's, computed here in float64."""
    result = run(compose_cfg(*csv_overrides(csv_path), "split.validation_start=2020-12-01", "tracking=none"))
    assert result.table.cache_info().currsize == 0
    table = result.predictions
    assert result.table.cache_info().currsize == 1 and list(table["split"].unique()) == ["train", "validation", "test"]
    for split, part in table.groupby("split"):
        error = part["actual"].to_numpy(np.float64) - part["predicted"].to_numpy(np.float64)
        assert result.metrics[f"rmse_{split}"] == pytest.approx(np.sqrt(np.mean(error ** 2)), rel=1e-12)
        actual = part["actual"].to_numpy(np.float64)
        mape = 100 * np.mean(np.abs(error[actual != 0] / actual[actual != 0]))
        assert result.metrics[f"mape_{split}"] == pytest.approx(mape, rel=1e-12)


def test_progress_in_log_mode_names_each_split_and_reports_the_cg_against_its_tolerance(compose_cfg, csv_path,
                                                                                        caplog):
    caplog.set_level(logging.INFO, logger="tamrun.fit.progress")
    result = run(compose_cfg(*csv_overrides(csv_path), "split.validation_start=2020-12-01", "tracking=none",
                             "progress=log", "solver=cg", "solver.tol=1e-7", "solver.max_iter=2000"))
    lines = [r.getMessage() for r in caplog.records]
    groups = len(result.groups)
    for split in ("train", "validation", "test"):
        assert f"predict {split}: {groups}/{groups} groups" in lines
    assert not any(line.startswith("predict:") for line in lines)
    cg = [line for line in lines if line.startswith("CG:")]
    iterations, residual = int(result.metrics["cg_iterations"]), result.metrics["cg_final_residual"]
    assert cg == [f"CG: {iterations} iterations, residual {residual:.2e} / tol 1e-07, {groups}/{groups} groups "
                  "converged"]
    assert "/2000" not in caplog.text
