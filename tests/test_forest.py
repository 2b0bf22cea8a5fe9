"""Forest and crossing designs against an explicitly materialised one-hot (built here, by hand),
and the solvers on them."""

from __future__ import annotations

import math

import numpy as np
import torch

from tamrun.config.effects import CrossingSpec, ForestSpec, FourierSpec
from tamrun.effects.crossing import crossing as cross_effects
from tamrun.effects.design import AdditiveDesign
from tamrun.effects.forest import ForestEffect
from tamrun.effects.fourier import FourierEffect
from tamrun.effects.linear import LinearEffect
from tamrun.config.effects import LinearSpec

TOL = 1e-12


def scaled_data(groups=3, rows=200, columns=2, seed=0):
    rng = np.random.default_rng(seed)
    return torch.as_tensor(rng.uniform(-1, 1, size=(groups, rows, columns)))


def fitted_forest(trees=7, depth=3, seed=11):
    forest = ForestEffect("forest", ForestSpec(column="a", others=["b"], n_trees=trees, max_depth=depth), seed)
    z = scaled_data()
    forest.fit(z.reshape(-1, 2).numpy(), z.reshape(-1, 2).numpy())
    return forest, z


def leaves_by_hand(forest: ForestEffect, z: torch.Tensor) -> np.ndarray:
    """(g, n, T) column indices t L + leaf, leaf = sum_l 2^l [z_{f_tl} > c_tl], with explicit loops."""
    g, n, _ = z.shape
    features, thresholds = forest.features.numpy(), forest.thresholds.numpy()
    out = np.zeros((g, n, forest.n_trees), dtype=np.int64)
    for gi in range(g):
        for row in range(n):
            for t in range(forest.n_trees):
                out[gi, row, t] = t * forest.leaves + sum(2 ** level for level in range(forest.depth)
                                                          if z[gi, row, features[t, level]] > thresholds[t, level])
    return out


def one_hot_by_hand(forest: ForestEffect, z: torch.Tensor) -> np.ndarray:
    """Phi[n, t L + leaf] = 1 / sqrt(T) at the leaves by hand."""
    columns = leaves_by_hand(forest, z)
    out = np.zeros((*columns.shape[:2], forest.width))
    np.put_along_axis(out, columns, 1.0 / math.sqrt(forest.n_trees), axis=-1)
    return out


def check_block_products(block, dense: np.ndarray, rng: np.random.Generator) -> None:
    g, n, width = dense.shape
    v, u = rng.normal(size=(g, width)), rng.normal(size=(g, n))
    np.testing.assert_allclose(block.matvec(torch.as_tensor(v)).numpy(), np.einsum("gnd,gd->gn", dense, v), atol=TOL)
    np.testing.assert_allclose(block.rmatvec(torch.as_tensor(u)).numpy(), np.einsum("gnd,gn->gd", dense, u), atol=TOL)
    np.testing.assert_allclose(block.squared_column_sums().numpy(), (dense ** 2).sum(axis=1), atol=TOL)
    other = rng.normal(size=(g, n, 4))
    np.testing.assert_allclose(block.cross_dense(torch.as_tensor(other)).numpy(),
                               np.einsum("gnd,gnk->gdk", dense, other), atol=TOL)
    np.testing.assert_allclose(block.cross_indexed(block).numpy(), np.einsum("gnd,gne->gde", dense, dense), atol=TOL)
    several = rng.normal(size=(g, n, 3))  # three products in one
    np.testing.assert_allclose(block.rmatmat(torch.as_tensor(several)).numpy(),
                               np.einsum("gnd,gnk->gkd", dense, several), atol=TOL)


def test_forest_block_equals_the_one_hot_by_hand():
    forest, z = fitted_forest()
    block = forest.indexed_block(z, z)
    dense = one_hot_by_hand(forest, z)
    assert (np.count_nonzero(dense, axis=-1) == forest.n_trees).all()  # exactly T non-zeros per row
    np.testing.assert_array_equal(block.to_dense().numpy(), dense)
    check_block_products(block, dense, np.random.default_rng(1))
    # the penalty: lambda I
    np.testing.assert_allclose(forest.penalty().numpy(), 1e-3 * np.eye(forest.width), rtol=1e-15)


def test_leaf_index_equals_the_loop_by_hand_for_one_byte_and_wider_leaves():
    """Depth 8 keeps the leaves in one byte (up to 255), depth 9 in the index's own dtype: both give
    t L + sum_l 2^l [z_{f_tl} > c_tl], checked row by row; a non-contiguous input gives the same."""
    for depth in (8, 9):
        forest, z = fitted_forest(trees=3, depth=depth)
        index = forest.leaf_index(z)
        assert index.dtype == torch.int32 and index.shape == (*z.shape[:-1], 3)
        assert forest.leaf_dtype == (torch.uint8 if depth == 8 else torch.int32)
        np.testing.assert_array_equal(index.numpy(), leaves_by_hand(forest, z))
        assert index.numpy().max() >= 2 ** (depth - 1)  # the top level's bit is reached
        strided = z.transpose(0, 1).contiguous().transpose(0, 1)  # z's values, rows and groups swapped in memory
        assert not strided.is_contiguous()
        torch.testing.assert_close(forest.leaf_index(strided), index, rtol=0, atol=0)


