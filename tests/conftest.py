"""Shared fixtures: real Hydra composition of conf/, a real sqlite MLflow store in tmp_path,
and a small synthetic CSV dataset; the skip policy (in CI a skipped test fails, but the CUDA ones)."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
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


# The suite's workers (pytest-xdist; `-n auto --dist loadfile` in pyproject.toml): whole test files, two
# workers per core. Much of a test's time is spent waiting on the processes it starts (CLI runs, servers,
# clusters, pip): on 2 cores, 4 workers keep about 1.7 cores busy, where one process, doing the same CPU
# work in 3,804 s, kept about 1.0 (docs/reliability.md, "The suite's time"). `-n 0` runs in this one process
# (a single test under a debugger).
WORKERS_PER_CORE = 2
MAX_WORKERS = 8  # a larger machine: more would start more servers and clusters at once than they gain

# The files that take longest, longest first: their tests' seconds summed, over 180 s in a fresh-clone run
# with 4 workers on 2 cores (2026-11-27, `--junitxml`; test_scale_page.py with test_ray_output.py, which
# shares its worker). They go to the workers first, so that none of them is left running alone at the end
# (longest first is what balances the workers); the other files follow in collection order.
LONGEST_FILES = (
    "test_memory_runs.py", "test_readme.py", "test_limits.py", "test_scale_page.py", "test_store_interrupts.py",
    "test_placement.py", "test_bad_input.py", "test_bench.py", "test_postgres.py", "test_aggregate.py",
    "test_locked_server.py", "test_team_cluster.py", "test_ray_cluster.py", "test_sweeps.py", "test_serving.py",
    "test_faults.py", "test_cli.py",
)


# Files that must not run beside each other, each mapped to the file whose worker runs it after that one:
# Ray's local instance (ray.init with no address) and docs/scale.md's `ray start` (as written for users) both
# take Ray's fixed dashboard-agent port (52365), so two of them at once would refuse the second.
SAME_WORKER = {"test_ray_output.py": "test_scale_page.py"}


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with the files of `SAME_WORKER` in the scope of the file they map to."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            name = Path(path).name
            return str(Path(path).with_name(SAME_WORKER[name])) if name in SAME_WORKER else path

    return FileScheduling(config, log)


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: `WORKERS_PER_CORE` per core this process may run on, at most `MAX_WORKERS`."""
    return min(MAX_WORKERS, WORKERS_PER_CORE * len(os.sched_getaffinity(0)))


# The quick tier, `pytest -m quick`: the edit loop's run, in at most 3 minutes on 2 cores (docs/reliability.md
# gives its times). These test files (or ``file::test`` ids), chosen fast, together import every module of
# tamrun, in the test process or in the Python processes its tests start (tests/quick_imports); a run of
# the whole tier fails, naming them, if some module was never imported (`pytest_sessionfinish`). The
# marker is given here, in one place, never in the test files.
QUICK_TESTS = (
    "test_effects.py", "test_solvers.py", "test_memory.py", "test_forest.py", "test_params.py", "test_ui_view.py",
    "test_architecture.py", "test_run_names.py", "test_expressions.py", "test_leakage.py", "test_sweep_summary.py",
    "test_intervals.py", "test_data_files.py", "test_metric_keys.py", "test_warm_up.py",
    "test_validation_progress.py", "test_dates.py", "test_aggregation_rules.py", "test_threads.py", "test_reference.py",
    "test_cli.py::test_runs_from_any_directory_with_the_default_store",
    "test_compare.py::test_the_table_shows_the_objective_and_an_older_runs_peak_in_mib",
    "test_sweeps.py::test_a_parallel_sweep_records_every_job_under_one_parent", "test_imports.py",
)
QUICK = "quick"
QUICK_IMPORTS = "TAMRUN_QUICK_IMPORTS"  # the folder where each child names the tamrun modules it imported


def is_xdist_worker(config) -> bool:
    """Whether this process is one of pytest-xdist's workers (the controller hands it tests)."""
    return hasattr(config, "workerinput")


def quick_selected(config) -> bool:
    return config.getoption("markexpr", "") == QUICK and not config.getoption("keyword", "")


def pytest_configure(config) -> None:
    """A quick-tier run: the Python processes the tests start record their imports (tests/quick_imports)."""
    if quick_selected(config) and not is_xdist_worker(config):  # a worker inherits the folder and the path
        config.pluginmanager.register(TestsReported(), TestsReported.name)
        folder = Path(__file__).parent / "quick_imports"
        os.environ[QUICK_IMPORTS] = tempfile.mkdtemp(prefix="tamrun-quick-imports-")
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(folder), os.environ.get("PYTHONPATH"))))


def pytest_collection_modifyitems(config, items) -> None:
    """The marker `QUICK` on every test of `QUICK_TESTS`; the files of `LONGEST_FILES` first, in its order
    (the sort is stable: each file's tests, and the other files, keep their order)."""
    for item in items:
        if any(quick_entry(item.nodeid.removeprefix("tests/"), entry) for entry in QUICK_TESTS):
            item.add_marker(QUICK)
    items.sort(key=lambda item: LONGEST_FILES.index(item.path.name) if item.path.name in LONGEST_FILES
               else len(LONGEST_FILES))


