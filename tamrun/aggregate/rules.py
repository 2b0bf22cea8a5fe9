"""Online aggregation of K experts (prediction with expert advice): each day's weights come from the losses
of the days before it only.

Per series b (one group, or every group together) and day t = 1..T, with the experts' forecasts
x_{k,t,r} of the day's n_t observed rows r, the truth y_{t,r} and a scale s (losses in units of s^2):

    aggregate     yhat_{t,r} = sum_k p_{k,t} x_{k,t,r}                 p_t on the simplex, a function of
                                                                        R_{., t-1} and V_{., t-1} only
    day's loss    ell_t(f) = sum_r (f_r - y_{t,r})^2 / (n_t s^2)
    regrets       r_{k,t} = ell_t(yhat_t) - ell_t(x_{k,t})                                 (gradient=false)
                  r_{k,t} = sum_r g_{t,r} (yhat_{t,r} - x_{k,t,r}),
                            g_{t,r} = 2 (yhat_{t,r} - y_{t,r}) / (n_t s^2)                 (gradient=true: the
                                                        loss linearised at yhat_t; the reference becomes the
                                                        best convex combination of the experts)
                  R_{k,t} = sum_{u <= t} r_{k,u},   V_{k,t} = sum_{u <= t} r_{k,u}^2

By convexity sum_t ell_t(yhat_t) - ell_t(x_{k,t}) <= R_{k,T} (equality when gradient=false), so each rule's
bound on R_{k,T} bounds the regret against every expert k. The rules (``RULES``):

- ``ewa``, exponentially weighted averages (Vovk; Littlestone & Warmuth), learning rate eta:
      p_{k,t} = exp(eta R_{k,t-1}) / sum_j exp(eta R_{j,t-1})          (= exp(-eta L_{k,t-1}) normalised)
      R_{k,T} <= ln K / eta + eta / 8 sum_t w_t^2,   w_t = max_j l_{j,t} - min_j l_{j,t}
  (Hoeffding's lemma each day; l_{k,t} = ell_t(x_{k,t}), or g_t . x_{k,t} with gradient=true).
- ``mlpoly``, polynomially weighted averages with one adaptive learning rate per expert (ML-Poly;
  Gaillard, Stoltz & van Erven 2014), no parameter:
      p_{k,t} = eta_{k,t-1} (R_{k,t-1})_+ / sum_j eta_{j,t-1} (R_{j,t-1})_+   (uniform while no R_{j,t-1} > 0)
      eta_{k,t} = 1 / (1 + V_{k,t})
      R_{k,T} <= sqrt((1 + V_{k,T}) sum_j log2(1 + V_{j,T}))           when every |r_{j,t}| <= 1
  (sum_k p_{k,t} r_{k,t} <= 0 and (a + b)_+^2 <= a_+^2 + 2 a_+ b + b^2 give
  sum_j eta_{j,T} (R_{j,T})_+^2 <= sum_j sum_t r_{j,t}^2 / (1 + V_{j,t-1}) <= sum_j log2(1 + V_{j,T})).

Everything is batched: C parameter candidates (EWA's eta) x B series, one recursion over the days.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict

import torch

from tamrun.config.schema import AggregationRule

# weights(R (C, B, K), V (C, B, K), parameter (C,)) -> p (C, B, K)
WeightRule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def ewa_weights(regret: torch.Tensor, squares: torch.Tensor, eta: torch.Tensor) -> torch.Tensor:
    """p_k = softmax_k(eta R_k): exponentially weighted averages."""
    return torch.softmax(eta.reshape(-1, 1, 1) * regret, dim=-1)


def mlpoly_weights(regret: torch.Tensor, squares: torch.Tensor, parameter: torch.Tensor) -> torch.Tensor:
    """p_k proportional to (R_k)_+ / (1 + V_k); uniform while every R_k <= 0 (ML-Poly, no parameter)."""
    score = regret.clamp_min(0.0) / (1.0 + squares)
    total = score.sum(dim=-1, keepdim=True)
    uniform = torch.full_like(score, 1.0 / score.shape[-1])
    return torch.where(total > 0, score / torch.where(total > 0, total, 1.0), uniform)


RULES: Dict[AggregationRule, WeightRule] = {AggregationRule.ewa: ewa_weights, AggregationRule.mlpoly: mlpoly_weights}


@dataclass
class Aggregation:
    """``weights`` (C, B, T, K) each day's p_t; ``forecast`` (C, B, T, R) the aggregate; ``regret`` and
    ``squares`` (C, B, K) R_{k,T} and V_{k,T} after the last day."""

    weights: torch.Tensor
    forecast: torch.Tensor
    regret: torch.Tensor
    squares: torch.Tensor


def day_regrets(x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, forecast: torch.Tensor, norm: torch.Tensor,
                gradient: bool) -> torch.Tensor:
    """(C, B, K) r_{k,t} of one day: x (B, R, K), y and mask (B, R), forecast (C, B, R), norm (B,) = n_t s^2."""
    error = (forecast - y) * mask
    if gradient:
        slope = 2.0 * error / norm.unsqueeze(-1)
        return torch.einsum("cbr,cbrk->cbk", slope, forecast.unsqueeze(-1) - x)
    own = error.square().sum(dim=-1) / norm
    experts = ((x - y.unsqueeze(-1)) * mask.unsqueeze(-1)).square().sum(dim=1) / norm.unsqueeze(-1)
    return own.unsqueeze(-1) - experts


def aggregate(forecasts: torch.Tensor, target: torch.Tensor, observed: torch.Tensor, rule: AggregationRule,
              parameters: torch.Tensor, gradient: bool, scale: float) -> Aggregation:
    """Run ``rule`` over the days: forecasts (B, T, R, K) of K experts, target and observed (B, T, R) (False:
    no row), one candidate per entry of ``parameters`` (C,) (EWA's eta; ignored by ML-Poly); losses in
    units of ``scale``^2. Every tensor on one device; day t's weights are set before its truth is read."""
    n_series, n_days, n_rows, n_experts = forecasts.shape
    weigh, count = RULES[rule], parameters.shape[0]
    mask = observed.to(forecasts.dtype)
    norm = mask.sum(dim=-1).clamp_min(1.0) * scale ** 2  # (B, T)
    regret = forecasts.new_zeros((count, n_series, n_experts))
    squares = torch.zeros_like(regret)
    weights = forecasts.new_zeros((count, n_series, n_days, n_experts))
    combined = forecasts.new_zeros((count, n_series, n_days, n_rows))
    for t in range(n_days):
        p = weigh(regret, squares, parameters)
        x = forecasts[:, t]
        forecast = torch.einsum("brk,cbk->cbr", x, p)
        weights[:, :, t], combined[:, :, t] = p, forecast
        r = day_regrets(x, target[:, t], mask[:, t], forecast, norm[:, t], gradient)
        regret.add_(r)
        squares.add_(r.square())
    return Aggregation(weights, combined, regret, squares)
