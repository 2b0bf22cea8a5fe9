"""``python -m tamrun.compare``: the runs of a tamrun store as a table, and where to open them in the UI.

    python -m tamrun.compare                                    # the last 20 runs of outputs/mlflow.db
    python -m tamrun.compare -n 5
    python -m tamrun.compare --sweep last                       # the newest sweep's jobs (or a sweep id)
    python -m tamrun.compare --filter "metrics.rmse_test < 1700 and params.route = 'direct'"
    python -m tamrun.compare --store http://tracking-host:5000 --experiment tamrun
    python -m tamrun.compare --sweep last --sort rmse_validation     # ranked, least first, the best marked
    python -m tamrun.compare --sweep last --best                      # the best run's id, name and model URI
    python -m tamrun.compare --sweep last --best --register load-fc   # ... registered as load-fc@champion
    python -m tamrun.compare --sweep last --best --register load-fc --refit   # ... refitted through its
                                                                # validation period first (tamrun.compare.refit)

The best run (`tamrun.compare.best`): the first FINISHED run on the ranking metric (``--sort``, default
rmse_validation when a shown run logged it, else rmse_test), least first unless ``--descending``.

Exit codes: 0, or 2 with one line (``tamrun: config error: <option>=<value>: ... Fix: ...``) for a store
or experiment that does not exist, a filter MLflow cannot parse or one that names a metric no run logged,
a --sort metric no shown run logged, no best run, a best run without a logged model to register, and
for a locked server's refusal (no or wrong credentials, an untrusted certificate, an experiment the
user may not read), --refit without --register, and a best run --refit cannot refit
(`tamrun.compare.refit`). A user who may only READ the experiment sees its runs and sweeps.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, List, Optional

from tamrun.compare.register import DEFAULT_ALIAS
from tamrun.errors import ConfigError, TamrunError

DEFAULT_COUNT = 20


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    from tamrun.config.schema import TrackingConfig
    from tamrun.tracking.mlflow_run import tracking_uri

    parser = argparse.ArgumentParser(prog="python -m tamrun.compare", description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=tracking_uri(TrackingConfig()),
                        help="the MLflow store (default: the one python -m tamrun writes to from here: "
                             "MLFLOW_TRACKING_URI when set, else outputs/mlflow.db)")
    parser.add_argument("--experiment", default=os.environ.get("MLFLOW_EXPERIMENT_NAME", "").strip()
                        or TrackingConfig.experiment, help="the experiment (default: MLFLOW_EXPERIMENT_NAME when set, "
                        "else %(default)s)")
    parser.add_argument("-n", "--last", type=int, default=DEFAULT_COUNT, help="how many runs (default: %(default)s)")
    parser.add_argument("--sweep", help="a sweep's jobs: its id (the sweep_id tag) or 'last'")
    parser.add_argument("--filter", default="", help="MLflow's search syntax, e.g. \"metrics.rmse_test < 1700\"")
    parser.add_argument("--sort", help="rank the runs on this metric, least first, and mark the best")
    parser.add_argument("--descending", action="store_true", help="with --sort: most first (a metric to maximise)")
    parser.add_argument("--best", action="store_true", help="print the best run's id, name and model URI only")
    parser.add_argument("--register", metavar="NAME", help="register the best run's model as a new version of "
                        "NAME, with the alias --alias (implies --best)")
    parser.add_argument("--refit", action="store_true", help="with --register: run the best run's config again "
                        "with split.refit=true (trained through the end of its validation period, its intervals "
                        "calibrated on that period's held-out residuals), tag that run refit_of=<best run id> and "
                        "register its model, not the best run's")
    parser.add_argument("--alias", default=DEFAULT_ALIAS, help="the alias --register moves to the new version "
                        "(default: %(default)s)")
    return parser.parse_args(argv)


def open_store(store: str):
    """A client on ``store``: a sqlite file must exist (it would otherwise be created empty); the runs a
    lost process left RUNNING on this host are marked KILLED (`tamrun.tracking.stale`)."""
    from tamrun.config.schema import TrackingConfig
    from tamrun.tracking.stale import close_stale_in_store
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    from tamrun.tracking.store.server_access import access_error
    from tamrun.tracking.store.store import check_store, open_client, sqlite_path, store_error

    db = sqlite_path(store)
    if db is not None and not db.is_file():
        raise ConfigError("--store", store, f"no MLflow store at {db}",
                          "run python -m tamrun here first, or pass --store with the store's URI")
    settings = TrackingConfig()
    try:
        check_store(store, settings.connect_timeout_s, "--store")
    except ConfigError as exc:  # a server that does not answer: named by the option that gave its URI
        if exc.field != "tracking.uri" or "does not answer" not in exc.problem:
            raise
        raise ConfigError("--store", exc.value, exc.problem,
                          "check the URI and start the server, or pass --store with a store that answers") from None
    try:
        client = open_client(store, settings.busy_timeout_s, settings.lock_timeout_s)
    except (MlflowException, SQLAlchemyError) as exc:  # a store MLflow cannot open: named, not a traceback
        reason = getattr(exc, "message", None) or str(exc).splitlines()[0]
        raise access_error(store, exc, needs="READ") or store_error(store, reason, settings.busy_timeout_s, "--store") from None
    close_stale_in_store(client, "python -m tamrun.compare")
    return client


def experiment_of(client, store: str, name: str):
    """The experiment ``name`` of the store (None when it has none); a locked server's refusal to show it
    (a user without READ on it) is a `ConfigError` naming the user (`tamrun.tracking.store.server_access`)."""
    from mlflow.exceptions import MlflowException

    from tamrun.tracking.store.server_access import access_error

    try:
        return client.get_experiment_by_name(name)
    except MlflowException as exc:
        refused = access_error(store, exc, name, needs="READ")
        if refused is None:
            raise
        raise refused from None


def check_options(args: argparse.Namespace) -> None:
    """Refuse, before the store is opened, a count outside 1 .. MLflow's most runs in one search, and a
    name or alias the registry cannot take (`tamrun.compare.register.check_names`)."""
    from mlflow.store.tracking import SEARCH_MAX_RESULTS_THRESHOLD

    from tamrun.compare.register import check_names

    if not 1 <= args.last <= SEARCH_MAX_RESULTS_THRESHOLD:
        raise ConfigError("--last", args.last, f"a count outside 1 .. {SEARCH_MAX_RESULTS_THRESHOLD} (MLflow returns "
                          f"at most {SEARCH_MAX_RESULTS_THRESHOLD} runs in one search)",
                          f"give -n a count from 1 to {SEARCH_MAX_RESULTS_THRESHOLD}, or narrow the runs with --sweep or "
                          "--filter")
    if args.refit and args.register is None:
        raise ConfigError("--refit", True, "--refit refits the best run to register it, and no --register NAME was "
                          "given", "add --register NAME, e.g. python -m tamrun.compare --sweep last --best "
                          "--register load-forecast --refit")
    if args.register is not None:
        check_names(args.register, args.alias)


def report(args: argparse.Namespace) -> str:
    """The table and the links, for the options ``args``."""
    from tamrun.compare.select import check_filter, crowned, last_runs, sweep_runs
    from tamrun.compare.table import render
    from tamrun.redact import redacted
    from tamrun.tracking.ui_view import run_url, runs_table_url

    check_options(args)
    client = open_store(args.store)
    experiment = experiment_of(client, args.store, args.experiment)
    if experiment is None:
        raise ConfigError("--experiment", args.experiment, f"the store {redacted(args.store)} has no such experiment",
                          "pass --experiment with the name tracking.experiment had (default tamrun)")
    exp_id = experiment.experiment_id
    if args.filter:
        recent = last_runs(client, exp_id, 100).runs
        check_filter(client, exp_id, args.experiment, args.filter, sorted({k for r in recent for k in r.data.metrics}))
    chosen = (sweep_runs(client, exp_id, args.sweep, args.filter) if args.sweep
              else last_runs(client, exp_id, args.last, args.filter))
    what = f"the jobs of sweep {chosen.sweep_id}" if args.sweep else f"the last {len(chosen.runs)} run(s)"
    shown = (f"{what} of experiment {args.experiment!r} in {redacted(args.store)}"
             + (f" matching {args.filter!r}" if args.filter else ""))
    if args.sort or args.best or args.register is not None:
        return ranked_report(client, args, chosen.runs, shown)
    lines = [shown + ":", "", render(chosen.runs), ""]
    where = "" if args.store.startswith("http") else f" (mlflow ui --backend-store-uri {redacted(args.store)})"
    lines.append(f"open them in the MLflow UI{where}: {redacted(runs_table_url(args.store, exp_id))}")
    if chosen.parent is not None:
        lines.append(f"the sweep's parent run (its jobs nest under it): "
                     f"{redacted(run_url(args.store, exp_id, chosen.parent.info.run_id))}")
    best = crowned(chosen)
    if best is not None:
        selection = chosen.parent.data.tags.get("sweep_selection", "the parent's choice")
        lines.append(redacted(f"the sweep's best job ({selection}): '{best.info.run_name}' (run {best.info.run_id})"))
    return "\n".join(lines)


def ranked_report(client: Any, args: argparse.Namespace, runs: List[Any], shown: str) -> str:
    """The runs ranked on ``--sort`` with the best marked and named (its model, its page); with ``--best``
    or ``--register``, the best run alone (and its registration)."""
    from tamrun.compare.best import best_run, check_sort, logged_model_uri, ranked, ranking_metric
    from tamrun.compare.table import render
    from tamrun.numbers import significant
    from tamrun.redact import redacted
    from tamrun.tracking.ui_view import run_url

    metric = ranking_metric(runs, args.sort)
    if args.sort:
        check_sort(metric, runs)
    best = best_run(runs, metric, args.descending)
    if best is None and (args.best or args.register):
        raise ConfigError("--sort", metric, f"no run among {shown} FINISHED with a finite {metric}",
                          "widen the selection (-n, --sweep, --filter) or sort on a metric the runs logged")
    model = logged_model_uri(client, best.run) if best is not None else None
    page = redacted(run_url(args.store, best.run.info.experiment_id, best.run.info.run_id)) if best else ""
    chosen = (f"best on {metric} ({'most' if args.descending else 'least'} first) of {shown}: "
              + (f"'{best.name}' {metric}={significant(best.value)}: {page}" if best else "none FINISHED with it"))
    if "test" in metric.split("_"):
        chosen += (" (a test metric: choosing on it leaks the test period into the choice; hold out a "
                   "validation period with split.validation_start)")
    if not (args.best or args.register):
        order = ranked(runs, metric, args.descending)
        return "\n".join([shown + f", ranked on {metric}:", "",
                          render(order, marked=best.run.info.run_id if best else None), "", chosen,
                          f"its model: {model or 'none logged (tracking.log_model=false)'}"])
    lines = [chosen, f"run_id: {best.run.info.run_id}", f"run_name: {best.name}",
             f"model_uri: {model or '-'}"]
    if args.register:
        lines += registration(client, args, best, model)
    return "\n".join(lines)


def registration(client: Any, args: argparse.Namespace, best: Any, model: Optional[str]) -> List[str]:
    """``--register``: the best run's model (with ``--refit``, its refit's: `tamrun.compare.refit`) registered
    as a new version of the name, the alias moved to it; the lines that say so."""
    from tamrun.compare.best import Best, logged_model_uri
    from tamrun.compare.refit import refit_run
    from tamrun.compare.register import register

    lines: List[str] = []
    if args.refit:
        refit = refit_run(client, best, args.store, args.experiment)
        model = logged_model_uri(client, refit)
        lines.append(f"refit: '{refit.info.run_name}' run_id {refit.info.run_id}, trained through "
                     f"{refit.data.params.get('refit_through', '-')}, tag refit_of={best.run.info.run_id}; "
                     f"model_uri: {model or '-'}")
        best = Best(refit, best.metric, best.value)
    if model is None:
        raise ConfigError("--register", args.register, f"the run '{best.name}' ({best.run.info.run_id}) "
                          "logged no model", "run it again with tracking.log_model=true (the default)")
    version = register(client, best, model, args.register, args.store, args.alias)
    lines.append(f"registered: {args.register} version {version.version}, alias {args.register}@{args.alias} "
                 f"(mlflow.pyfunc.load_model('models:/{args.register}@{args.alias}'))")
    return lines


def main(argv: Optional[List[str]] = None) -> None:
    """Print the report; bad input exits 2 with one line."""
    from tamrun.redact import redacted

    args = parse_args(argv)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # --refit reads the best run's config
    try:
        text = report(args)
    except TamrunError as error:
        sys.stderr.write(error.report_line())
        raise SystemExit(2) from None
    sys.stdout.write(redacted(text) + "\n")


if __name__ == "__main__":
    main()
