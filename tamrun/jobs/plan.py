"""``mode=plan``: the memory oracle's plan for the data and model, without fitting and without an
MLflow run (`python -m tamrun mode=plan` prints `Plan.describe`)."""

from __future__ import annotations

import logging

import pandas as pd
import torch

from tamrun.jobs.prepare import Prepared
from tamrun.jobs.result import RunResult
from tamrun.solve.stats import FitStats
from tamrun.tco.run import plan_only

log = logging.getLogger(__name__)


def plan_job(prepared: Prepared) -> RunResult:
    """The plan as a result: no coefficients, the predicted peak and the smallest limit as metrics, the plan
    per machine class (`tamrun.tco.run.plan_only`)."""
    plan, features = prepared.plan, prepared.features
    log.info("mode=plan: nothing fitted")
    return RunResult(run_id=None, route=plan.route, width=features.design.width, groups=features.train.groups,
                     coef=torch.empty(0), metrics={"predicted_peak_bytes": plan.predicted_peak,
                                                   "minimal_limit_bytes": plan.minimal_limit},
                     table=pd.DataFrame, plan=plan,
                     stats=FitStats(route=plan.route, group_chunk=plan.fit.groups, row_chunk=plan.fit.rows),
                     tco=plan_only(prepared.config, prepared.classes, prepared.measured_on))