def tamrun_modules() -> List[str]:
    """Every module of tamrun on disk, by the name it is imported as (tamrun/hydra_plugins/x installs as
    the top-level hydra_plugins.x: pyproject.toml)."""
    top = Path(__file__).resolve().parents[1] / "tamrun"
    names = []
    for path in sorted(top.rglob("*.py")):
        parts = list(path.relative_to(top.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts[1:2] == ["hydra_plugins"]:
            parts.pop(0)
        names.append(".".join(parts))
    return names


def imported_modules() -> set:
    """The tamrun modules this process and the Python processes it started imported."""
    names = set(sys.modules)
    for record in Path(os.environ[QUICK_IMPORTS]).glob("*.txt"):
        names.update(record.read_text(encoding="utf-8").split())
    return names


class TestsReported:
    """A plugin: the tests whose setup was reported (by nodeid relative to tests/) to the process that writes
    the report, the controller of xdist's workers or the one process of ``-n 0``."""

    name = "tamrun-tests-reported"

    def __init__(self) -> None:
        self.nodeids: set = set()

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "setup":
            self.nodeids.add(report.nodeid.removeprefix("tests/"))


def quick_entry(nodeid: str, entry: str) -> bool:
    """Whether the test ``nodeid`` (relative to tests/) is the `QUICK_TESTS` entry ``entry`` or in it."""
    return nodeid == entry or nodeid.startswith((entry + "::", entry + "["))


def pytest_sessionfinish(session, exitstatus) -> None:
    """After a run of the whole quick tier (``-m quick``, every file of `QUICK_TESTS` collected): fail,
    naming them, if an entry matches no test or a module of tamrun was never imported."""
    if not quick_selected(session.config):
        return
    if is_xdist_worker(session.config):  # its imports, for the check the controller makes
        record = Path(os.environ[QUICK_IMPORTS]) / f"worker-{os.getpid()}.txt"
        record.write_text("\n".join(name for name in sys.modules if name.split(".")[0] in ("tamrun", "hydra_plugins")),
                          encoding="utf-8")
        return
    imported = imported_modules()
    shutil.rmtree(os.environ[QUICK_IMPORTS], ignore_errors=True)
    ran = sorted(session.config.pluginmanager.get_plugin(TestsReported.name).nodeids)
    files = {name.split("::")[0] for name in QUICK_TESTS}
    absent = [name for name in sorted(files) if not (Path(__file__).parent / name).exists()]
    if not absent and {nodeid.split("::")[0] for nodeid in ran} != files:
        return  # a part of the tier (a file named on the command line)
    problems = [f"{name} (QUICK_TESTS) matches no test" for name in QUICK_TESTS
                if not any(quick_entry(nodeid, name) for nodeid in ran)]
    problems += [f"{name} was never imported" for name in tamrun_modules() if name not in imported]
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        reporter.ensure_newline()
        reporter.write_line(f"tamrun: the quick tier does not cover tamrun: {'; '.join(problems)}; add a test "
                            "that reaches it to QUICK_TESTS (tests/conftest.py)", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def store_uri(tmp_path: Path) -> str:
    """A fresh sqlite MLflow store for one test."""
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture(scope="module")
def migrated_store(tmp_path_factory) -> Path:
    """An empty sqlite store with MLflow's tables and migrations done once (a fresh store costs seconds
    of migrations; each case gets its own copy)."""
    from tamrun.tracking.store.store import open_client

    db = tmp_path_factory.mktemp("template") / "mlflow.db"
    open_client(f"sqlite:///{db}", 60, 60)
    return db


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
    """A run's logged metrics by plain name (``system/solver/cg_iterations`` -> ``cg_iterations``;
    `tamrun.tracking.metric_keys`)."""
    from tamrun.tracking.metric_keys import metric_name

    return {metric_name(key): value for key, value in logged.items()}


def log_recorded_model(client, experiment_id: str, run_id: str, folder: Path) -> str:
    """A LoggedModel of the run ``run_id`` whose one file (an MLmodel naming it, written in ``folder``) is
    uploaded through ``client`` and recorded in its store as a run records its model's files
    (`tamrun.tracking.model_files`), so that registering's check of its files passes; its id."""
    from mlflow.models import Model

    from tamrun.tracking.model_files import MANIFEST_TAG, file_digests, manifest_text

    logged = client.create_logged_model(experiment_id, source_run_id=run_id, name="model")
    folder.mkdir(parents=True, exist_ok=True)
    Model(run_id=run_id, model_id=logged.model_id).save(str(folder / "MLmodel"))
    client.log_model_artifacts(logged.model_id, str(folder))
    client.set_logged_model_tags(logged.model_id, {MANIFEST_TAG: manifest_text(file_digests(folder))})
    return logged.model_id
