"""Errors that cross processes: a sweep's workers (joblib, Ray, submitit) send a job's exception back
to the launching process pickled."""

from __future__ import annotations

import pickle

import pytest

from tamrun.errors import ConfigError, DataError, DeviceError, MemoryBudgetError, NumericalError, TamrunError


@pytest.mark.parametrize("error", [ConfigError, DataError, DeviceError, MemoryBudgetError, NumericalError, TamrunError])
def test_a_tamrun_error_crosses_processes_whole(error):
    """Pickled as joblib's and Ray's workers send a job's exception back: same class, message, fields,
    run id and report line."""
    original = error("model.effects.toy.m", -2, "must be at least 1", "set model.effects.toy.m=8")
    original.run_id = "0123abcd"
    copy = pickle.loads(pickle.dumps(original))
    assert type(copy) is error and str(copy) == str(original) and copy.args == original.args
    assert (copy.field, copy.value, copy.problem, copy.fix, copy.run_id) == ("model.effects.toy.m", -2,
                                                                             "must be at least 1",
                                                                             "set model.effects.toy.m=8", "0123abcd")
    assert copy.report_line() == original.report_line()
    assert pickle.loads(pickle.dumps(error("f", "v", "p", "x"))).run_id is None
