"""Shared fixtures: real Hydra composition of conf/, a real sqlite MLflow store in tmp_path,
and a small synthetic CSV dataset; the skip policy (in CI a skipped test fails, but the CUDA ones)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np
import pandas as pd
import pytest

# Ray 2.60's local ray.init (hydra.launcher.ray.init.address=null) writes a token to ~/.ray/auth_token
# unless RAY_AUTH_MODE is set; the heads that later tests start with `ray start` then demand it and
# `ray status` (auth disabled) is refused: every Ray test after the first local one fails. The tests'
# Ray processes (children of this one) run without token authentication.
RAY_TEST_ENV = {"RAY_AUTH_MODE": "disabled"}
os.environ.update(RAY_TEST_ENV)
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from tamrun.config.load import config_dir
from tamrun.config.store import register_configs

# The only tests a CI run (CI=true) may skip, by marker, and why; any other skip fails the run there, so
# that a feature whose test cannot run (a system package missing, a dependency not installed) is seen.
SKIPS_ALLOWED_IN_CI = {"gpu": "needs a CUDA device, which CI never has (the GPU check is .ci/gpu)"}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI a skip outside `SKIPS_ALLOWED_IN_CI` becomes a failure naming the skip's reason."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci() and not any(item.get_closest_marker(m) for m in SKIPS_ALLOWED_IN_CI) \
            and not hasattr(report, "wasxfail"):
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (f"skipped in CI ({reason}): every test but those of SKIPS_ALLOWED_IN_CI "
                           "(tests/conftest.py) must run there; install what it needs (.ci/system-packages)")


def pytest_terminal_summary(terminalreporter) -> None:
    """One line at the end: how many tests skipped, and why (grouped by reason)."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons = {}
    for report in skipped:
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reasons[reason.removeprefix("Skipped: ")] = reasons.get(reason.removeprefix("Skipped: "), 0) + 1
    terminalreporter.write_line(f"tamrun: {len(skipped)} test(s) skipped: " +
                                "; ".join(f"{n} {reason}" for reason, n in sorted(reasons.items())))


@pytest.fixture
def store_uri(tmp_path: Path) -> str:
    """A fresh sqlite MLflow store for one test."""
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture
def compose_cfg(store_uri: str) -> Callable[..., object]:
    """compose_cfg(*overrides) -> the composed config (tracking into the test's own store)."""

    def _compose(*overrides: str):
        register_configs()
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            return compose(config_name="config", overrides=[f"tracking.uri={store_uri}", *overrides])

    yield _compose
    GlobalHydra.instance().clear()


def synthetic_frame(days: int = 400, groups: int = 3, seed: int = 0) -> pd.DataFrame:
    """Hourly rows: x uniform in [0, 10], dow = day of week, g = hour mod ``groups``,
    y = 5 + 2 sin(x) + 0.3 dow + 0.5 g + N(0, 0.1^2)."""
    rng = np.random.default_rng(seed)
    dates = pd.date_range("2020-01-01", periods=24 * days, freq="h")
    x = rng.uniform(0, 10, len(dates))
    group = dates.hour % groups
    dow = dates.day_of_week
    y = 5 + 2 * np.sin(x) + 0.3 * dow + 0.5 * group + rng.normal(0, 0.1, len(dates))
    return pd.DataFrame({"date": dates, "x": x, "dow": dow, "g": group, "y": y})


@pytest.fixture
def csv_path(tmp_path: Path) -> Path:
    path = tmp_path / "synthetic.csv"
    synthetic_frame().to_csv(path, index=False)
    return path


def csv_overrides(path: Path) -> List[str]:
    """Overrides that fit a spline + categorical model on the synthetic CSV (train 2020, test 2021)."""
    return [
        "data=csv", f"data.path={path}", "data.target=y", "data.group=g", "model=custom",
        "+model.effects.sx={kind: spline, column: x, k: 10, ap: -6}",
        "+model.effects.dow={kind: categorical, column: dow, topo: nominal, ap: -6}",
        "split.train_end=2020-12-31", "split.test_start=2021-01-01", "split.test_end=null",
    ]


def terminal_signals() -> None:
    """``preexec_fn`` of a child that must take Ctrl-C and SIGTERM as a terminal's user would: SIGINT,
    SIGTERM and SIGHUP back at their default disposition. A shell's background job, nohup or a CI
    runner may start the test process with SIGINT ignored, and an ignored disposition is inherited
    across exec (tamrun, rightly, leaves an ignored signal ignored)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def sh_blocks(page: Path) -> List[str]:
    """A docs page's ```sh blocks, in order (fenced at the start of a line): the walk-throughs the page
    tests run as written (tests/test_scale_page.py, tests/test_serving_page.py)."""
    blocks, current = [], None
    for line in page.read_text(encoding="utf-8").splitlines():
        if current is None and line == "```sh":
            current = []
        elif current is not None and line == "```":
            blocks.append("\n".join(current))
            current = None
        elif current is not None:
            current.append(line)
    return blocks


# A run priced at a known class: its cost_usd is its compute_seconds x 0.36 / 3600 (`assert_priced`).
PRICED = ("tco.measured_on=cpu_2c_8g", "tco.classes.cpu_2c_8g.price_per_hour=0.36")


def assert_priced(metrics: Dict[str, float], *phases: str) -> None:
    """A run under `PRICED` logged its cost: ``cost_usd`` = ``compute_seconds`` x 0.36 $/h, and the compute
    seconds cover at least the metrics ``phases`` (the job's own phase seconds)."""
    assert metrics["compute_seconds"] > 0
    assert metrics["cost_usd"] == pytest.approx(metrics["compute_seconds"] * 0.36 / 3600, rel=1e-9)
    assert metrics["compute_seconds"] >= sum(metrics[name] for name in phases) * (1 - 1e-9)


def by_name(logged: Dict[str, float]) -> Dict[str, float]:
    """A run's logged metrics by plain name (``solver/cg_iterations`` -> ``cg_iterations``;
    `tamrun.tracking.metric_keys`)."""
    from tamrun.tracking.metric_keys import metric_name

    return {metric_name(key): value for key, value in logged.items()}
