"""Summaries, ratios and the markdown table of a benchmark's records (pure functions: no peer, no GPU).

A record is one run: {model, side, repeat, status: ok|error|timeout, fit_seconds, predict_seconds,
peak_bytes, rmse, mape, route, cg_iterations?, cg_residual?, bare_fit_seconds? (tamrun: the fit timed
directly, the second column), error_kind?, error?, timeout_s?}. tamrun's fit_seconds is the fit
``python -m tamrun`` reports (its phases and the memory meter, the default settings).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence

from tamrun.bench.machine import header_lines

SIDES = ("tamrun", "baseline", "peer")  # baseline: tamrun from another checkout (--baseline)
MIB = 2**20


@dataclass
class Spread:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Optional["Spread"]:
        values = [float(v) for v in values if v is not None]
        return cls(statistics.median(values), min(values), max(values)) if values else None


@dataclass
class SideSummary:
    model: str
    side: str
    runs: int
    ok: int
    outcome: str  # "3/3 ok", "timeout after 600 s", "error: TypeError (...)"
    route: Optional[str]
    fit: Optional[Spread]
    predict: Optional[Spread]
    peak: Optional[Spread]
    rmse: Optional[float]
    mape: Optional[float]
    cg_iterations: Optional[float]
    cg_residual: Optional[float]
    cg_max_iter: Optional[int]
    setup: Optional[float] = None  # tamrun: median seconds building the system (Gram, kernel, CG operator)
    solve: Optional[float] = None  # tamrun: median seconds solving it (factorisations, CG iterations)
    bare: Optional[float] = None  # tamrun: median bare fit (fit_model timed directly, without the run's phases)


def _outcome(records: List[dict]) -> str:
    ok = sum(r["status"] == "ok" for r in records)
    parts = [f"{ok}/{len(records)} ok"]
    for r in records:
        if r["status"] == "timeout":
            parts.append(f"timeout after {r['timeout_s']:g} s")
        elif r["status"] == "error":
            parts.append(f"error: {r.get('error_kind', '?')} ({r.get('error', '')[:80]})")
    return "; ".join(dict.fromkeys(parts))


def summarise(records: Iterable[dict]) -> List[SideSummary]:
    """One summary per (model, side), models in first-seen order, sides in the order of `SIDES`."""
    records = list(records)
    models = list(dict.fromkeys(r["model"] for r in records))
    out = []
    for model in models:
        for side in SIDES:
            runs = [r for r in records if r["model"] == model and r["side"] == side]
            if not runs:
                continue
            ok = [r for r in runs if r["status"] == "ok"]
            median = (lambda key: statistics.median([r[key] for r in ok if r.get(key) is not None])
                      if any(r.get(key) is not None for r in ok) else None)
            out.append(SideSummary(
                model=model, side=side, runs=len(runs), ok=len(ok), outcome=_outcome(runs),
                route=ok[0].get("route") if ok else None,
                fit=Spread.of([r["fit_seconds"] for r in ok]), predict=Spread.of([r["predict_seconds"] for r in ok]),
                peak=Spread.of([r["peak_bytes"] for r in ok]), rmse=median("rmse"), mape=median("mape"),
                cg_iterations=median("cg_iterations"), cg_residual=median("cg_residual"),
                cg_max_iter=next((r["cg_max_iter"] for r in ok if r.get("cg_max_iter")), None),
                setup=median("setup_seconds"), solve=median("solve_seconds"), bare=median("bare_fit_seconds")))
    return out


@dataclass
class Ratio:
    model: str
    speedup: Optional[float]  # other fit median / tamrun fit median
    memory: Optional[float]  # other peak median / tamrun peak median
    rmse_difference: Optional[float]  # tamrun RMSE - other RMSE (MW)


def ratios(summaries: Sequence[SideSummary], other: str = "peer") -> List[Ratio]:
    """``other`` (the peer, or the baseline checkout) over tamrun, per model, from the medians of the
    same invocation."""
    by_key: Dict[tuple, SideSummary] = {(s.model, s.side): s for s in summaries}
    out = []
    for model in dict.fromkeys(s.model for s in summaries):
        ours, peer = by_key.get((model, "tamrun")), by_key.get((model, other))

        def ratio(attr: str) -> Optional[float]:
            a = getattr(peer, attr, None) if peer else None
            b = getattr(ours, attr, None) if ours else None
            return a.median / b.median if a and b and b.median > 0 else None

        rmse_diff = ours.rmse - peer.rmse if ours and peer and ours.rmse is not None and peer.rmse is not None else None
        out.append(Ratio(model, ratio("fit"), ratio("peak"), rmse_diff))
    return out


def _spread(value: Optional[Spread], scale: float = 1.0, digits: int = 2) -> str:
    if value is None:
        return "–"
    return f"{value.median / scale:.{digits}f} ({value.low / scale:.{digits}f}–{value.high / scale:.{digits}f})"


def cell(value: Optional[float], fmt: str) -> str:
    """A table cell: ``value`` in ``fmt``, ``–`` when there is none."""
    return "–" if value is None else format(value, fmt)


def markdown(records: Sequence[dict], header: Dict[str, str]) -> str:
    """The report: machine header, the per-side table, the ratio table."""
    summaries = summarise(records)
    lines = [f"### {header.get('title', 'tamrun vs peer')}", ""]
    lines += header_lines({key: value for key, value in header.items() if key != "title"})
    lines += ["", "| model | side | route | fit s median (min–max) | bare fit s | fit: setup + solve s | predict s | "
              "peak MiB above baseline | test RMSE MW | MAPE % | CG iters / final rel. residual | runs |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        cg = "–"
        if s.cg_iterations is not None:
            cap = f" (max_iter capped at {s.cg_max_iter})" if s.side == "peer" and s.cg_max_iter else ""
            cg = f"{s.cg_iterations:.0f} / {cell(s.cg_residual, '.1e')}{cap}"
        parts = "–" if s.setup is None else f"{s.setup:.2f} + {s.solve:.2f}"
        lines.append(f"| {s.model} | {s.side} | {s.route or '–'} | {_spread(s.fit)} | {cell(s.bare, '.2f')} | {parts} | "
                     f"{_spread(s.predict)} | {_spread(s.peak, MIB, 0)} | {cell(s.rmse, '.1f')} | {cell(s.mape, '.3f')} | "
                     f"{cg} | {s.outcome} |")
    for other in [side for side in SIDES[1:] if any(s.side == side for s in summaries)]:
        lines += ["", f"| model | fit speed-up ({other} / tamrun) | peak memory ratio ({other} / tamrun) | "
                  f"RMSE tamrun − {other} (MW) |", "|---|---|---|---|"]
        for r in ratios(summaries, other):
            lines.append(f"| {r.model} | {cell(r.speedup, '.2f')}× | {cell(r.memory, '.2f')}× | "
                         f"{cell(r.rmse_difference, '+.1f')} |")
    return "\n".join(lines) + "\n"
