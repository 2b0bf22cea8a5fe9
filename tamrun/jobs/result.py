"""What a job returns to the runner (and, through it, to `python -m tamrun` and the sweepers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import pandas as pd
import torch

from tamrun.memory.oracle import Plan
from tamrun.solve.stats import FitStats


@dataclass
class RunResult:
    """What one run produced. ``coef`` is (G, D) in group order ``groups`` (adaptive: (K, G, D), one
    per refit); ``run_id`` is the MLflow run's (None without tracking)."""

    run_id: Optional[str]
    route: str
    width: int
    groups: list
    coef: torch.Tensor
    metrics: Dict[str, float]
    predictions: pd.DataFrame
    plan: Plan
    stats: FitStats
