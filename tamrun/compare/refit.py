"""``--refit``: the best run's config run again with ``split.refit=true`` before its model is registered.

    the best run's overrides (its artifact config/overrides.txt: the command line, a sweep job's swept
    values included) -> ``python -m tamrun <them> split.refit=true ++tracking.tags.refit_of=<its id>``
    in the best run's store (handed in MLFLOW_TRACKING_URI, never on a command line: a URI's password stays
    out of the process list) and experiment -> the refit run, found by its tag, its resolved config the best
    run's but for split.refit and where it is recorded (tracking.*) -> its model registered (not the best's)

The refit (`tamrun.jobs.refit`) is trained through the end of the validation period the best run was
chosen on, its intervals calibrated on that period's held-out residuals. A mode=backtest best run is
refitted as a mode=run whose validation period is the days its windows scored (`backtest_period`): trained
through their last day, its intervals calibrated on that period's residuals forecast from its first cut-off. The best run's relative paths
(its data file) lead from this folder, as they did from the one it ran in. Refused with one line, before
anything is registered: a best run of another mode than run or backtest, or without a validation period, one whose
overrides were logged with a secret masked, a config that no longer runs (its data file gone: the refit's
own error line quoted) or no longer composes to the best run's (a preset changed since).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import pandas as pd

from tamrun.errors import ConfigError
from tamrun.redact import MASK

REFIT_TAG = "refit_of"
OVERRIDES_ARTIFACT, RESOLVED_ARTIFACT = "config/overrides.txt", "config/resolved.yaml"
# Where and how a run is recorded: set by the refit's own command line, dropped from the best run's.
RECORDING = ("tracking", "progress", "split.refit")
# A backtest's best run is refitted as mode=run on the days its windows scored (`backtest_period`).
REPLANNED = ("mode", "split.validation_start", "split.validation_end", "split.train_end", "split.test_start",
             "split.test_end")
URI_ENV, EXPERIMENT_ENV, EXPERIMENT_ID_ENV = "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID"


def check_refittable(best: Any) -> None:
    """Refuse a best run that ``split.refit`` cannot refit: another mode than run or backtest, no
    validation period (a backtest's days are its held-out period)."""
    params = best.run.data.params
    mode = params.get("mode.name", "run")
    if mode == "backtest":
        return
    if mode != "run":
        raise ConfigError("--refit", best.name, f"the best run is mode={mode}: only a mode=run run (on its validation "
                          "period) or a mode=backtest run (on its windows' days) is refitted", "register it without --refit")
    if params.get("split.validation_start", "null") == "null":
        raise ConfigError("--refit", best.name, "the best run has no validation period (split.validation_start): "
                          "it was fitted on every training row already, there is nothing to refit",
                          "register it without --refit, or choose among runs with a validation period")


def backtest_period(best: Any) -> List[str]:
    """A backtest's best run refitted as mode=run: the days its windows scored (split.test_start to the last
    horizon's end) held out as the validation period, whose residuals calibrate the intervals, then the
    training through their last day; the test period the days after it (the data must have some)."""
    from tamrun.config.offsets import cutoff_days, horizon_ends
    from tamrun.config.schema import BacktestConfig

    params = best.run.data.params
    settings = BacktestConfig(windows=int(params.get("backtest.windows", BacktestConfig.windows)),
                              horizon=params.get("backtest.horizon", BacktestConfig.horizon),
                              step=params.get("backtest.step", BacktestConfig.step))
    first = params["split.test_start"]
    last = horizon_ends(cutoff_days(first, settings), settings).max() - pd.Timedelta(days=1)
    return ["mode=run", f"split.validation_start={first}", f"split.validation_end={last:%Y-%m-%d}",
            f"split.train_end={last:%Y-%m-%d}", f"split.test_start={last + pd.Timedelta(days=1):%Y-%m-%d}",
            "split.test_end=null"]


def overridden_key(override: str) -> str:
    """The key an override sets: ``model.effects.x.ap`` of ``+model.effects.x.ap=1``, ``tracking`` of
    ``tracking=server``."""
    return override.split("=", 1)[0].lstrip("+~")


def rerun_overrides(client: Any, best: Any, folder: Path) -> List[str]:
    """The best run's overrides as its command line gave them, without those of `RECORDING` (and of a
    backtest's `REPLANNED`, set again by `backtest_period`)."""
    path = download(client, best, OVERRIDES_ARTIFACT, folder)
    kept, dropped = [], replaced(best)
    for line in path.read_text(encoding="utf-8").splitlines():
        key = overridden_key(line)
        if not line.strip() or any(key == own or key.startswith(own + ".") for own in dropped):
            continue
        if line.startswith("-") or key.startswith("hydra"):  # a run's overrides set neither Hydra's flags nor its own settings
            raise ConfigError("--refit", best.name, f"the best run's {OVERRIDES_ARTIFACT} holds {line!r}, which no "
                              "run's overrides hold (a flag or a setting of Hydra's)", "register it without --refit, "
                              "or run its config again by hand with split.refit=true and register that run")
        if MASK in line:
            raise ConfigError("--refit", best.name, f"the best run's override {line!r} was logged with a secret "
                              "masked: it cannot be run again from the store", "run its config again by hand with "
                              "split.refit=true (secrets in environment variables), and register that run")
        kept.append(line)
    return kept + (backtest_period(best) if is_backtest(best) else [])


def is_backtest(best: Any) -> bool:
    return getattr(best, "run", best).data.params.get("mode.name") == "backtest"


def replaced(best: Any) -> tuple:
    """The settings a refit of ``best`` sets itself: `RECORDING`, and a backtest's `REPLANNED`."""
    return RECORDING + (REPLANNED if is_backtest(best) else ())


def download(client: Any, best: Any, artifact: str, folder: Path) -> Path:
    """The best (or refit) run's artifact ``artifact`` in ``folder``; `ConfigError` when the run has none."""
    from mlflow.exceptions import MlflowException

    run = getattr(best, "run", best)
    try:
        return Path(client.download_artifacts(run.info.run_id, artifact, str(folder)))
    except (MlflowException, OSError) as exc:
        raise ConfigError("--refit", run.info.run_name or run.info.run_id, f"the run's {artifact} cannot be read "
                          f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})",
                          "register it without --refit, or run its config again by hand with split.refit=true") from None


