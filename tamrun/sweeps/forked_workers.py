"""Workers of a parallel sweep forked from the process that launches it, with the job's libraries loaded.

Under ``hydra/launcher=parallel`` (joblib's loky backend) each worker is a fresh interpreter that imports
torch, pandas, MLflow and tamrun before its first job: about 5 s of a 4-job sweep on 2 cores, paid by
every worker at once. Forked workers inherit those modules from the launching process, which imports them
once (`prepare_forked_workers`). What a fork must not share is released first: the SQLAlchemy engines
MLflow caches per store URI hold pooled sqlite connections, which are closed in the launching process
before the workers start (`release_store_connections`), so that each worker opens its own. No torch
operation has run in the launching process at that point (a forked OpenMP pool would not survive), and
no CUDA context exists there. Linux only (macOS frameworks are not fork-safe); ``hw.fork_workers=false``
keeps loky's fresh interpreters.
"""

from __future__ import annotations

import importlib
import logging
import sys
import warnings

from tamrun.process.collector import freeze_loaded_objects

log = logging.getLogger(__name__)

# The modules a job imports (tamrun.runner: torch, pandas, MLflow's client), loaded before the fork.
JOB_MODULES = ("tamrun.runner", "tamrun.tracking.pyfunc_model", "matplotlib.backends.backend_agg", "matplotlib.figure",
               "pyarrow.parquet")


def release_store_connections() -> int:
    """Close the pooled connections of the SQLAlchemy engines MLflow has cached in this process (they
    reconnect on their next use); returns how many engines were disposed."""
    try:
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    except ImportError:  # no sqlite store was opened
        return 0
    engines = list(getattr(SqlAlchemyStore, "_engine_map", {}).values())
    for engine in engines:
        engine.dispose()
    return len(engines)


def prepare_forked_workers() -> bool:
    """Load the job's modules and have loky fork its workers; False (loky's own start method kept) off
    Linux."""
    if not sys.platform.startswith("linux"):
        return False
    from joblib.externals.loky.backend.context import set_start_method

    for name in JOB_MODULES:
        importlib.import_module(name)
    set_start_method("fork", force=True)
    # loky warns that a forked worker does not re-execute the parent's imports: that is the point here,
    # and what must not be shared (store connections, a thread pool) is released or not started.
    warnings.filterwarnings("ignore", message="`fork` start method should not be used", category=UserWarning)
    released = release_store_connections()
    # The modules' objects live as long as the workers: frozen, a worker's collections (loky runs one after
    # each job to check for leaks, 0.4 s over this heap) skip them and their pages stay shared.
    freeze_loaded_objects()
    log.info("parallel sweep: workers forked from this process (job modules loaded, %d store engine(s) released)",
             released)
    return True
