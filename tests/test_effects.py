"""Each effect's design block and penalty against a hand computation (float64)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.interpolate import BSpline

from tamrun.config.effects import CategoricalSpec, FourierSpec, LinearSpec, SplineSpec
from tamrun.effects.categorical import CategoricalEffect
from tamrun.effects.fourier import FourierEffect
from tamrun.effects.linear import LinearEffect
from tamrun.effects.spline import SplineEffect, clamped_knots

TOL = 1e-12


def test_linear_design_and_penalty():
    effect = LinearEffect("l", LinearSpec(column="x", ap=-2.0))
    z = torch.tensor([[-1.0, 0.25, 1.0]], dtype=torch.float64)
    assert torch.allclose(effect.design(z), (math.pi * z).unsqueeze(-1), atol=0, rtol=0)
    assert effect.penalty().tolist() == [[pytest.approx(1e-2, rel=1e-15)]]


@pytest.mark.parametrize("cyclic", [False, True])
def test_fourier_design_and_sobolev_penalty(cyclic):
    effect = FourierEffect("f", FourierSpec(column="x", m=3, s=2.0, cyclic=cyclic, ap=-3.0))
    z = np.array([-1.0, -0.3, 0.0, 0.7, 1.0])
    c = 1.0 if cyclic else 2.0
    expected = np.column_stack([np.cos(k * np.pi * z / c) for k in (1, 2, 3)]
                               + [np.sin(k * np.pi * z / c) for k in (1, 2, 3)])
    got = effect.design(torch.tensor(z)).numpy()
    assert got.shape == (5, 6)
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOL)
    # lambda (1 + k^4) for k = 1, 2, 3, on the cosine and the sine
    weights = 1e-3 * np.array([2.0, 17.0, 82.0])
    np.testing.assert_allclose(effect.penalty().numpy(), np.diag(np.concatenate([weights, weights])), rtol=1e-15)


def test_fourier_with_a_period_reads_the_raw_value_whatever_the_training_range():
    """period P: cos, sin of 2 pi k x / P on the raw x (a day of year keeps its yearly cycle from half a year)."""
    effect = FourierEffect("f", FourierSpec(column="doy", m=2, period=365.25))
    x = np.array([[1.0], [91.0], [182.0], [366.0]])
    scaled = torch.full((4, 1), 0.5, dtype=torch.float64)  # what a training range would make of x: ignored
    expected = np.column_stack([np.cos(2 * np.pi * k * x[:, 0] / 365.25) for k in (1, 2)]
                               + [np.sin(2 * np.pi * k * x[:, 0] / 365.25) for k in (1, 2)])
    got = effect.block(torch.tensor(x), scaled).numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOL)


def test_categorical_nominal_one_hot_and_identity_penalty():
    effect = CategoricalEffect("c", CategoricalSpec(column="d", topo="nominal", ap=-1.0))
    effect.fit(np.array([[3.0], [1.0], [2.0], [1.0]]), None)
    x = torch.tensor([1.0, 3.0, 2.0, 7.0], dtype=torch.float64)  # 7 was never seen: zero row
    expected = np.array([[1, 0, 0], [0, 0, 1], [0, 1, 0], [0, 0, 0]], dtype=float)
    np.testing.assert_array_equal(effect.design(x).numpy(), expected)
    np.testing.assert_allclose(effect.penalty().numpy(), 0.1 * np.eye(3), rtol=1e-15)
    assert effect.unseen_levels(np.array([1.0, 7.0])) == [7.0]


def test_categorical_difference_and_cyclic_penalties():
    diff = CategoricalEffect("c", CategoricalSpec(column="d", topo="difference", ap=0.0))
    cyc = CategoricalEffect("c", CategoricalSpec(column="d", topo="cyclic", ap=0.0))
    for effect in (diff, cyc):
        effect.fit(np.arange(4.0)[:, None], None)
    # sum_i (b_{i+1} - b_i)^2 (+ (b_0 - b_3)^2 for the cyclic one)
    path = np.array([[1, -1, 0, 0], [-1, 2, -1, 0], [0, -1, 2, -1], [0, 0, -1, 1]], dtype=float)
    ring = np.array([[2, -1, 0, -1], [-1, 2, -1, 0], [0, -1, 2, -1], [-1, 0, -1, 2]], dtype=float)
    np.testing.assert_allclose(diff.penalty().numpy(), path, atol=TOL)
    np.testing.assert_allclose(cyc.penalty().numpy(), ring, atol=TOL)


def test_categorical_fourier_topology_by_hand():
    effect = CategoricalEffect("c", CategoricalSpec(column="d", topo="fourier", ap=-3.0))
    effect.fit(np.arange(7.0)[:, None], None)  # 7 levels -> m = 4, z_i = (i - 3) / 3
    levels = np.arange(7.0)
    z = (levels - 3.0) / 3.0
    expected = np.column_stack([np.cos(k * np.pi * z / 2) for k in range(1, 5)]
                               + [np.sin(k * np.pi * z / 2) for k in range(1, 5)])
    np.testing.assert_allclose(effect.design(torch.tensor(levels)).numpy(), expected, atol=TOL)
    # s = 0 (the default): lambda (1 + 1) on every column
    np.testing.assert_allclose(effect.penalty().numpy(), 2e-3 * np.eye(8), rtol=1e-15)


@pytest.mark.parametrize("k,deg", [(20, 3), (5, 2), (3, 1), (1, 3)])
def test_spline_basis_matches_scipy_inside(k, deg):
    effect = SplineEffect("s", SplineSpec(column="x", k=k, deg=deg, p=min(2, k + deg - 1), ap=0.0))
    z = np.linspace(-1.0, 1.0, 201)
    reference = BSpline.design_matrix(z, clamped_knots(k, deg).numpy(), deg).toarray()
    got = effect.design(torch.tensor(z)).numpy()
    assert got.shape == (201, k + deg)
    np.testing.assert_allclose(got, reference, rtol=0, atol=TOL)


def test_spline_continues_along_the_tangent_outside():
    effect = SplineEffect("s", SplineSpec(column="x", k=6, deg=3, p=2, ap=0.0))
    knots = clamped_knots(6, 3).numpy()
    z = np.array([-1.4, -1.01, 1.02, 1.3])
    edge = np.clip(z, -1.0, 1.0)
    expected = np.zeros((4, 9))
    for j in range(9):
        coef = np.zeros(9)
        coef[j] = 1.0
        spline = BSpline(knots, coef, 3)
        # right edge: the derivative from the left (the basis is only defined up to 1)
        slope = spline.derivative()(np.where(edge > 0, np.nextafter(edge, -2), edge))
        expected[:, j] = spline(edge) + slope * (z - edge)
    np.testing.assert_allclose(effect.design(torch.tensor(z)).numpy(), expected, atol=1e-10)


def test_spline_difference_penalty_by_hand():
    effect = SplineEffect("s", SplineSpec(column="x", k=2, deg=2, p=2, ap=-1.0))  # width 4
    d2 = np.array([[1.0, -2.0, 1.0, 0.0], [0.0, 1.0, -2.0, 1.0]])
    np.testing.assert_allclose(effect.penalty().numpy(), 0.1 * d2.T @ d2, rtol=1e-15, atol=TOL)
