"""Runs under a memory limit and with faked OOMs, on the national presets (CPU)."""

from __future__ import annotations

import logging

import pytest
import torch
from mlflow.tracking import MlflowClient

from tamrun.effects.design import AdditiveDesign
from tamrun.errors import MemoryBudgetError
from tamrun.runner import run


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((torch.linalg.vector_norm(a - b, dim=1) / torch.linalg.vector_norm(b, dim=1)).max())


@pytest.mark.parametrize("overrides", [("model=fourier",), ("model=spline",), ("model=spline", "solver=cg"),
                                       ("model=forest",)], ids=["fourier", "spline", "spline-cg", "forest-cg"])
def test_a_tenth_of_the_working_peak_is_enough(compose_cfg, overrides):
    """Fewer groups per chunk change nothing in a group's arithmetic: the capped coefficients equal
    the uncapped ones on the direct route and, bitwise per group, on the CG route too."""
    overrides = (*overrides, "hw=cpu")  # the CPU's working memory (on CUDA the limit also counts what is held)
    free = run(compose_cfg(*overrides, "tracking=none"))
    measured = free.metrics["working_peak_bytes"]
    # the oracle's prediction is within 25 % of the measured working peak
    assert abs(free.metrics["predicted_peak_bytes"] - measured) <= 0.25 * measured
    limit = int(measured / 10)
    capped = run(compose_cfg(*overrides, "tracking=none", f"memory.limit={limit}"))
    assert capped.metrics["working_peak_bytes"] <= 1.1 * limit
    assert capped.metrics["tracker_peak_bytes"] <= capped.plan.budget
    assert capped.plan.fit.groups < free.plan.fit.groups or capped.plan.fit.rows < free.plan.fit.rows
    assert relative_difference(capped.coef, free.coef) <= 1e-9
    assert capped.metrics["rmse_test"] == pytest.approx(free.metrics["rmse_test"], rel=1e-9)


@pytest.mark.parametrize("overrides", [("model=fourier",), ("model=spline", "solver=cg"), ("model=forest",),
                                       ("model=forest", "memory.limit=20MiB"),
                                       ("model=forest_fourier", "model.effects.forest_toy.left.n_trees=4")],
                         ids=["fourier", "spline-cg", "forest-cg", "forest-capped", "forest_fourier-4-trees"])
def test_the_sampled_meter_gives_the_working_peaks_of_every_operation_metered(compose_cfg, overrides):
    """The meter counts repeated work once (`tamrun.machine.sampling`: the first row chunk, group, chunk of
    groups and CG iteration of each shape): the solve and predict phases' working peaks are those of
    every operation metered (memory.meter_sampling=false), to the byte, uncapped and in chunks."""
    peaks = {}
    for sampling in ("true", "false"):
        metrics = run(compose_cfg(*overrides, "hw=cpu", "tracking=none", f"memory.meter_sampling={sampling}")).metrics
        peaks[sampling] = (metrics["working_peak_solve_bytes"], metrics["working_peak_predict_bytes"])
    assert peaks["true"] == peaks["false"]


# torch's CPU allocator's failure, word for word (c10/core/impl/alloc_cpu.cpp): a plain RuntimeError.
CPU_ALLOCATOR_FAILURE = ("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                         "you tried to allocate 1073741824 bytes. Error code 12 (Cannot allocate memory)")


def fake_oom_above(monkeypatch, max_groups: int, error=lambda: torch.OutOfMemoryError("fake OOM raised by the test")
                   ) -> list:
    """Make AdditiveDesign.chunk raise ``error()``, a fake OOM (on purpose, to exercise the retry
    path), whenever a chunk holds more than ``max_groups`` groups."""
    real, sizes = AdditiveDesign.chunk, []

    def chunk(self, x, group_slice=slice(None), weight=None):
        sizes.append(x.shape[0])
        if x.shape[0] > max_groups:
            raise error()
        return real(self, x, group_slice, weight)

    monkeypatch.setattr(AdditiveDesign, "chunk", chunk)
    return sizes


def test_faked_ooms_shrink_the_chunks_and_give_the_same_coefficients(compose_cfg, store_uri, monkeypatch):
    clean = run(compose_cfg("tracking=none"))
    monkeypatch.setenv("OOM_DELAY_MS", "0")
    sizes = fake_oom_above(monkeypatch, max_groups=20)
    result = run(compose_cfg())
    assert sizes[:4] == [48, 33, 23, 16]  # 48, floor(0.7 * 48), floor(0.7 * 33), ...
    # three retries in the fit, three in the first prediction; the second one starts from 16 groups
    assert result.metrics["oom_retries"] == 6
    assert relative_difference(result.coef, clean.coef) <= 1e-12
    client = MlflowClient(tracking_uri=store_uri)
    logged = client.get_run(result.run_id)
    assert logged.info.status == "FINISHED" and logged.data.metrics["system/memory/oom_retries"] == 6
    report = client.download_artifacts(result.run_id, "memory/report.txt")
    text = open(report).read()
    assert "OOM events:" in text and "chunk 48 -> 33" in text and "smallest memory.limit" in text


def test_the_cpu_allocators_failure_is_retried_like_any_oom(compose_cfg, monkeypatch, caplog):
    """torch's CPU allocator fails with a RuntimeError (no OutOfMemoryError): the test raises that
    error on purpose in the fit's chunks; the guard shrinks 48 -> 33 -> 23 -> 16 groups (size_factor
    0.7) and the coefficients are those of the unfaulted run."""
    clean = run(compose_cfg("model=fourier", "tracking=none"))
    monkeypatch.setenv("OOM_DELAY_MS", "0")
    sizes = fake_oom_above(monkeypatch, max_groups=20, error=lambda: RuntimeError(CPU_ALLOCATOR_FAILURE))
    with caplog.at_level(logging.INFO, logger="tamrun.memory.guard"):
        result = run(compose_cfg("model=fourier", "tracking=none"))
    assert sizes[:4] == [48, 33, 23, 16]
    retries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("OOM in fit")]
    assert [m.split(": chunk ")[1].split(",")[0] for m in retries] == ["48 -> 33", "33 -> 23", "23 -> 16"]
    assert all("RuntimeError: [enforce fail at alloc_cpu.cpp:117]" in m for m in retries)
    assert result.metrics["oom_retries"] == 6  # three in the fit, three in the first prediction
    assert relative_difference(result.coef, clean.coef) <= 1e-12


def test_the_guard_gives_up_with_the_needed_memory_and_the_run_fails(compose_cfg, store_uri, monkeypatch):
    monkeypatch.setenv("OOM_MAX_RETRIES", "1")
    monkeypatch.setenv("OOM_DELAY_MS", "0")
    fake_oom_above(monkeypatch, max_groups=0)
    with pytest.raises(MemoryBudgetError, match=r"this step needs about .* memory.limit"):
        run(compose_cfg())
    runs = MlflowClient(tracking_uri=store_uri).search_runs(["1"])
    assert [r.info.status for r in runs] == ["FAILED"]
    assert runs[0].data.tags["error_type"] == "MemoryBudgetError"
