"""The OOM guard (with OOMs faked on purpose) and the oracle's pure functions."""

from __future__ import annotations

import pytest
import torch

from tamrun.config.schema import MemoryConfig, OomConfig
from tamrun.errors import ConfigError, MemoryBudgetError
from tamrun.memory.footprint import (ProblemSize, RowBytes, StepCost, cg_row_bytes, cg_system_bytes, dense_system_bytes,
                                     direct_row_bytes, kernel_build_bytes)
from tamrun.memory.guard import OomLog, oom_settings, retry_on_oom
from tamrun.memory.oracle import MemoryOracle, pick_chunk
from tamrun.config.units import parse_size


def failing_until(fits_at: int, exc: type = torch.OutOfMemoryError):
    """A step that raises a fake OOM (on purpose) while its chunk is larger than ``fits_at``."""
    seen = []

    def step(size: int) -> int:
        seen.append(size)
        if size > fits_at:
            raise exc("fake out-of-memory raised by the test")
        return size

    return step, seen


def test_guard_shrinks_by_the_factor_and_backs_off_exponentially():
    step, seen = failing_until(45)
    sleeps, freed, oom_log = [], [], OomLog()
    result = retry_on_oom(step, 100, OomConfig(), "fit", oom_log, free_memory=lambda: freed.append(1),
                          sleep=sleeps.append)
    assert seen == [100, 70, 49, 34] and result == 34  # c, floor(0.7c), floor(0.49c), ...
    assert sleeps == pytest.approx([0.2, 0.4, 0.8])
    assert len(freed) == 3 and oom_log.retries == 3
    assert [(e.size_before, e.size_after, e.delay_ms) for e in oom_log.events] == [
        (100, 70, 200), (70, 49, 400), (49, 34, 800)]


def test_guard_catches_memory_error_and_gives_up_with_the_needed_memory():
    step, seen = failing_until(0, exc=MemoryError)
    with pytest.raises(MemoryBudgetError, match=r"needs about 1\.00 GiB.*memory.limit"):
        retry_on_oom(step, 10, OomConfig(max_retries=2), "fit", OomLog(), needed_bytes=lambda size: 2**30,
                     sleep=lambda s: None)
    assert seen == [10, 7, 4]


def test_guard_does_not_swallow_other_errors():
    def step(size: int) -> int:
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        retry_on_oom(step, 10, OomConfig(), "fit", OomLog(), sleep=lambda s: None)


def test_environment_overrides_the_config():
    env = {"OOM_MAX_RETRIES": "5", "OOM_SIZE_FACTOR": "0.5", "OOM_DELAY_MS": "10", "OOM_VERBOSE": "1"}
    assert oom_settings(OomConfig(), env) == OomConfig(max_retries=5, size_factor=0.5, delay_ms=10.0, verbose=True)
    with pytest.raises(ConfigError, match="OOM_SIZE_FACTOR"):
        oom_settings(OomConfig(), {"OOM_SIZE_FACTOR": "1.5"})


def test_parse_size_units():
    assert parse_size("2GiB") == 2 * 2**30 and parse_size("512MB") == 512 * 10**6
    assert parse_size("1.5e3") == 1500 and parse_size(None) is None
    with pytest.raises(ValueError):
        parse_size("lots")


def test_pick_chunk_keeps_everything_when_it_fits_and_shrinks_otherwise():
    whole = pick_chunk(48, 4000, per_group_fixed=1000, per_group_row=10, budget=10**9, overhead=1.1, min_rows=1024)
    assert (whole.groups, whole.rows) == (48, 4000)
    tight = pick_chunk(48, 4000, per_group_fixed=1000, per_group_row=10, budget=100_000, overhead=1.1, min_rows=1024)
    assert 1.1 * tight.groups * (1000 + tight.rows * 10) <= 100_000
    assert tight.rows < 4000 or tight.groups < 48
    with pytest.raises(MemoryBudgetError, match="smallest chunk"):
        pick_chunk(48, 4000, per_group_fixed=1000, per_group_row=10, budget=100, overhead=1.1, min_rows=1024)


def test_route_rule_follows_the_waterfall_thresholds():
    oracle = MemoryOracle(MemoryConfig(max_dense_dim=100), limit=None, on_gpu=False)
    row = RowBytes(build=8 * 110, store=8 * 50, gram=0, apply=16)
    small = ProblemSize(n_groups=4, n_rows=1000, width=50, itemsize=8, row=row)
    wide = ProblemSize(n_groups=4, n_rows=1000, width=101, itemsize=8, row=row)
    assert oracle.route(small, free=10**9)[0] == "direct"
    assert oracle.route(wide, free=10**9)[0] == "cg"
    needed = 1.1 * (dense_system_bytes(small) + direct_row_bytes(small))
    assert oracle.route(small, free=int(needed / 0.9) - 10)[0] == "cg"  # dense footprint >= 90% of free
    assert oracle.route(small, free=10**9, requested="cg")[0] == "cg"
    capped = MemoryOracle(MemoryConfig(), limit=1000, on_gpu=False)
    assert capped.route(small, free=10**12)[0] == "cg"  # the user's limit caps the free memory


