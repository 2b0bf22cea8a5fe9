"""Which experts to aggregate, chosen on the validation period (``aggregate.select_experts=true``).

Backward elimination: from every expert, drop at each step the one whose removal lowers the aggregate's
validation RMSE the most (each subset's rule chosen again, `tamrun.aggregate.selection.select`), while it
lowers it and at least two experts are left. Only the validation days are read: the test period reaches
no choice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, List

from tamrun.aggregate.selection import Selection

log = logging.getLogger(__name__)


@dataclass
class Pruning:
    """The experts kept, their selection, and each step's subset and validation RMSE."""

    kept: List[str]
    selection: Selection
    steps: List[Dict[str, object]] = field(default_factory=list)


def prune(experts: List[str], select: Callable[[List[str]], Selection]) -> Pruning:
    """Backward elimination of ``experts``; ``select(subset)`` chooses the rule of a subset on the validation days."""
    kept, current = list(experts), select(list(experts))
    steps: List[Dict[str, object]] = [{"experts": list(kept), "dropped": None, "rmse_validation": current.score}]
    while len(kept) > 2:
        trials = {name: select([e for e in kept if e != name]) for name in kept}
        dropped = min(trials, key=lambda name: trials[name].score)
        if trials[dropped].score >= current.score:
            break
        kept.remove(dropped)
        current = trials[dropped]
        steps.append({"experts": list(kept), "dropped": dropped, "rmse_validation": current.score})
        log.info("aggregate: without %s, validation RMSE %.5g (%s)", dropped, current.score, ", ".join(kept))
    return Pruning(kept, current, steps)
