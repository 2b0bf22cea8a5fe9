"""A derived column's expression is data, never code (issue 44; docs/reliability.md, "Security").

Every construct outside arithmetic and comparisons on columns and literals is refused, naming it, before
anything is evaluated: pandas' ``@`` locals, attribute chains to ``__globals__``, calls, subscripts,
lambdas, comprehensions, assignments. The issue's shell command through the real command line: exit 2, a
config error naming the construct, and the command never ran. What is allowed computes what pandas'
arithmetic computes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from conftest import csv_overrides
from test_secrets import tamrun
from tamrun.config.expr import evaluate, parse_expression
from tamrun.errors import ConfigError, DataError

FRAME = pd.DataFrame({"x": [1.0, 2.0, 3.0, 4.0], "dow": [5, 6, 1, 0], "kind": ["a", "b", "a", "c"]})


@pytest.mark.parametrize("text, construct", [
    ('@pd.io.common.os.system("id > pwned")', "'@'"),
    ("x.__class__.__init__.__globals__", "attribute access 'x.__class__.__init__.__globals__'"),
    ("__import__('os').system('id')", "function call"),
    ("abs(x)", "function call 'abs(x)'"),
    ("x[0]", "subscript 'x[0]'"),
    ("(lambda: 1)()", "function call"),
    ("[v for v in x]", "ListComp"),
    ("(y := x)", "assignment"),
    ("x if dow else 1", "conditional expression"),
    ("{'a': 1}", "Dict"),
    ("x @ x", "'@'"),
    ("b'bytes' == x", "the literal b'bytes'"),
    ("x +", "not an expression"),
    ("-" * 500 + "x", "nested deeper than 100"),
    ("(" * 300 + "x" + ")" * 300, "not an expression"),
    ("x" + " + x" * 400, "characters (at most 1000)"),
])
def test_a_construct_outside_the_allow_list_is_a_config_error_naming_it(text, construct):
    with pytest.raises(ConfigError, match="data.derived.z.expr") as caught:
        parse_expression("data.derived.z.expr", text)
    assert construct in caught.value.problem


@pytest.mark.parametrize("text, expected", [
    ("x * 2 + 1", FRAME.x * 2 + 1), ("(x - 32) / 1.8", (FRAME.x - 32) / 1.8), ("x ** 2 % 3", FRAME.x ** 2 % 3),
    ("dow >= 5", (FRAME.dow >= 5).astype(float)), ("1 < x <= 3", ((FRAME.x > 1) & (FRAME.x <= 3)).astype(float)),
    ("(x > 1) & (dow < 6)", ((FRAME.x > 1) & (FRAME.dow < 6)).astype(float)),
    ("(x > 3) | (dow == 6)", ((FRAME.x > 3) | (FRAME.dow == 6)).astype(float)),
    ("not dow > 4", (~(FRAME.dow > 4)).astype(float)), ("kind == 'a'", (FRAME.kind == "a").astype(float)),
    ("-x // 2", -FRAME.x // 2), ("2", pd.Series(2.0, index=FRAME.index)),
])
def test_arithmetic_and_comparisons_compute_what_pandas_computes(text, expected):
    got = evaluate("data.derived.z.expr", text, FRAME)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got.to_numpy(), expected.astype(float).to_numpy())


def test_a_huge_power_of_literals_is_inf_not_a_day_of_work():
    assert np.isinf(evaluate("f", "10 ** 10 ** 10", FRAME)).all()


def test_a_name_that_is_not_a_column_is_a_data_error_naming_it():
    with pytest.raises(DataError, match="no such column in the data: nothing_here"):
        evaluate("data.derived.z.expr", "x + nothing_here", FRAME)


def test_the_issues_shell_command_never_runs(tmp_path, csv_path, store_uri):
    cwd = tmp_path / "cwd"
    done = tamrun([*csv_overrides(csv_path), f"tracking.uri={store_uri}",
                   '+data.derived.z={kind: expr, expr: "@pd.io.common.os.system(\\"touch pwned\\")"}'], cwd, {})
    assert done.returncode == 2, done.stderr[-3000:]
    assert "tamrun: config error: data.derived.z.expr=" in done.stderr and "'@'" in done.stderr
    assert not (cwd / "pwned").exists() and "Traceback" not in done.stderr
    done = tamrun([*csv_overrides(csv_path), f"tracking.uri={store_uri}",
                   '+data.derived.z={kind: expr, expr: "x.__class__.__init__.__globals__"}'], cwd, {})
    assert done.returncode == 2 and "attribute access 'x.__class__.__init__.__globals__' is not allowed" in done.stderr
