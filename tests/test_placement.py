"""Placement without a GPU: under ``hw=check`` the compute device is the CPU under another name
(``cpu:0``, tamrun/machine/placement.py), every tensor placed there is tagged, and an operation mixing it with a
host tensor fails as it would on a GPU. The whole pipeline runs under it here (every preset and route,
predictions, plots, the logged model and the pyfunc model, the adaptive and Kalman modes, a sweep), and
gives the plain CPU's numbers bitwise: the check changes where tensors are said to live, not what is
computed."""

from __future__ import annotations

import ast
import os
import pickle
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

import tamrun
from tamrun.config.load import typed_config
from tamrun.device.manager import DeviceManager
from tamrun.errors import ConfigError, MemoryBudgetError
from tamrun.machine.gpu import GpuMemory
from tamrun.memory.guard import unplanned_oom_refused
from tamrun.pipeline import build_features, load_splits
from tamrun.machine.placement import CHECK_DEVICE, HOST, PlacementCheck, PlacementError, tensors_in, to_device
from tamrun.runner import run

from conftest import csv_overrides
from test_determinism import comparable

# One year of training, one month of test: every preset in seconds, forest_fourier in the dual form
# (365 rows per group < D).
SHORT = ["split.train_start=2023-01-01", "split.test_end=2024-01-31"]
PRESETS = ["fourier", "fourier_holidays", "spline", "spline_holidays", "forest", "forest_fourier", "forest_big", "calendar",
           "static_day_ahead"]


# Two runs in one process may sum in another order (the BLAS path follows the data's alignment), and one
# year of training leaves the fourier presets' trend and annual terms nearly collinear, which amplifies
# that into the coefficients and, less, the forecast's metrics (seen once in ~20 runs of a preset):
# coefficients to 1e-6 of their largest, metrics to 1e-6 relative (1.5e-3 MW on an RMSE of 1,500 MW).
SAME_COEFFICIENTS, SAME_METRICS = 1e-6, 1e-6
# A coverage counts rows inside their interval, and a calibration row can lie on its bound (the quantile is
# one of the residuals): such a row flips with the last bits. One row of a split of n rows is 100 / n points
# (n >= 1,000 in these runs).
SAME_COVERAGE_POINTS = 0.1


def _equal_runs(checked, plain) -> None:
    assert checked.route == plain.route
    scale = float(plain.coef.abs().max())
    torch.testing.assert_close(checked.coef, plain.coef, rtol=0, atol=SAME_COEFFICIENTS * scale)
    found, expected = comparable(checked.metrics), comparable(plain.metrics)
    coverage = [name for name in expected if name.startswith("coverage_")]
    assert coverage and set(found) == set(expected)
    assert {k: found[k] for k in coverage} == pytest.approx({k: expected[k] for k in coverage}, rel=0,
                                                            abs=SAME_COVERAGE_POINTS)
    others = [name for name in expected if name not in coverage]
    assert {k: found[k] for k in others} == pytest.approx({k: expected[k] for k in others}, rel=SAME_METRICS, abs=0)


# ---- the check itself --------------------------------------------------------------------------

def test_the_check_fails_a_mix_of_device_and_host_tensors_as_a_gpu_would():
    host = torch.arange(6.0)
    with PlacementCheck() as check:
        placed = host.to(CHECK_DEVICE)
        assert check.placed(placed) and not check.placed(host)
        assert placed.device == CHECK_DEVICE and host.device == HOST
        with pytest.raises(PlacementError, match="mixes tensors on the compute device"):
            placed + host
        with pytest.raises(PlacementError, match="mixes"):
            torch.cat([placed, host])
        with pytest.raises(PlacementError, match=r"\.numpy\(\)"):
            placed.numpy()
        with pytest.raises(PlacementError, match="cuda"):
            host.to("cuda")
        follows = torch.zeros(6, device=placed.device)  # a factory given a placed tensor's device
        assert check.placed(follows) and check.placed(placed * 2 + follows)
        assert check.placed(placed + torch.tensor(1.0))  # a host scalar is allowed, as on CUDA
        assert check.placed(placed[torch.tensor([0, 2])])  # host indices into a device tensor, as on CUDA
        with pytest.raises(PlacementError):
            host[placed.long()]  # device indices into a host tensor fail on CUDA
        back = placed.cpu()
        assert not check.placed(back) and check.placed(placed) and back.numpy().sum() == 15.0
        out = torch.zeros(6)
        out.copy_(placed)  # copy_ crosses devices
        assert not check.placed(out)
        csr = torch.sparse_csr_tensor(torch.tensor([0, 1, 2]), torch.tensor([0, 1]), torch.tensor([1.0, 2.0]),
                                      size=(2, 2)).to(CHECK_DEVICE)
        assert check.placed(csr @ torch.ones(2, device=CHECK_DEVICE))
        with pytest.raises(PlacementError):
            csr @ torch.ones(2)