def test_a_gpu_chunk_is_bounded_by_the_budget_alone_and_the_cpus_by_max_chunk_rows():
    """memory.max_chunk_rows (1,024) caps a chunk's rows on the CPU; on a GPU memory.max_chunk_rows_gpu (None:
    every chunk costs launches in each CG product) leaves the rows to the budget, and a value caps them."""
    row = RowBytes(build=8 * 110, store=8 * 50, gram=0, apply=16)
    size = ProblemSize(n_groups=48, n_rows=4000, width=50, itemsize=8, row=row)
    assert MemoryOracle(MemoryConfig(), limit=None, on_gpu=False).plan(size, free=10**12).fit.rows == 1024
    assert MemoryOracle(MemoryConfig(), limit=None, on_gpu=True).plan(size, free=10**12).fit.rows == 4000
    capped = MemoryOracle(MemoryConfig(max_chunk_rows_gpu=2000), limit=None, on_gpu=True)
    assert capped.plan(size, free=10**12).fit.rows == 2000


def test_dual_form_when_a_group_has_fewer_rows_than_columns():
    oracle = MemoryOracle(MemoryConfig(max_dense_dim=100), limit=None, on_gpu=False)
    row = RowBytes(build=8 * 110, store=8 * 50, gram=0, apply=16)
    wide = ProblemSize(n_groups=4, n_rows=80, width=500, itemsize=8, row=row, kernel_row=64,
                       kernel_build=kernel_build_bytes(80, 8, 512, [(5, 40, 2, False)]))
    # N = 80 <= max_dense_dim although D = 500 is not: the N x N system is direct
    assert oracle.route(wide, free=10**9, dual=True)[0] == "direct"
    assert oracle.route(wide, free=10**9, dual=False)[0] == "cg"
    plan = oracle.plan(wide, free=10**9, dual=True)
    assert plan.dual and plan.route == "direct" and plan.fit.groups == 4  # every group's N x N system in one batch
    # K with the bfloat16 leaf indicator (N (R + 1) 2) and one tile of all 80 rows (tile and term,
    # 2 b N 8, the counts' tile b N 2), then K and its factor; all N rows and their whitened copies
    n2 = 80 * 80
    build = 80 * 41 * 2 + 2 * 80 * 80 * 8 + 80 * 80 * 2
    expected = max(n2 * 8 + build, 2 * n2 * 8) + 80 * (8 * 50 + 64)
    assert plan.fit_cost.fixed == expected
    tall = ProblemSize(n_groups=4, n_rows=1000, width=50, itemsize=8, row=row)
    assert not oracle.plan(tall, free=10**9, dual=True).dual  # N >= D: the primal system is smaller


def test_tracker_charges_with_overhead_and_refuses_past_the_budget():
    from tamrun.machine.tracker import BudgetExceeded, MemoryTracker

    tracker = MemoryTracker(budget=1000, overhead_factor=1.1)
    first = tracker.allocate(500, "a")
    assert first == 550 and tracker.would_fit(400) and not tracker.would_fit(410)
    with pytest.raises(BudgetExceeded, match="exceeds the budget"):
        tracker.allocate(500, "b")
    with tracker.hold(300):
        assert tracker.current == 550 + 330
    tracker.release(first)
    assert tracker.current == 0 and tracker.peak == 880
    tracker.reset()
    assert tracker.peak == 0


def test_guard_shrinks_when_the_tracker_refuses():
    from tamrun.machine.tracker import MemoryTracker

    tracker, seen = MemoryTracker(budget=3000, overhead_factor=1.0), []

    def step(size: int) -> int:
        seen.append(size)
        with tracker.hold(size * 100):  # BudgetExceeded is a MemoryError: the guard's business
            return size

    assert retry_on_oom(step, 50, OomConfig(), "fit", OomLog(), sleep=lambda s: None) == 24
    assert seen == [50, 35, 24]


def test_tensor_meter_counts_new_storages_only():
    from tamrun.memory.meter import TensorMeter

    data = torch.zeros(1000, 100, dtype=torch.float64)  # held before: not working memory
    with TensorMeter() as meter:
        view = data[:500]  # a view: nothing new
        scaled = data * 2.0  # 800,000 bytes
        scaled.mul_(3.0)  # in place: nothing new
        total = scaled.sum(dim=0)  # 800 bytes
        del scaled
        again = torch.ones(500, 100, dtype=torch.float64)  # 400,000 bytes, after the first was freed
    assert meter.peak == 800_000 + 800
    assert view.shape == (500, 100) and total.shape == (100,) and again.numel() == 50_000


