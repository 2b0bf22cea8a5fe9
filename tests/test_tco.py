"""The plan per machine class (tamrun/tco/, conf/tco/default.yaml): a class too small does not fit and says
the memory it lacks, a chunked class's time carries the measured chunking overhead, the cost is in the run
and in `python -m tamrun.compare`, and a price of zero or less is refused naming its class."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from mlflow import MlflowClient

from conftest import by_name, csv_overrides
from tamrun.compare.__main__ import main as compare
from tamrun.config.load import typed_config
from tamrun.errors import ConfigError
from tamrun.runner import run
from tamrun.tco.plan import DOES_NOT_FIT, FITS_CHUNKED, FITS_UNCHUNKED, GIB, ClassFit, Work, priced
from tamrun.tco.time import CG_REBUILD_FACTOR, CHUNK_STEP_OVERHEAD, chunk_overhead

MIB = 2**20
# Two GPU classes (what a GPU class holds before the plan is fixed: a CUDA context) around the synthetic
# run's needs, and the CPU class it is measured on.
HOST = "+tco.classes.host={kind: cpu, cores: 2, memory_gib: 64, bandwidth_gbs: 10, price_per_hour: 0.36}"
QUICK = ["tracking.log_plots=false", "tracking.log_model=false", "tracking.log_predictions=false", "progress=off",
         "tco.measured_on=host"]


def gpu_class(name: str, memory_bytes: int, price: float = 1.0) -> str:
    return (f"+tco.classes.{name}={{kind: gpu, memory_gib: {memory_bytes / GIB!r}, bandwidth_gbs: 100, "
            f"price_per_hour: {price}}}")


def plan_of(compose_cfg, csv_path, *extra):
    """mode=plan on the synthetic CSV with only the classes ``extra`` adds (`RunResult.tco`)."""
    return run(compose_cfg(*csv_overrides(csv_path), "mode=plan", "~tco", "+tco={classes: {}}", *extra)).tco


def test_a_class_too_small_does_not_fit_and_says_the_memory_it_lacks(compose_cfg, csv_path):
    context = 512 * MIB  # tamrun.machine.gpu.CUDA_CONTEXT_ESTIMATE: nothing is left for the run
    tco = plan_of(compose_cfg, csv_path, gpu_class("small", context))
    small = tco.by_name("small")
    assert small.fit == DOES_NOT_FIT and small.lacking_bytes > 0
    assert "does not fit (lacks" in tco.describe()
    # the memory it lacks is exactly what it lacks: with it the class fits (chunked), a MiB less does not
    enough = plan_of(compose_cfg, csv_path, gpu_class("enough", context + small.lacking_bytes),
                     gpu_class("short", context + small.lacking_bytes - MIB), gpu_class("big", 64 * GIB),
                     "tco.measured_on=big", "tco.work_seconds=10")
    assert enough.by_name("enough").fit == FITS_CHUNKED and enough.by_name("short").fit == DOES_NOT_FIT
    assert enough.by_name("big").fit == FITS_UNCHUNKED
    chunked = enough.by_name("enough")
    assert chunked.steps > enough.by_name("big").steps == 1
    # mode=plan prices tco.work_seconds, measured on `big`: the chunked class pays the measured overhead
    assert enough.by_name("big").seconds == pytest.approx(10.0, rel=1e-12)
    assert chunked.seconds == pytest.approx(10.0 * chunk_overhead(chunked.route, chunked.steps), rel=1e-12)
    assert (enough.cheapest, enough.next_cheapest) == ("big", "enough") and enough.by_name("short").seconds is None


def fitted(name: str, route: str, steps: int, kept: bool = True, bandwidth: float = 10.0, price: float = 1.0):
    return ClassFit(name, "cpu", GIB, price, bandwidth, FITS_CHUNKED if steps > 1 else FITS_UNCHUNKED, GIB, 2, route,
                    48 // steps, 1024, kept, steps)


def test_a_chunked_class_time_carries_the_measured_chunking_overhead():
    measured = fitted("here", "cg", 1)
    fits = [measured, fitted("chunked", "cg", 6, bandwidth=20.0), fitted("rebuilt", "cg", 12, kept=False),
            fitted("direct", "direct", 3, bandwidth=5.0, price=0.5),
            ClassFit("tiny", "cpu", GIB, 0.01, 10.0, DOES_NOT_FIT, lacking_bytes=GIB)]
    plan = priced(fits, "here", Work(fixed=2.0, chunked=10.0, on="here", overhead=measured.overhead), [])
    expected = {
        "here": 2.0 + 10.0,
        "chunked": (2.0 + 10.0 * (1 + CHUNK_STEP_OVERHEAD["cg"] * 5)) * 10 / 20,
        "rebuilt": 2.0 + 10.0 * (1 + CHUNK_STEP_OVERHEAD["cg"] * 11) * CG_REBUILD_FACTOR,
        "direct": (2.0 + 10.0 * (1 + CHUNK_STEP_OVERHEAD["direct"] * 2)) * 10 / 5,
    }
    for name, seconds in expected.items():
        c = plan.by_name(name)
        assert c.seconds == pytest.approx(seconds, rel=1e-12)
        assert c.cost_usd == pytest.approx(seconds * c.price_per_hour / 3600, rel=1e-12)
    assert plan.by_name("tiny").seconds is None  # a class that does not fit has no time
    costs = sorted((c.cost_usd, c.name) for c in plan.classes if c.cost_usd is not None)
    assert plan.cheapest == costs[0][1] and plan.next_cheapest == costs[1][1]
    assert plan.beats_next_usd == pytest.approx(costs[1][0] - costs[0][0], rel=1e-12)
    # a run measured under chunks of its own is scaled back through its own overhead
    chunked_run = Work(fixed=2.0, chunked=10.0, on="chunked", overhead=chunk_overhead("cg", 6))
    again = priced(fits, "chunked", chunked_run, [])
    assert again.by_name("chunked").seconds == pytest.approx(12.0, rel=1e-12)
    assert again.by_name("here").seconds == pytest.approx((2.0 + 10.0 / (1 + CHUNK_STEP_OVERHEAD["cg"] * 5)) * 2,
                                                          rel=1e-12)


def test_the_cost_is_in_the_run_and_in_compare(compose_cfg, csv_path, store_uri, tmp_path, capsys):
    extra = [HOST, gpu_class("small", 512 * MIB, price=0.01), "tracking.run_name='custom-csv on a gpu'"]  # a name with spaces, as on a GPU
    result = run(compose_cfg(*csv_overrides(csv_path), *QUICK, *extra))
    client = MlflowClient(store_uri)
    recorded = client.get_run(result.run_id).data
    metrics = by_name(recorded.metrics)
    assert "cost_usd" in recorded.metrics and "system/time/compute_seconds" in recorded.metrics  # cost at the top level
    seconds = metrics["compute_seconds"]
    assert seconds == pytest.approx(metrics["features_seconds"] + metrics["solve_seconds"]
                                    + metrics["predict_seconds"], rel=1e-9)
    assert metrics["cost_usd"] == pytest.approx(seconds * 0.36 / 3600, rel=1e-9)
    assert recorded.tags["tco_measured_on"] == "host"
    # the tiny GPU class does not fit: the cheapest class that fits is a class of the default group
    assert recorded.tags["tco_cheapest"] == result.tco.cheapest != "small"
    assert metrics["cost_cheapest_usd"] == pytest.approx(result.tco.by_name(result.tco.cheapest).cost_usd)
    with open(client.download_artifacts(result.run_id, "tco/plan.json", str(tmp_path))) as plan:
        record = json.load(plan)
    assert {c["name"]: c["fit"] for c in record["classes"]}["small"] == DOES_NOT_FIT
    assert not [key for key in recorded.params if key.startswith("tco.")]  # prices are not params
    compare(["--store", store_uri, "--sort", "cost_usd"])  # in-process: tests/test_compare.py runs the command
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("best"))
    columns = re.split(" {2,}", header)  # cells are set apart by two spaces or more; a run's name has one
    assert columns.index("cost_usd") == columns.index("mape_test") + 1  # accuracy beside cost
    row = re.split(" {2,}", lines[lines.index(header) + 1])
    assert row[0] == "*" and float(row[columns.index("cost_usd")]) == pytest.approx(
        metrics["cost_usd"], rel=1e-3)


@pytest.mark.parametrize("price", ["0", "-0.5"])
def test_a_price_of_zero_or_less_is_a_config_error_naming_the_class(compose_cfg, price):
    with pytest.raises(ConfigError) as error:
        typed_config(compose_cfg(f"tco.classes.t4_16.price_per_hour={price}"))
    assert error.value.field == "tco.classes.t4_16.price_per_hour" and "> 0" in str(error.value)


def test_the_command_line_refuses_a_negative_price_with_exit_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tamrun", "mode=plan", "tco.classes.h100_80.price_per_hour=-3"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "tamrun: config error: tco.classes.h100_80.price_per_hour=-3.0" in done.stdout + done.stderr
