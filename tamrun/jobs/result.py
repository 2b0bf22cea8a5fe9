"""What a job returns to the runner (and, through it, to `python -m tamrun` and the sweepers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional

import pandas as pd
import torch

from tamrun.memory.oracle import Plan
from tamrun.solve.stats import FitStats
from tamrun.tco.plan import TcoPlan


@dataclass
class RunResult:
    """What one run produced. ``coef`` is (G, D) in group order ``groups`` (adaptive: (K, G, D), one
    per refit); ``run_id`` is the MLflow run's (None without tracking); ``table`` builds the
    predictions table (a run that records none never holds one); ``tco``: the plan per machine class."""

    run_id: Optional[str]
    route: str
    width: int
    groups: list
    coef: torch.Tensor
    metrics: Dict[str, float]
    table: Callable[[], pd.DataFrame]
    plan: Plan
    stats: FitStats
    tco: Optional[TcoPlan] = None

    @property
    def predictions(self) -> pd.DataFrame:
        """The predictions table (date, group, split, actual, predicted), built on first use."""
        return self.table()
