"""The aggregation rules (tamrun/aggregate/rules.py) against a plain float64 reference written here, on synthetic
sequences: a case with a known best expert (the weights converge to it), each rule's regret bound on the
sequence (and on random ones), and no look-ahead (changing day d's truth never changes day d's weights)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tamrun.aggregate.rules import aggregate
from tamrun.config.schema import AggregationRule

F64 = torch.float64
EWA, MLPOLY = AggregationRule.ewa, AggregationRule.mlpoly


def reference(x: np.ndarray, y: np.ndarray, rule: str, eta: float, gradient: bool, scale: float):
    """The rules written plainly, one series and one day at a time: x (B, T, R, K), y (B, T, R), every row
    observed. Returns the weights (B, T, K), the aggregate (B, T, R), the regrets r (B, T, K) and the losses
    the rule learns from, l (B, T, K)."""
    n_series, n_days, n_rows, n_experts = x.shape
    weights = np.zeros((n_series, n_days, n_experts))
    forecast = np.zeros((n_series, n_days, n_rows))
    regrets = np.zeros((n_series, n_days, n_experts))
    learnt = np.zeros((n_series, n_days, n_experts))
    for b in range(n_series):
        big_r = np.zeros(n_experts)  # R_{k,t-1}
        big_v = np.zeros(n_experts)  # V_{k,t-1}
        for t in range(n_days):
            if rule == "ewa":
                logits = eta * big_r
                p = np.exp(logits - logits.max())
                p = p / p.sum()
            else:
                positive = np.maximum(big_r, 0.0) / (1.0 + big_v)
                p = positive / positive.sum() if positive.sum() > 0 else np.full(n_experts, 1.0 / n_experts)
            yhat = x[b, t] @ p
            norm = n_rows * scale ** 2
            if gradient:
                g = 2.0 * (yhat - y[b, t]) / norm
                losses = g @ x[b, t]
                own = g @ yhat
            else:
                losses = ((x[b, t] - y[b, t][:, None]) ** 2).sum(axis=0) / norm
                own = ((yhat - y[b, t]) ** 2).sum() / norm
            r = own - losses
            weights[b, t], forecast[b, t], regrets[b, t], learnt[b, t] = p, yhat, r, losses
            big_r = big_r + r
            big_v = big_v + r ** 2
    return weights, forecast, regrets, learnt


def known_best(seed: int = 0, series: int = 2, days: int = 300, rows: int = 3):
    """Expert 0 is the truth plus a noise every expert shares; experts 1..3 add biases 0.4, 0.8, 1.5 to it:
    expert 0 is the best expert and the best convex combination. x (B, T, R, K), y (B, T, R)."""
    rng = np.random.default_rng(seed)
    y = 10.0 + rng.normal(0.0, 1.0, (series, days, rows))
    shared = rng.normal(0.0, 0.3, (series, days, rows))
    bias = np.array([0.0, 0.4, 0.8, 1.5])
    own = rng.normal(0.0, 0.01, (series, days, rows, 4))
    return (y + shared)[..., None] + bias + own, y


def run_rule(x, y, rule, eta, gradient, scale, observed=None):
    observed = torch.ones(y.shape, dtype=torch.bool) if observed is None else observed
    return aggregate(torch.as_tensor(x, dtype=F64), torch.as_tensor(y, dtype=F64), observed, rule,
                     torch.tensor([eta], dtype=F64), gradient, scale)


CASES = [(EWA, 2.0, False), (EWA, 2.0, True), (MLPOLY, 0.0, False), (MLPOLY, 0.0, True)]
IDS = ["ewa-squared", "ewa-gradient", "mlpoly-squared", "mlpoly-gradient"]


@pytest.mark.parametrize("rule, eta, gradient", CASES, ids=IDS)
def test_each_rule_equals_the_float64_reference_and_finds_the_best_expert(rule, eta, gradient):
    x, y = known_best()
    out = run_rule(x, y, rule, eta, gradient, 2.0)
    weights, forecast, _, _ = reference(x, y, rule.value, eta, gradient, 2.0)
    np.testing.assert_allclose(out.weights[0].numpy(), weights, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out.forecast[0].numpy(), forecast, rtol=1e-12, atol=1e-12)
    assert (weights[:, -1, 0] > 0.95).all(), weights[:, -1]  # converged to the best expert
    assert (weights[:, -30:, 0].mean(axis=1) > weights[:, :30, 0].mean(axis=1)).all()


def regret_bound(rule: str, eta: float, regrets: np.ndarray, learnt: np.ndarray) -> np.ndarray:
    """(B,) each series' bound on max_k R_{k,T}: ln K / eta + eta / 8 sum_t w_t^2 (EWA),
    sqrt((1 + V_k) sum_j log2(1 + V_j)) (ML-Poly, the largest over k)."""
    n_experts = regrets.shape[-1]
    if rule == "ewa":
        widths = learnt.max(axis=-1) - learnt.min(axis=-1)
        return math.log(n_experts) / eta + eta / 8.0 * (widths ** 2).sum(axis=1)
    squares = (regrets ** 2).sum(axis=1)
    return np.sqrt((1.0 + squares.max(axis=1)) * np.log2(1.0 + squares).sum(axis=1))


def true_regret(x: np.ndarray, y: np.ndarray, forecast: np.ndarray, scale: float) -> np.ndarray:
    """(B, K) sum_t ell_t(yhat_t) - ell_t(x_{k,t}): the aggregate's squared-error excess over each expert."""
    norm = x.shape[2] * scale ** 2
    own = ((forecast - y) ** 2).sum(axis=2) / norm
    experts = ((x - y[..., None]) ** 2).sum(axis=2) / norm
    return (own[..., None] - experts).sum(axis=1)