def test_to_device_moves_a_whole_state_without_changing_the_original(compose_cfg, csv_path):
    config, specs = typed_config(compose_cfg(*csv_overrides(csv_path), "tracking=none", "hw=cpu",
                                             "+model.effects.f={kind: forest, column: x, n_trees: 3, max_depth: 2}"))
    design = build_features(config, specs, load_splits(config, specs).train).design
    with PlacementCheck() as check:
        moved = design.to(CHECK_DEVICE)
        found = dict(tensors_in(moved))
        assert {"scaler.center", "scaler.half"} <= set(found) and any("thresholds" in k for k in found)
        assert all(check.placed(t) for t in found.values())
        assert not any(check.placed(t) for _, t in tensors_in(design))  # the original stays on the host
        assert moved.dense_effects[0] is moved.effects[moved.effects.index(moved.dense_effects[0])]
        back = to_device(moved, HOST)
        assert not any(check.placed(t) for _, t in tensors_in(back))


# ---- the pipeline under the check --------------------------------------------------------------

@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_runs_recorded_under_the_check_with_the_cpus_numbers(compose_cfg, store_uri, preset):
    """Fit, predictions, plots, partial effects and the LoggedModel, under the check; the same numbers
    as the plain CPU's."""
    checked = run(compose_cfg(f"model={preset}", "hw=check", *SHORT))
    plain = run(compose_cfg(f"model={preset}", "hw=cpu", "tracking=none", *SHORT))
    _equal_runs(checked, plain)
    client = MlflowClient(tracking_uri=store_uri)
    run_info = client.get_run(checked.run_id)
    assert run_info.info.status == "FINISHED" and run_info.data.tags["device_kind"] == "cpu"
    assert client.search_logged_models([run_info.info.experiment_id])


ROUTES = {"direct": ["solver=direct"], "dual": ["solver=direct", "solver.dual=true"],
          "cg-jacobi": ["solver=cg", "solver.preconditioner=jacobi"],
          "cg-block": ["solver=cg", "solver.preconditioner=block_jacobi"],
          "cg-two-level": ["solver=cg", "solver.preconditioner=two_level"],
          "gcv": ["solver=direct", "model.penalties=gcv"],
          "float32": ["solver=cg", "dtype=float32"],
          "limited": ["solver=cg", "memory.limit=24MiB"],
          "deterministic": ["solver=direct", "hw.deterministic=true"]}
FOREST_X = ["+model.effects.f={kind: forest, column: x, others: [dow], n_trees: 4, max_depth: 3}",
            "+model.effects.fx={kind: crossing, left: {kind: forest, column: x, n_trees: 3, max_depth: 2},"
            " right: {kind: fourier, column: dow, m: 2}}"]


@pytest.mark.parametrize("route", ROUTES)
def test_every_route_runs_under_the_check_with_the_cpus_numbers(compose_cfg, csv_path, route):
    overrides = [*csv_overrides(csv_path), "tracking=none", *FOREST_X, *ROUTES[route]]
    if route == "gcv":
        overrides = [o for o in overrides if "crossing" not in o]
    checked = run(compose_cfg(*overrides, "hw=check"))
    plain = run(compose_cfg(*overrides, "hw=cpu"))
    _equal_runs(checked, plain)
    assert np.isfinite(checked.metrics["rmse_test"])


@pytest.mark.parametrize("mode", [["mode=adaptive", "adaptive.window=120", "adaptive.step=7"],
                                  ["mode=adaptive", "adaptive.method=kalman", "adaptive.kalman.q=[1e-3]"]],
                         ids=["sliding", "kalman"])
def test_the_adaptive_modes_run_under_the_check_with_the_cpus_numbers(compose_cfg, csv_path, mode):
    overrides = [*csv_overrides(csv_path), "tracking=none", "solver=direct", *FOREST_X[:1], *mode]
    checked = run(compose_cfg(*overrides, "hw=check"))
    plain = run(compose_cfg(*overrides, "hw=cpu"))
    assert torch.equal(checked.coef, plain.coef)
    assert comparable(checked.metrics) == comparable(plain.metrics) and "rmse_test" in comparable(plain.metrics)


@pytest.mark.parametrize("refit", ["expanding", "once"])
def test_the_backtest_runs_under_the_check_with_the_cpus_numbers(compose_cfg, csv_path, refit):
    overrides = [*csv_overrides(csv_path), "tracking=none", "solver=direct", *FOREST_X[:1], "mode=backtest",
                 "backtest.windows=3", f"backtest.refit={refit}"]
    checked = run(compose_cfg(*overrides, "hw=check"))
    plain = run(compose_cfg(*overrides, "hw=cpu"))
    assert comparable(checked.metrics) == comparable(plain.metrics) and "rmse_backtest" in comparable(plain.metrics)
    assert np.isfinite(checked.metrics["rmse_backtest"])


