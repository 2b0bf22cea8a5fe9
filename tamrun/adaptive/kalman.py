"""The state-space adaptation of a fitted additive model: B Kalman filters run as one batched recursion.

Per filter b (a group, or a group under one hyper-parameter choice), on a calendar of days t:

    y_{t,r} = psi_{t,r}' theta_t + eps,       eps ~ N(0, sigma^2)            (rows r = 1..R of day t)
    theta_t = theta_{t-1} + eta_t,            eta_t ~ N(0, q sigma^2 I)        (random-walk weights)

psi_{t,r} (k,) are the row's inputs (the effects' contributions to the static forecast scaled by their
training standard deviation, and 1 for the intercept; or the design row itself), theta (k,) the drifting
weights. Everything is written in units of sigma^2 (P = Cov(theta) / sigma^2): the forecasts depend on
q and the initial covariance p0 I only, not on sigma^2, which is estimated afterwards from the
standardised innovations. A day's rows are all forecast from the state after the previous day
(day-ahead: nothing of day t is used to forecast day t), then each row with ``update`` set is
assimilated in turn:

    prior     P <- P + q I                                   (once per day)
    forecast  yhat_{t,r} = psi_{t,r}' theta                  (every row of day t)
    update    f = psi' P psi + 1,  K = P psi / f,  theta <- theta + K (y - psi' theta),  P <- P - K K' f

With q = 0 the filter is recursive least squares: after the rows i, theta minimises
sum_i (y_i - psi_i' theta)^2 + (theta - theta_0)' P_0^-1 (theta - theta_0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class FilterState:
    """The weights ``theta`` (B, k) and their covariance ``cov`` (B, k, k) in units of sigma^2; ``nis``
    (B,) the sum of the standardised squared innovations e^2 / f and ``updates`` (B,) their count (the
    estimate of sigma^2 is nis / updates)."""

    theta: torch.Tensor
    cov: torch.Tensor
    nis: torch.Tensor
    updates: torch.Tensor

    @classmethod
    def initial(cls, theta: torch.Tensor, p0: torch.Tensor) -> "FilterState":
        """theta (B, k) with covariance p0 I, p0 (B,)."""
        eye = torch.eye(theta.shape[1], dtype=theta.dtype, device=theta.device)
        zeros = theta.new_zeros(theta.shape[0])
        return cls(theta.clone(), p0.reshape(-1, 1, 1) * eye, zeros, zeros.clone())

    def clone(self) -> "FilterState":
        return FilterState(self.theta.clone(), self.cov.clone(), self.nis.clone(), self.updates.clone())

    @property
    def sigma2(self) -> torch.Tensor:
        """(B,) the estimate of sigma^2: the mean standardised squared innovation."""
        return self.nis / self.updates.clamp_min(1.0)


def kalman_filter(inputs: torch.Tensor, target: torch.Tensor, update: torch.Tensor, q: torch.Tensor,
                  state: FilterState, weights: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Run C x G filters over T days in place of ``state``; returns the day-ahead forecasts (C, G, T, R).

    The G series (inputs (G, T, R, k), target (G, T, R), update (G, T, R) bool: the rows assimilated
    after their day is forecast, False on padding and on days excluded from updates) are filtered under
    each of C drift variances q (C,) (units of sigma^2 per day); filter b = c G + g of ``state`` (B = C G)
    is series g under q[c]. ``weights`` (C, G, T, k), when given, receives theta after each day.
    """
    n_series, n_days, n_rows, k = inputs.shape
    copies = q.shape[0]
    forecast = target.new_zeros((copies, n_series, n_days, n_rows))
    errors, variances = torch.zeros_like(forecast), torch.ones_like(forecast)  # e and f of every row
    theta = state.theta.view(copies, n_series, k)
    cov = state.cov.view(copies, n_series, k, k)
    drift = torch.diag_embed(q.reshape(-1, 1, 1).expand(copies, n_series, k))
    mask = update.to(theta.dtype)
    days_x, days_y, days_m = inputs.unbind(1), target.unbind(1), mask.unbind(1)  # views, one per day
    # the rows of day t any series learns from are among its first rows_learnt[t] (R is the busiest day's count)
    slots = torch.arange(1, n_rows + 1, device=update.device)
    rows_learnt = (update.any(dim=0) * slots).amax(dim=-1).tolist()
    for t in range(n_days):
        cov.add_(drift)
        day_x = days_x[t]
        predicted = torch.matmul(day_x, theta.unsqueeze(-1)).squeeze(-1)  # (C, G, R)
        forecast[:, :, t] = predicted
        for r in range(rows_learnt[t]):
            psi = day_x[:, r]
            p_psi = torch.matmul(cov, psi.unsqueeze(-1)).squeeze(-1)  # (C, G, k)
            f = (p_psi * psi).sum(-1).add_(1.0)
            fitted = predicted[..., 0] if r == 0 else (theta * psi).sum(-1)  # theta has not moved before row 0
            error = days_y[t][:, r] - fitted
            gain = p_psi * (days_m[t][:, r] / f).unsqueeze(-1)
            theta.addcmul_(gain, error.unsqueeze(-1))
            cov.addcmul_(gain.unsqueeze(-1), p_psi.unsqueeze(-2), value=-1.0)
            errors[:, :, t, r], variances[:, :, t, r] = error, f
        if weights is not None:
            weights[:, :, t] = theta
    state.nis.view(copies, n_series).add_((mask * errors.square() / variances).sum(dim=(2, 3)))
    state.updates.view(copies, n_series).add_(mask.sum(dim=(1, 2)))
    return forecast