def random_sequence(seed: int):
    """Experts that take turns being best: a sequence no expert dominates."""
    rng = np.random.default_rng(seed)
    y = rng.normal(0.0, 1.0, (3, 200, 2))
    drift = np.cumsum(rng.normal(0.0, 0.2, (3, 200, 1, 5)), axis=1)
    return y[..., None] + np.clip(drift + rng.normal(0.0, 0.5, (3, 200, 2, 5)), -1.5, 1.5), y


@pytest.mark.parametrize("rule, eta, gradient", CASES, ids=IDS)
@pytest.mark.parametrize("sequence", ["known best", "random 0", "random 1"])
def test_the_regret_bound_of_each_rule_holds_on_the_sequence(rule, eta, gradient, sequence):
    """R_{k,T} (linearised when gradient=true) and the true squared-error regret against each expert k stay
    below the rule's bound; ML-Poly's needs |r_{k,t}| <= 1, which the scale 4 gives here."""
    x, y = known_best() if sequence == "known best" else random_sequence(int(sequence[-1]))
    scale = 4.0
    weights, forecast, regrets, learnt = reference(x, y, rule.value, eta, gradient, scale)
    out = run_rule(x, y, rule, eta, gradient, scale)
    np.testing.assert_allclose(out.regret[0].numpy(), regrets.sum(axis=1), rtol=1e-10, atol=1e-12)
    if rule == MLPOLY:
        assert np.abs(regrets).max() <= 1.0
    bound = regret_bound(rule.value, eta, regrets, learnt)
    assert (regrets.sum(axis=1).max(axis=1) <= bound).all(), (regrets.sum(axis=1).max(axis=1), bound)
    assert (true_regret(x, y, forecast, scale).max(axis=1) <= bound + 1e-12).all()
    if not gradient:  # the regret the rule learns from is the true one
        np.testing.assert_allclose(true_regret(x, y, forecast, scale), regrets.sum(axis=1), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("rule, eta, gradient", CASES, ids=IDS)
def test_changing_day_ds_truth_never_changes_day_ds_weights(rule, eta, gradient):
    """Day d's weights and aggregate are bitwise those of a sequence whose truth differs from day d on;
    the days after d do change."""
    x, y = random_sequence(2)
    observed = torch.ones(y.shape, dtype=torch.bool)
    observed[1, 50:60] = False  # days a series has no row: weights carried over, nothing learnt
    base = run_rule(x, y, rule, eta, gradient, 4.0, observed)
    for day in (0, 37, 120, 199):
        changed = y.copy()
        changed[:, day] += 3.0
        other = run_rule(x, changed, rule, eta, gradient, 4.0, observed)
        assert torch.equal(other.weights[:, :, :day + 1], base.weights[:, :, :day + 1])
        assert torch.equal(other.forecast[:, :, :day + 1], base.forecast[:, :, :day + 1])
        if day < 199:
            assert not torch.equal(other.weights[:, :, day + 1:], base.weights[:, :, day + 1:])


def test_candidates_batched_equal_each_alone():
    """EWA's etas as one batch of candidates equal each eta run alone (bitwise)."""
    x, y = random_sequence(3)
    etas = [0.1, 1.0, 30.0]
    batched = aggregate(torch.as_tensor(x), torch.as_tensor(y), torch.ones(y.shape, dtype=torch.bool), EWA,
                        torch.tensor(etas, dtype=F64), True, 4.0)
    for c, eta in enumerate(etas):
        alone = run_rule(x, y, EWA, eta, True, 4.0)
        assert torch.equal(batched.weights[c], alone.weights[0])
        assert torch.equal(batched.forecast[c], alone.forecast[0])