def test_the_aggregate_mode_runs_under_the_check_with_the_cpus_numbers(compose_cfg, csv_path):
    """Experts (a static model, two Kalman filters sharing a forest model's design) and every aggregation
    rule, under the check: the same experts' forecasts, choice and aggregate as on the plain CPU."""
    effects = ", ".join(f'"{o}"' for o in ("+model.effects.sx={kind: spline, column: x, k: 10, ap: -6}", FOREST_X[0]))
    kalman = '"adaptive.method=kalman"'
    experts = [f"+aggregate.experts.static={{model: custom, overrides: [{effects}]}}",
               f"+aggregate.experts.slow={{model: custom, mode: adaptive, overrides: [{kalman}, {effects}, "
               '"adaptive.kalman.q=[1e-4]"]}',
               f"+aggregate.experts.fast={{model: custom, mode: adaptive, overrides: [{kalman}, {effects}, "
               '"adaptive.kalman.q=[1e-2,1e-1]"]}']
    overrides = [*csv_overrides(csv_path), "tracking=none", "mode=aggregate", "split.validation_start=2020-10-01",
                 *experts]
    checked = run(compose_cfg(*overrides, "hw=check"))
    plain = run(compose_cfg(*overrides, "hw=cpu"))
    assert torch.equal(checked.coef, plain.coef)
    assert comparable(checked.metrics) == comparable(plain.metrics) and "rmse_test_fast" in comparable(plain.metrics)
    columns = ["aggregate", "static", "slow", "fast"]
    assert checked.predictions[columns].equals(plain.predictions[columns])


def test_the_day_ahead_experiment_runs_under_the_check(compose_cfg):
    result = run(compose_cfg("+experiment=day_ahead", "hw=check", "tracking=none"))
    assert 900 < result.metrics["rmse_test"] < 1300


def test_a_model_fitted_under_the_check_pickles_and_predicts_on_the_host(compose_cfg, store_uri, csv_path,
                                                                            monkeypatch):
    """The logged model holds no tensor of the compute device: a process without the check (as a machine
    without a GPU) loads it and predicts raw rows, equal to what the run predicted."""
    result = run(compose_cfg(*csv_overrides(csv_path), *FOREST_X, "hw=check", "solver=cg"))
    client = MlflowClient(tracking_uri=store_uri)
    model = client.search_logged_models([client.get_run(result.run_id).info.experiment_id])[0]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store_uri)
    loaded = mlflow.pyfunc.load_model(f"models:/{model.model_id}")
    config, specs = typed_config(compose_cfg(*csv_overrides(csv_path), *FOREST_X))
    test = load_splits(config, specs).test
    predicted = loaded.predict(test[["g", "x", "dow"]])
    logged = result.predictions[result.predictions["split"] == "test"].set_index(["date", "group"])["predicted"]
    expected = logged.loc[list(zip(test["date"], test["g"]))].to_numpy()
    assert np.max(np.abs(predicted["predicted"].to_numpy() - expected)) <= 1e-9
    fitted = loaded.unwrap_python_model().model
    assert all(t.device == HOST for _, t in tensors_in(fitted))
    with PlacementCheck() as check:  # pickling moves a model to the host whatever it holds
        on_device = fitted.to(CHECK_DEVICE)
        assert all(check.placed(t) for _, t in tensors_in(on_device))
        again = pickle.loads(pickle.dumps(on_device))
        assert not any(check.placed(t) for _, t in tensors_in(again))