@pytest.mark.parametrize("device_type, counted", [("cpu", 800_000), ("cuda", 0)])
def test_tensor_meter_counts_only_the_device_it_is_given(device_type, counted):
    """``device_type`` narrows the count to one kind of device (a GPU's tensors beside the host's)."""
    from tamrun.memory.meter import TensorMeter

    with TensorMeter(sample=False, device_type=device_type) as meter:
        kept = torch.ones(1000, 100, dtype=torch.float64)  # on the host
    assert meter.peak == counted and kept.numel() == 100_000


def small_problem() -> ProblemSize:
    return ProblemSize(n_groups=48, n_rows=4000, width=60, itemsize=8, n_predict_rows=400,
                       row=RowBytes(build=8 * 159, store=8 * 60, gram=0, apply=16))


def repeated_work(out: torch.Tensor) -> torch.Tensor:
    """Row chunks that allocate alike (the last one shorter), each summing into ``out`` in place, with an
    inner per-row loop whose later rows repeat the first; what the work keeps (its result) outside them."""
    from tamrun.machine.sampling import repeating, steady

    data = torch.arange(1000 * 50, dtype=torch.float64).reshape(1000, 50)
    loop = object()
    for start in range(0, 1000, 300):  # 300, 300, 300, 100 rows
        rows = data[start:start + 300]
        with repeating(("chunk", loop), rows.shape[0]):
            squared = rows * rows  # 120,000 bytes for a full chunk
            with repeating(("row", rows.shape[1])):
                for row in squared:
                    out += row * 2.0  # 400 bytes each
                    steady()
            del squared, row  # a block is closed: nothing it made outlives it
    return out.clone()  # 400 bytes kept


def test_the_sampled_meter_counts_repeated_work_once_and_gives_the_exact_peak():
    """A block metered once stands for the others of its key (and the shorter last chunk): the peak is the
    one every operation gives, with a fraction of the operations through the hook."""
    from tamrun.memory.meter import TensorMeter

    class CountingMeter(TensorMeter):
        """The meter, counting the operations that reach its hook."""

        operations = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.operations += 1
            return super().__torch_dispatch__(func, types, args, kwargs)

    peaks, results, operations = {}, {}, {}
    for sample in (True, False):
        out = torch.zeros(50, dtype=torch.float64)
        with CountingMeter(sample=sample) as meter:
            results[sample] = repeated_work(out)
        peaks[sample], operations[sample] = meter.peak, meter.operations
    assert peaks[True] == peaks[False] == 400_000 + 120_000 + 400  # the data, a full chunk, a row
    assert operations[True] * 20 < operations[False]  # the first chunk's first row, not 1,000 rows
    assert torch.equal(results[True], results[False])
    assert torch.equal(repeated_work(torch.zeros(50, dtype=torch.float64)), results[True])  # no meter: the plain work


def kept_work() -> torch.Tensor:
    """Chunks kept in a list (a CG system's design) inside a closed block, then used and dropped."""
    from tamrun.machine.sampling import repeating

    data = torch.ones(1000, 50, dtype=torch.float64)
    total = torch.zeros(50, dtype=torch.float64)
    with repeating(("products",)):
        kept = []
        for start in range(0, 1000, 250):
            with repeating(("kept", 250), keeps=True):
                doubled = data[start:start + 250] * 2.0  # 100,000 bytes, dropped
                kept.append(doubled + 1.0)  # 100,000 bytes, kept
                del doubled
        for chunk in kept:
            total += chunk.sum(dim=0)
        del kept, chunk
    return total


def test_the_sampled_meter_counts_what_a_repeated_block_keeps_until_the_block_around_it_ends():
    """Each later chunk is built without the hook: what the first one kept is counted for it, and
    dropped with the block around them, so that the peak and what comes after stay exact."""
    from tamrun.memory.meter import TensorMeter

    peaks = {}
    for sample in (True, False):
        with TensorMeter(sample=sample) as meter:
            total = kept_work()
            after = torch.ones(875, 100, dtype=torch.float64)  # 700,000 bytes: 1,000,400 if the chunks still counted
        peaks[sample] = meter.peak
        assert total[0] == 3000.0 and after.shape == (875, 100)
    assert peaks[True] == peaks[False] == 400_000 + 400 + 3 * 100_000 + 2 * 100_000  # data, total, 3 chunks, the 4th