def refit_command(overrides: List[str], best: Any, experiment: str) -> List[str]:
    """``python -m tamrun`` with the best run's overrides, split.refit, its tag and experiment; the store
    is read from MLFLOW_TRACKING_URI (`refit_env`)."""
    return [sys.executable, "-m", "tamrun", *overrides, "split.refit=true",
            f"++tracking.tags.{REFIT_TAG}={best.run.info.run_id}", f"tracking.experiment={experiment}",
            "tracking.uri=null", f"tracking.uri_env={URI_ENV}", "tracking.enabled=true", "tracking.log_model=true",
            "progress=off"]


def refit_env(store: str, experiment: str) -> Dict[str, str]:
    """This process's environment with the store and the experiment set for the refit."""
    env = {key: value for key, value in os.environ.items() if key != EXPERIMENT_ID_ENV}
    env.update({URI_ENV: store, EXPERIMENT_ENV: experiment})
    return env


def refit_run(client: Any, best: Any, store: str, experiment: str) -> Any:
    """The refit of ``best`` (the module doc): run, found and checked; a refit run itself when ``best`` is one."""
    if best.run.data.tags.get(REFIT_TAG):
        return best.run
    check_refittable(best)
    with tempfile.TemporaryDirectory(prefix="tamrun-refit-") as folder:
        command = refit_command(rerun_overrides(client, best, Path(folder)), best, experiment)
        started = int(time.time() * 1000)
        done = subprocess.run(command, env=refit_env(store, experiment), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            said = [line for line in done.stderr.splitlines() if line.startswith("tamrun:")] or \
                done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
            raise ConfigError("--refit", best.name, "the best run's config did not run again (its run said: "
                              f"{said[-1].removeprefix('tamrun: ')})", "fix what it names (run from the folder the "
                              "best run ran in: its relative paths lead from there) and run --refit again")
        found = client.search_runs([best.run.info.experiment_id], f"tags.{REFIT_TAG} = '{best.run.info.run_id}'",
                                   order_by=["attributes.start_time DESC"], max_results=1)
        if not found or found[0].info.start_time < started or found[0].info.status != "FINISHED":
            raise ConfigError("--refit", best.name, "the refit ran but its run is not in the store",
                              "run --refit again; check that nothing else writes to this store's experiment")
        check_same_config(client, best, found[0], Path(folder))
    return found[0]


def check_same_config(client: Any, best: Any, refit: Any, folder: Path) -> None:
    """Refuse a refit whose resolved config is not the best run's (but for `RECORDING`): a preset of
    conf/ changed since the best run, or a path that leads elsewhere from here."""
    import yaml

    def settings(run: Any, where: str) -> Dict[str, Any]:
        from tamrun.tracking.params import flatten

        text = download(client, run, RESOLVED_ARTIFACT, folder / where).read_text(encoding="utf-8")
        flat = flatten(yaml.safe_load(text) or {})
        return {key: value for key, value in flat.items()
                if not any(key == own or key.startswith(own + ".") for own in replaced(best))}

    before, after = settings(best, "best"), settings(refit, "refit")
    differ = sorted(key for key in before.keys() | after.keys() if before.get(key) != after.get(key))
    if differ:
        shown = ", ".join(f"{key}: {before.get(key)!r} -> {after.get(key)!r}" for key in differ[:3])
        raise ConfigError("--refit", best.name, f"the refit's config is not the best run's ({shown}"
                          f"{', ...' if len(differ) > 3 else ''}; a preset under conf/ changed since, or a path "
                          f"leads elsewhere from here): its run {refit.info.run_id} is not registered",
                          "run the compare from the folder and checkout the best run ran in, or register it "
                          "without --refit")