def test_a_sweep_runs_under_the_check(tmp_path, csv_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYDRA_")}
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = subprocess.run([sys.executable, "-m", "tamrun", "-m", "hw=check", f"tracking.uri={store}",
                           *csv_overrides(csv_path), "solver=cg,direct"], cwd=tmp_path, capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = MlflowClient(tracking_uri=store).search_runs(["1"])
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * 3  # two jobs and their parent


# ---- the GPU's own rules, checked without one ----------------------------------------------------

def test_every_device_is_made_with_its_index_but_the_host():
    """A compute device is made with its index (compute_device: ``cuda:0``): a ``torch.device(kind)`` without
    one is what torch.cuda's calls refuse (memory.limit crashed on CUDA with it). Only the host is named
    without an index; tamrun/machine/placement.py reads devices that code under the check names, so it is not
    scanned."""
    made = []
    for path in Path(tamrun.__file__).parent.rglob("*.py"):
        if path.name == "placement.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.device":
                made.append((path.name, ast.unparse(node)))
    assert len(made) >= 3
    unindexed = [(name, call) for name, call in made if "," not in call]
    assert not unindexed, unindexed
    checked = DeviceManager("cpu", check_placement=True)
    assert checked.device == CHECK_DEVICE and checked.device.index == 0
    assert DeviceManager("cpu").device == HOST


def _unindexed(argument: ast.expr) -> bool:
    """``torch.device("cuda")`` / ``torch.device(kind)`` (no index) or a bare "cuda" string."""
    if isinstance(argument, ast.Constant):
        return argument.value in ("cuda", "xpu")
    return (isinstance(argument, ast.Call) and ast.unparse(argument.func) == "torch.device"
            and len(argument.args) + len(argument.keywords) == 1)


def test_every_torch_cuda_call_gets_an_indexed_device():
    """torch.cuda's memory calls refuse a device without an index (``torch.device("cuda")``: the ValueError
    that made memory.limit crash on CUDA): no call in tamrun passes one; DeviceManager's calls pass
    ``self.device`` (compute_device, indexed)."""
    calls = []
    for path in Path(tamrun.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and ast.unparse(node.func.value) == "torch.cuda" and (node.args or node.keywords)):
                calls.append((path.name, node.func.attr, [*node.args, *(k.value for k in node.keywords)]))
    managed = [c for c in calls if c[0] == "manager.py"]
    assert len(managed) >= 8 and all(any(ast.unparse(a) == "self.device" for a in c[2]) for c in managed), managed
    unindexed = [(name, attr) for name, attr, arguments in calls if any(_unindexed(a) for a in arguments)]
    assert not unindexed, unindexed


def test_a_gpus_out_of_memory_names_the_gpus_memory_not_the_ram():
    """An accelerator's OOM outside the planned chunks (a CUDA context or a library's workspace that cannot
    be created raises torch.AcceleratorError, not OutOfMemoryError) names what the GPU holds."""
    gpu = GpuMemory("NVIDIA H100 80GB HBM3", free=400 * 2**20, total=80 * 2**30, others=[(4321, 79 * 2**30)],
                    context=500 * 2**20, tensors=0)
    with pytest.raises(MemoryBudgetError) as refused:
        with unplanned_oom_refused(16 * 2**20, lambda: gpu):
            raise torch.AcceleratorError("CUDA error: out of memory")
    message = refused.value.report_line()
    assert message.startswith("tamrun: memory error: GPU memory='400.00 MiB free of 80.00 GiB'")
    for part in ("the GPU NVIDIA H100 80GB HBM3 has 400.00 MiB free of 80.00 GiB; other processes hold 79.00 GiB "
                 "(pid 4321", "CUDA context takes 500.00 MiB", "hw=cpu"):
        assert part in message
    assert "RAM" not in message
    with pytest.raises(MemoryBudgetError) as host:  # the CPU allocator's failure still names the host's limit
        with unplanned_oom_refused(16 * 2**20, lambda: gpu):
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 GiB")
    assert "GPU" not in host.value.report_line()


def test_deterministic_runs_refuse_an_operation_without_a_deterministic_kernel(compose_cfg, csv_path):
    """hw.deterministic=true: torch's deterministic algorithms while the run computes (restored after), and
    an operation without a deterministic kernel (put_ is one on the CPU too) is a ConfigError, not a run
    that silently cannot repeat."""
    devices = DeviceManager("cpu", deterministic=True)
    with pytest.raises(ConfigError, match=r"hw.deterministic=True: put_ has no deterministic kernel"):
        with devices.session():
            assert torch.are_deterministic_algorithms_enabled()
            torch.zeros(5).put_(torch.tensor([1, 1]), torch.ones(2), accumulate=False)
    assert not torch.are_deterministic_algorithms_enabled()
    overrides = [*csv_overrides(csv_path), "tracking=none", "solver=direct", *FOREST_X]
    first = run(compose_cfg(*overrides, "hw.deterministic=true"))
    second = run(compose_cfg(*overrides, "hw.deterministic=true"))
    plain = run(compose_cfg(*overrides))
    assert torch.equal(first.coef, second.coef)
    rel = torch.linalg.vector_norm(first.coef - plain.coef, dim=1) / torch.linalg.vector_norm(plain.coef, dim=1)
    # the slot-by-slot sums add the same terms in another order than the sparse products: 0 measured on
    # this CPU, 1.9e-10 on an H100 (float64, the Grams of three forests)
    assert float(rel.max()) <= 1e-9


def test_the_placement_check_needs_the_cpu(compose_cfg):
    with pytest.raises(ConfigError, match=r"hw.check_placement=True: the placement check runs on the CPU"):
        typed_config(compose_cfg("hw=cuda", "hw.check_placement=true"))
