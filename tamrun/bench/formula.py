"""Translate a tamrun model (parsed effect specs) into the peer's formula string, so that both sides of
the benchmark fit exactly the same model."""

from __future__ import annotations

from typing import Any, Dict

from tamrun.config.effects import CategoricalSpec, CrossingSpec, ForestSpec, FourierSpec, LinearSpec, SplineSpec


def _num(value: float) -> str:
    return f"{value:g}"


def peer_term(spec: Any) -> str:
    """One effect as the peer writes it: l(), f(), c() or s()."""
    if isinstance(spec, LinearSpec):
        return f"l({spec.column}, ap={_num(spec.ap)})"
    if isinstance(spec, FourierSpec):
        cyclic = ", cyclic=True" if spec.cyclic else ""
        return f"f({spec.column}, m={spec.m}, s={_num(spec.s)}{cyclic}, ap={_num(spec.ap)})"
    if isinstance(spec, CategoricalSpec):
        return f"c({spec.column}, topo='{spec.topo}', ap={_num(spec.ap)})"
    if isinstance(spec, SplineSpec):
        return f"s({spec.column}, k={spec.k}, deg={spec.deg}, p={spec.p}, ap={_num(spec.ap)})"
    if isinstance(spec, ForestSpec):
        if len(spec.others) > 1:
            raise ValueError("the benchmark writes forests with at most one 'others' column for the peer")
        others = f", others={spec.others[0]}" if spec.others else ""
        return f"t({spec.column}, n_trees={spec.n_trees}, max_depth={spec.max_depth}{others}, ap={_num(spec.ap)})"
    if isinstance(spec, CrossingSpec):
        return f"te({peer_term(spec.left)}, {peer_term(spec.right)}, ap={_num(spec.ap)})"
    raise ValueError(f"the peer has no equivalent of a {type(spec).__name__}")


def peer_formula(target: str, specs: Dict[str, Any]) -> str:
    """``target ~ term + term + ...`` in the effects' order."""
    return f"{target} ~ " + " + ".join(peer_term(spec) for spec in specs.values())
