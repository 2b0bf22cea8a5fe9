"""A derived column's expression (``data.derived.<name>.expr``): data, never code.

An expression is arithmetic and comparisons on columns and literals, nothing else:

- literals: numbers (taken as float64, so ``10 ** 10 ** 10`` is ``inf``, not a day of work), ``True`` /
  ``False`` and strings (to compare a text column with);
- column names (a name that is not a column of the data is a `DataError` naming it);
- ``+ - * / // % **``, unary ``- +`` and ``~`` (not), comparisons ``== != < <= > >=`` (chained as in
  Python), ``& |`` and ``and or not`` (elementwise, on truth values; ``&`` and ``|`` bind as in Python,
  tighter than comparisons: ``(a > 1) & (b < 2)``), parentheses.

`parse_expression` checks the whole syntax tree against this allow-list before anything is evaluated:
an attribute (``x.__class__``), a call, a subscript, ``@`` (a pandas local), a lambda, a comprehension or
any other construct is a `ConfigError` naming it. `evaluate` then computes the column by walking the
tree with pandas' operators on the data's columns: nothing is handed to ``eval``, pandas' or Python's.
"""

from __future__ import annotations

import ast
import operator
from typing import Any, Callable, Dict, Set, Type

import numpy as np
import pandas as pd

from tamrun.errors import ConfigError, DataError

LONGEST_EXPRESSION = 1000  # characters
DEEPEST_EXPRESSION = 100  # nested operations (the evaluation walks the tree recursively)
_FIX = "write arithmetic and comparisons on columns and numbers, e.g. '(temp_f - 32) / 1.8' or 'dow >= 5'"

_BINARY: Dict[Type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
    ast.BitAnd: operator.and_, ast.BitOr: operator.or_,
}
_UNARY: Dict[Type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.inv, ast.Not: operator.not_,
}
_COMPARE: Dict[Type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
}
_BOOLEAN: Dict[Type[ast.boolop], Callable[[Any, Any], Any]] = {ast.And: operator.and_, ast.Or: operator.or_}
# Nodes that only carry the allowed ones (the operators themselves are checked through the tables above).
_STRUCTURE = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.Name, ast.Constant, ast.Load)
_OPERATORS = (*_BINARY, *_UNARY, *_COMPARE, *_BOOLEAN)


def construct(node: ast.AST, text: str) -> str:
    """How a refused node reads to the user: its kind and its source (``attribute access 'x.__class__'``)."""
    names = {ast.Attribute: "attribute access", ast.Call: "function call", ast.Subscript: "subscript",
             ast.Lambda: "lambda", ast.MatMult: "the operator @", ast.Starred: "unpacking",
             ast.NamedExpr: "assignment", ast.IfExp: "conditional expression"}
    kind = next((label for cls, label in names.items() if isinstance(node, cls)), type(node).__name__)
    source = ast.get_source_segment(text, node) if hasattr(node, "col_offset") else None
    return f"{kind} {source!r}" if source else kind


def parse_expression(field: str, text: str) -> ast.Expression:
    """The syntax tree of ``text``, every node of it allowed (module doc); else a `ConfigError` on
    ``field`` naming the first construct that is not."""
    if len(text) > LONGEST_EXPRESSION:
        raise ConfigError(field, text, f"an expression of {len(text)} characters (at most {LONGEST_EXPRESSION})",
                          _FIX)
    if "@" in text:  # pandas' local variables (@name) would reach the caller's namespace
        raise ConfigError(field, text, "'@' (a pandas local variable, or matrix product) is not allowed", _FIX)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ConfigError(field, text, f"not an expression ({exc.msg})", _FIX) from None
    except (RecursionError, MemoryError):
        raise ConfigError(field, text, "an expression nested too deeply to parse", _FIX) from None
    if depth(tree) > DEEPEST_EXPRESSION:
        raise ConfigError(field, text, f"an expression nested deeper than {DEEPEST_EXPRESSION} operations", _FIX)
    for node in ast.walk(tree):
        if isinstance(node, _OPERATORS) or isinstance(node, _STRUCTURE):
            if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, bool, str)):
                raise ConfigError(field, text, f"the literal {node.value!r} is not allowed", _FIX)
            continue
        raise ConfigError(field, text, f"{construct(node, text.strip())} is not allowed (only arithmetic and "
                                       "comparisons on columns and literals)", _FIX)
    return tree


def depth(node: ast.AST) -> int:
    """How deep the tree under ``node`` goes (a leaf: 1), counted without recursion."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        current, level = stack.pop()
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in ast.iter_child_nodes(current))
    return deepest


def names(tree: ast.Expression) -> Set[str]:
    """The column names an expression reads."""
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id not in ("True", "False")}


def evaluate(field: str, text: str, frame: pd.DataFrame) -> pd.Series:
    """The expression ``text`` over ``frame``'s columns, as float64 (one value per row), by walking its
    checked tree (`parse_expression`)."""
    tree = parse_expression(field, text)
    missing = sorted(name for name in names(tree) if name not in frame.columns)
    if missing:
        raise DataError(field, text, f"no such column in the data: {', '.join(missing)}",
                        f"use columns among: {', '.join(map(str, frame.columns))}")
    try:
        with np.errstate(all="ignore"):
            value = _walk(tree.body, frame)
    except (TypeError, ValueError) as exc:  # e.g. a text column in arithmetic
        raise DataError(field, text, f"the expression cannot be evaluated on these columns ({exc})", _FIX) from None
    if not isinstance(value, pd.Series):  # an expression of literals only
        value = pd.Series(value, index=frame.index)
    try:
        return pd.to_numeric(value).astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(field, text, f"the expression's values are not numbers ({exc})", _FIX) from None


def _walk(node: ast.AST, frame: pd.DataFrame) -> Any:
    """The value of an allowed node: a column (Series) or a literal."""
    if isinstance(node, ast.Constant):
        return np.float64(node.value) if isinstance(node.value, (int, float)) and not isinstance(node.value, bool) \
            else node.value
    if isinstance(node, ast.Name):
        return frame[node.id]
    if isinstance(node, ast.BinOp):
        left, right = _walk(node.left, frame), _walk(node.right, frame)
        if isinstance(node.op, (ast.BitAnd, ast.BitOr)):  # elementwise logic, on truth values
            left, right = _truth(left), _truth(right)
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        operand = _walk(node.operand, frame)
        if isinstance(node.op, (ast.Not, ast.Invert)):
            return ~_truth(operand) if isinstance(operand, pd.Series) else not operand
        return _UNARY[type(node.op)](operand)
    if isinstance(node, ast.BoolOp):
        values = [_truth(_walk(value, frame)) for value in node.values]
        result = values[0]
        for value in values[1:]:
            result = _BOOLEAN[type(node.op)](result, value)
        return result
    left = _walk(node.left, frame)  # a Compare (the only other allowed node)
    result = None
    for op, right_node in zip(node.ops, node.comparators):
        right = _walk(right_node, frame)
        step = _COMPARE[type(op)](left, right)
        result = step if result is None else result & step
        left = right
    return result


def _truth(value: Any) -> Any:
    """A value as the booleans ``and`` / ``or`` combine elementwise."""
    return value.astype(bool) if isinstance(value, pd.Series) else bool(value)