def test_minimal_limit_is_the_boundary_of_what_can_be_planned():
    oracle = MemoryOracle(MemoryConfig(), limit=None, on_gpu=False)
    minimal = oracle.minimal_limit(small_problem())
    fits = MemoryOracle(MemoryConfig(), limit=minimal, on_gpu=False).plan(small_problem(), free=10**12)
    assert fits.fit.groups >= 1 and fits.predicted_peak <= fits.budget
    with pytest.raises(MemoryBudgetError, match=r"raise memory.limit to at least"):
        MemoryOracle(MemoryConfig(), limit=int(minimal * 0.95), on_gpu=False).plan(small_problem(), free=10**12)


@pytest.mark.parametrize("min_rows", [1024, 100])
def test_cg_refuses_a_chunk_of_fewer_than_min_chunk_rows_and_its_minimal_limit_holds_them(min_rows):
    """Each CG product goes over every chunk: at one group of a few rows a capped run was still fitting
    after 10 minutes. CG's smallest chunk is memory.min_chunk_rows rows (or all of a group's rows);
    at the minimal limit it plans at least that many, 5 % below it refuses and names the setting."""
    cfg = MemoryConfig(min_chunk_rows=min_rows)
    # forest-like rows (leaf indices built per row) in a few long groups: CG's chunk binds, not the predictions
    size = ProblemSize(n_groups=4, n_rows=5000, width=3000, itemsize=8, n_predict_rows=1000,
                       row=RowBytes(build=8 * 400, store=8 * 100, gram=0, apply=16))
    minimal = MemoryOracle(cfg, limit=None, on_gpu=False).minimal_limit(size, route="cg")
    one_row = int(StepCost(cg_system_bytes(size), cg_row_bytes(size, False)).bytes(1, 1, cfg.overhead_factor)
                  / cfg.chunk_fraction_cpu)
    assert minimal > 2 * one_row  # what one row needed: the plan that went on for 10 minutes fitted there
    plan = MemoryOracle(cfg, limit=minimal, on_gpu=False).plan(size, free=10**12, requested="cg")
    assert plan.route == "cg" and plan.fit.rows >= min_rows and plan.fit.bytes <= plan.budget
    for limit in (int(0.95 * minimal), 2 * one_row):
        with pytest.raises(MemoryBudgetError, match=rf"one group, {min_rows} rows, .*memory.min_chunk_rows.* "
                                                    r"raise memory.limit to at least"):
            MemoryOracle(cfg, limit=limit, on_gpu=False).plan(size, free=10**12, requested="cg")


@pytest.mark.parametrize("limit", [None, 50 * 2**20, 5 * 2**20])
def test_every_plan_stays_inside_its_budget(limit):
    for requested in ("direct", "cg"):
        plan = MemoryOracle(MemoryConfig(), limit=limit, on_gpu=False).plan(small_problem(), 64 * 2**30, requested)
        assert plan.fit.bytes <= plan.budget and plan.predict.bytes <= plan.budget
        assert plan.predicted_peak == max(plan.fit.bytes, plan.predict.bytes)
        if limit is not None:
            assert plan.budget == int(MemoryConfig().chunk_fraction_cpu * limit)


@pytest.mark.parametrize("error", [
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried "
                 "to allocate 8000000 bytes. Error code 12 (Cannot allocate memory)"),
    RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 8000000 bytes."),
    RuntimeError("MPS backend out of memory (MPS allocated: 1.00 GB, other allocations: 0 bytes)"),
    RuntimeError("XPU out of memory. Tried to allocate 2.00 GiB"),
    MemoryError(), torch.OutOfMemoryError("CUDA out of memory"),
], ids=["cpu-allocator", "cpu-not-enough", "mps", "xpu", "memory-error", "cuda"])
def test_every_allocators_failure_is_an_oom(error):
    """Each error is raised on purpose (a fake OOM): the guard shrinks the chunk and retries."""
    from tamrun.memory.guard import is_oom

    assert is_oom(error)
    step, seen = failing_until(5, exc=lambda message: error)
    assert retry_on_oom(step, 10, OomConfig(), "fit", OomLog(), sleep=lambda s: None) == 4
    assert seen == [10, 7, 4]


def test_the_tensor_meter_warm_up_never_fails_the_run(monkeypatch):
    """A MemoryError raised on purpose inside the warm-up turns the meter off instead of failing."""
    from tamrun.memory.meter import TensorMeter

    def no_memory(*args, **kwargs):
        raise MemoryError("fake MemoryError raised by the test")

    monkeypatch.setattr(TensorMeter, "__enter__", no_memory)
    assert TensorMeter.warm_up() is False
    monkeypatch.undo()
    assert TensorMeter.warm_up() is True