def test_forest_x_fourier_crossing_equals_the_row_wise_kronecker_by_hand():
    spec = CrossingSpec(left=ForestSpec(column="a", others=["b"], n_trees=5, max_depth=2, ap=0.0),
                        right=FourierSpec(column="b", m=2, s=2.0, ap=-1.0), ap=-2.0)
    fourier = FourierEffect("right", spec.right)
    forest = ForestEffect("left", spec.left, seed=3)
    crossing = cross_effects("cross", spec, fourier, forest)  # the forest is put first whatever the order
    assert crossing.left is forest and crossing.indexed
    z = scaled_data(columns=3)
    crossing.fit(z.reshape(-1, 3).numpy(), z.reshape(-1, 3).numpy())
    block = crossing.indexed_block(z, z)
    one_hot = one_hot_by_hand(forest, z[..., :2])
    phi_b = np.stack([np.cos(np.pi * z[..., 2].numpy() * k / 2) for k in (1, 2)]
                     + [np.sin(np.pi * z[..., 2].numpy() * k / 2) for k in (1, 2)], axis=-1)
    dense = (one_hot[..., :, None] * phi_b[..., None, :]).reshape(3, 200, -1)  # row-wise Kronecker
    np.testing.assert_allclose(block.to_dense().numpy(), dense, atol=TOL)
    check_block_products(block, dense, np.random.default_rng(2))
    # lambda (lambda_f P_forest (x) I + lambda_b I (x) P_fourier) = 1e-2 kron(I_R, 1 I + 0.1 diag(1 + k^4))
    w = np.array([2.0, 17.0, 2.0, 17.0])
    expected = 1e-2 * np.kron(np.eye(forest.width), np.eye(4)) + 1e-3 * np.kron(np.eye(forest.width), np.diag(w))
    np.testing.assert_allclose(crossing.penalty().numpy(), expected, rtol=1e-14)


def test_forest_is_deterministic_given_its_seed():
    a, _ = fitted_forest(seed=5)
    b, _ = fitted_forest(seed=5)
    c, _ = fitted_forest(seed=6)
    assert torch.equal(a.features, b.features) and torch.equal(a.thresholds, b.thresholds)
    assert not (torch.equal(a.features, c.features) and torch.equal(a.thresholds, c.thresholds))


def test_design_chunk_gram_and_products_with_dense_and_indexed_blocks():
    forest, z = fitted_forest(trees=4, depth=2)
    lin = LinearEffect("lin", LinearSpec(column="a", ap=-2.0))
    design = AdditiveDesign([forest, lin], ["a", "b"], intercept=True, intercept_ap=-9.0)
    design.scaler = type("Identity", (), {"apply": staticmethod(lambda x, s=slice(None): x)})()
    weight = torch.ones(z.shape[:2], dtype=z.dtype)
    weight[1, 150:] = 0.0  # padding rows
    chunk = design.chunk(z, slice(None), weight)
    dense = chunk.to_dense().numpy()
    assert dense.shape[-1] == design.width == 1 + 1 + forest.width
    assert (dense[1, 150:] == 0).all()
    np.testing.assert_allclose(chunk.gram().numpy(), np.einsum("gnd,gne->gde", dense, dense), atol=TOL)
    rng = np.random.default_rng(4)
    v, u = rng.normal(size=(3, design.width)), rng.normal(size=(3, 200))
    np.testing.assert_allclose(chunk.matvec(torch.as_tensor(v)).numpy(), np.einsum("gnd,gd->gn", dense, v), atol=TOL)
    np.testing.assert_allclose(chunk.rmatvec(torch.as_tensor(u)).numpy(), np.einsum("gnd,gn->gd", dense, u), atol=TOL)
    penalty = design.penalty_operator()
    np.testing.assert_allclose(penalty.matvec(torch.as_tensor(v)).numpy(), v @ penalty.dense().numpy(), atol=TOL)


def test_the_transposed_indicator_is_the_indicator_transposed_whichever_pieces_sort_it():
    """O' is built by sorts of whole groups, or of one group's slots a few at a time (`SORT_SLOTS`): every
    way gives O transposed, each of its rows' columns ascending (the sum order of Phi' u)."""
    for trees, groups in ((7, 3), (25, 3), (25, 1)):  # one sort; a sort per group; a group's slots in 3 sorts
        forest = ForestEffect("forest", ForestSpec(column="a", others=["b"], n_trees=trees, max_depth=3), 11)
        z = scaled_data(groups=groups)
        forest.fit(z.reshape(-1, 2).numpy(), z.reshape(-1, 2).numpy())
        block = forest.indexed_block(z, z)
        indicator, transposed = block.indicators(torch.float64)
        np.testing.assert_array_equal(transposed.to_dense().numpy(), indicator.to_dense().numpy().T)
        crow, columns = transposed.crow_indices(), transposed.col_indices()
        for row in range(crow.numel() - 1):
            assert bool((columns[crow[row]:crow[row + 1]].diff() > 0).all())
