"""mode=aggregate through the real runner (Hydra composition of conf/, a real sqlite MLflow store) on the
synthetic CSV: what a run records, each expert's forecasts equal to its own run's, the families that
batch experts sharing a design, the test period reaching no choice, no look-ahead, and bad settings refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tamrun.aggregate.experts import compose_experts, families
from tamrun.config.load import typed_config
from tamrun.errors import ConfigError
from tamrun.runner import run

from conftest import PRICED, assert_priced, by_name, csv_overrides

SPLINE = "+model.effects.sx={kind: spline, column: x, k: 10, ap: -6}"
DOW = "+model.effects.dow={kind: categorical, column: dow, topo: nominal, ap: -6}"
KALMAN = ["adaptive.method=kalman", SPLINE, DOW]
VALIDATION = "split.validation_start=2020-10-01"


def expert(name: str, mode: str, *overrides: str) -> str:
    """The override adding expert ``name`` (model custom) with ``overrides`` (quoted for Hydra's grammar)."""
    items = ", ".join(f'"{o}"' for o in overrides)
    return f"+aggregate.experts.{name}={{model: custom, mode: {mode}, overrides: [{items}]}}"


EXPERTS = [expert("static", "run", SPLINE, DOW),
           expert("slow", "adaptive", *KALMAN, "adaptive.kalman.q=[1e-5,1e-4]"),
           expert("fast", "adaptive", *KALMAN, "adaptive.kalman.q=[1e-2]"),
           expert("spline_only", "adaptive", "adaptive.method=kalman", SPLINE, "adaptive.kalman.q=[1e-3]")]


def aggregate_overrides(csv_path: Path, *extra: str) -> list:
    return [*csv_overrides(csv_path), "mode=aggregate", VALIDATION, *EXPERTS, *extra]


def artifact(client: MlflowClient, run_id: str, path: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return Path(client.download_artifacts(run_id, path, str(folder)))


def test_an_aggregate_run_records_the_experts_the_weights_and_the_choice(compose_cfg, store_uri, csv_path, tmp_path):
    result = run(compose_cfg(*aggregate_overrides(csv_path, *PRICED)))
    client = MlflowClient(tracking_uri=store_uri)
    info = client.get_run(result.run_id)
    assert info.info.status == "FINISHED" and info.data.tags["model"] == "aggregate"
    metrics = by_name(info.data.metrics)
    assert_priced(metrics, "experts_seconds", "aggregate_seconds")
    for name in ("static", "slow", "fast", "spline_only"):
        assert {f"rmse_test_{name}", f"rmse_validation_{name}"} <= set(metrics)
    assert metrics["rmse_test_best_expert"] == min(metrics[f"rmse_test_{n}"] for n in ("static", "slow", "fast",
                                                                                        "spline_only"))
    selection = json.loads(artifact(client, result.run_id, "aggregate/selection.json", tmp_path).read_text())
    scores = [c["rmse_validation"] for c in selection["candidates"]["candidates"]]
    assert len(scores) == 2 * 2 * (7 + 1)  # (ewa: 7 etas, mlpoly) x gradient x per_group
    assert selection["candidates"]["rmse_validation"] == min(scores)
    # the chosen rule's run through the test period replays its selection run over the validation days
    assert metrics["rmse_validation"] == pytest.approx(min(scores), rel=1e-12)
    assert selection["experts"]["slow"]["pair"][0] in (1e-5, 1e-4) and len(selection["experts"]["slow"]["grid"]) == 2
    experts = pd.read_csv(artifact(client, result.run_id, "aggregate/experts.csv", tmp_path))
    assert list(experts["expert"]) == ["static", "slow", "fast", "spline_only"]
    assert list(experts["mode"]) == ["run", "kalman", "kalman", "kalman"] and experts["kept"].all()
    weights = pd.read_csv(artifact(client, result.run_id, "aggregate/weights.csv", tmp_path))
    np.testing.assert_allclose(weights[["static", "slow", "fast", "spline_only"]].sum(axis=1), 1.0, atol=1e-12)
    names = {f.path for f in client.list_artifacts(result.run_id, "plots")}
    assert {"plots/aggregate_weights.png", "plots/aggregate_monthly_rmse.png"} <= names
    table = result.predictions
    assert set(table["period"]) == {"validation", "test"} and table["aggregate"].notna().all()


def test_each_expert_forecasts_as_its_own_run(compose_cfg, csv_path):
    """A filtered expert's scores are those of its own Kalman run (q chosen on the same validation period,
    the refit on training + validation), a static expert's those of that run's static model."""
    result = run(compose_cfg(*aggregate_overrides(csv_path), "tracking=none"))
    alone = run(compose_cfg(*csv_overrides(csv_path), "tracking=none", "mode=adaptive", VALIDATION,
                            "adaptive.kalman.q=[1e-5,1e-4]", "adaptive.method=kalman"))
    metrics = result.metrics
    assert metrics["rmse_test_slow"] == pytest.approx(alone.metrics["rmse_test"], rel=1e-12)
    assert metrics["rmse_validation_slow"] == pytest.approx(alone.metrics["rmse_validation"], rel=1e-12)
    assert metrics["rmse_test_static"] == pytest.approx(alone.metrics["rmse_test_static"], rel=1e-12)


def test_experts_sharing_a_design_form_one_family_and_one_filter_batch(compose_cfg, csv_path):
    cfg = compose_cfg(*aggregate_overrides(csv_path))
    config, _ = typed_config(cfg)
    found = families(compose_experts(cfg, config))
    assert [[e.name for e in f.experts] for f in found] == [["static", "slow", "fast"], ["spline_only"]]
    assert [[e.name for e in g] for g in found[0].filter_groups()] == [["slow", "fast"]]
    assert [e.name for e in found[0].static] == ["static"]
    assert found[0].config.mode.name.value == "adaptive"  # the family loads its data as a Kalman run would


def with_targets(csv_path: Path, tmp_path: Path, name: str, change) -> Path:
    frame = pd.read_csv(csv_path, parse_dates=["date"])
    frame = change(frame)
    path = tmp_path / name
    frame.to_csv(path, index=False)
    return path


def test_the_test_period_reaches_no_choice_and_no_day_sees_its_own_truth(compose_cfg, csv_path, tmp_path):
    """Changing every target of the test period changes no choice (each expert's q, every candidate's
    validation score); changing the targets from test day d on changes neither the aggregate's forecasts
    nor its weights up to day d."""
    base = run(compose_cfg(*aggregate_overrides(csv_path), "tracking=none"))
    test_start, day = pd.Timestamp("2021-01-01"), pd.Timestamp("2021-01-12")

    def scaled(frame):
        frame.loc[frame["date"] >= test_start, "y"] *= 1.5
        return frame

    def shifted(frame):
        frame.loc[frame["date"] >= day, "y"] += 5.0
        return frame

    for name, change in (("scaled.csv", scaled), ("shifted.csv", shifted)):
        other = run(compose_cfg(*aggregate_overrides(with_targets(csv_path, tmp_path, name, change)), "tracking=none"))
        # equal up to the order a GPU adds in (bitwise on the CPU)
        for metric in ("rmse_validation", "aggregate_candidates", "aggregate_gradient", "aggregate_per_group"):
            assert other.metrics[metric] == pytest.approx(base.metrics[metric], rel=1e-12)
        for expert_name in ("static", "slow", "fast", "spline_only"):
            key = f"rmse_validation_{expert_name}"
            assert other.metrics[key] == pytest.approx(base.metrics[key], rel=1e-12)
        before = base.predictions["date"] < (day + pd.Timedelta(days=1) if name == "shifted.csv" else test_start)
        columns = ["aggregate", "static", "slow", "fast", "spline_only"]
        pd.testing.assert_frame_equal(other.predictions.loc[before, columns], base.predictions.loc[before, columns])
        assert not other.predictions.loc[~before, "aggregate"].equals(base.predictions.loc[~before, "aggregate"])


@pytest.mark.parametrize("overrides, field", [
    ([f"~{VALIDATION}"], "split.validation_start"),
    (["~aggregate.experts.fast", "~aggregate.experts.slow", "~aggregate.experts.spline_only"], "aggregate.experts"),
    (["aggregate.eta=[0.1,-1]"], "aggregate.eta"),
    (["aggregate.rules=[]"], "aggregate.rules"),
    ([expert("actual", "run", SPLINE)], "aggregate.experts.actual"),
    ([expert("sliding", "adaptive", SPLINE)], "aggregate.experts.sliding"),
    (["+aggregate.experts.nowhere={model: no_such_preset}"], "aggregate.experts.nowhere"),
    ([expert("bad", "run", SPLINE, "model.effects.sx.k=0")], "aggregate.experts.bad: model.effects.sx.k"),
], ids=["no-validation", "one-expert", "eta", "no-rule", "reserved-name", "sliding", "unknown-preset", "bad-override"])
def test_bad_aggregate_settings_are_refused_naming_the_field(compose_cfg, csv_path, overrides, field):
    base = aggregate_overrides(csv_path, "tracking=none")
    if overrides[0].startswith(f"~{VALIDATION}"):
        base, overrides = [o for o in base if o != VALIDATION], []
    with pytest.raises(ConfigError) as refused:
        run(compose_cfg(*base, *overrides))
    assert refused.value.field.startswith(field), refused.value


def test_selected_experts_are_chosen_on_the_validation_period_and_aggregate_as_a_run_of_them(compose_cfg, store_uri,
                                                                                          csv_path, tmp_path):
    """aggregate.select_experts=true: each elimination step lowers the validation RMSE, the experts kept give
    the run's scores when aggregated alone, and changing the test period's targets changes no step."""
    poor = expert("poor", "run", DOW)  # no effect of x: far worse than the others
    result = run(compose_cfg(*aggregate_overrides(csv_path, "aggregate.select_experts=true", poor)))
    client = MlflowClient(tracking_uri=store_uri)
    selection = artifact(client, result.run_id, "aggregate/selection.json", tmp_path / "a")
    steps = json.loads(selection.read_text())["pruning"]
    assert steps[0]["experts"] == ["static", "slow", "fast", "spline_only", "poor"]
    scores = [step["rmse_validation"] for step in steps]
    assert all(later < earlier for earlier, later in zip(scores, scores[1:]))
    kept = steps[-1]["experts"]
    assert len(kept) >= 2 and result.metrics["aggregate_experts"] == len(kept)
    assert result.metrics["rmse_validation"] == pytest.approx(scores[-1], rel=1e-12)
    dropped = [f"~aggregate.experts.{name}" for name in ("static", "slow", "fast", "spline_only", "poor")
               if name not in kept]
    alone = run(compose_cfg(*aggregate_overrides(csv_path, "tracking=none", poor), *dropped))
    for metric in ("rmse_validation", "rmse_test"):
        assert alone.metrics[metric] == pytest.approx(result.metrics[metric], rel=1e-12)

    def scaled(frame):
        frame.loc[frame["date"] >= pd.Timestamp("2021-01-01"), "y"] *= 1.5
        return frame

    other = run(compose_cfg(*aggregate_overrides(with_targets(csv_path, tmp_path, "scaled.csv", scaled),
                                                 "aggregate.select_experts=true", poor)))
    other_steps = json.loads(artifact(client, other.run_id, "aggregate/selection.json", tmp_path / "b").read_text())
    # the same steps, each step's score equal up to the order a GPU adds in (bitwise on the CPU)
    assert [{**step, "rmse_validation": None} for step in other_steps["pruning"]] == [
        {**step, "rmse_validation": None} for step in steps]
    assert [step["rmse_validation"] for step in other_steps["pruning"]] == pytest.approx(
        [step["rmse_validation"] for step in steps], rel=1e-12)


def test_the_packaged_experiments_compose_every_expert_with_the_runs_split(compose_cfg):
    """+experiment=day_ahead_aggregate (the four experts kept on 2023) and its pool (the eleven of conf/expert/):
    every expert composes with the run's validation year; the pool's eleven experts form seven families."""
    for experiment, count, families_count in (("day_ahead_aggregate", 4, 4), ("day_ahead_aggregate_pool", 11, 7)):
        cfg = compose_cfg(f"+experiment={experiment}")
        config, _ = typed_config(cfg)
        experts = compose_experts(cfg, config)
        assert len(experts) == count and config.aggregate.select_experts == (count == 11)
        assert {e.config.split.validation_start for e in experts} == {"2023-01-01"}
        assert all(not e.config.tracking.enabled for e in experts)
        assert len(families(experts)) == families_count


@pytest.mark.slow
def test_day_ahead_aggregate_beats_1000_mw_and_its_best_expert_on_2024(compose_cfg, store_uri):
    """The acceptance run of +experiment=day_ahead_aggregate on the embedded national data: FINISHED, 2024
    RMSE <= 1,000 MW and below every expert's, every choice made on 2023 (the chosen rule the lowest of the
    candidates' 2023 scores; each expert's q the lowest 2023 score of its grid)."""
    result = run(compose_cfg("+experiment=day_ahead_aggregate", "tracking.log_plots=false"))
    info = MlflowClient(store_uri).get_run(result.run_id)
    assert info.info.status == "FINISHED"
    metrics = by_name(info.data.metrics)
    assert metrics["rmse_test"] <= 1000.0 and metrics["rmse_test"] < metrics["rmse_test_best_expert"]
    assert metrics["rmse_validation"] < metrics["rmse_validation_best_expert"]
    assert metrics["aggregate_experts"] == 4
    for level in (80, 95):  # the intervals: calibrated on 2023, adapted online over 2024 from past days only
        assert abs(metrics[f"coverage_{level}_test"] - level) <= 2.0
        assert metrics[f"width_{level}_test"] < metrics[f"width_{level}_test_naive"]
    assert metrics["pinball_test"] < metrics["pinball_test_naive"]
