"""A logged model is data, never code (issue 44; docs/reliability.md, "Security").

A real run logs a model of every effect kind (spline, categorical, linear, Fourier, a forest crossed with
a Fourier basis) and every derived-column kind; a fresh process with no GPU visible, where unpickling and
``torch.load`` raise, loads it through MLflow and predicts what the run's own model predicts. A state file
that names a class outside tamrun (``os.system``, ``subprocess.Popen``, a builtin) is refused without
running anything, and a model logged as a pickle by an older tamrun is refused, not unpickled.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
from mlflow.tracking import MlflowClient

from conftest import synthetic_frame
from test_secrets import tamrun
from tamrun.tracking.model_state import MOVED_MODULES, STATE, ModelStateError, load_state

EFFECTS = ["+model.effects.sx={kind: spline, column: x, k: 6}",
           "+model.effects.dow={kind: categorical, column: dow, topo: fourier}",
           "+model.effects.lin={kind: linear, column: t}", "+model.effects.fx={kind: fourier, column: x, m: 2}",
           "+model.effects.cr={kind: crossing, left: {kind: forest, column: x, others: [dow], n_trees: 3, "
           "max_depth: 2}, right: {kind: fourier, column: x, m: 2}}",
           "+model.effects.wk={kind: linear, column: wk}", "+model.effects.hot={kind: linear, column: hot}",
           "+data.derived.t={kind: time_index, unit: D}", "+data.derived.wk={kind: isin, column: dow, values: [5,6]}",
           "+data.derived.hot={kind: expr, expr: 'x > 5'}"]
# The child: no GPU, and every way to unpickle raises; loads the model through MLflow and prints predictions.
CHILD = """
import json, pickle, sys, torch
def refuse(*args, **kwargs):
    raise AssertionError("unpickling attempted")
pickle.load = pickle.loads = pickle.Unpickler = torch.load = refuse
import mlflow.pyfunc, pandas as pd
rows = pd.read_csv(sys.argv[2]).head(200)
model = mlflow.pyfunc.load_model(sys.argv[1])
print(json.dumps([float(v) for v in model.predict(rows)["predicted"]]))
"""


def logged_model(folder: Path, csv: Path, effects: List[str]) -> Path:
    """The artifact folder of the model a run (``python -m tamrun``, in ``folder``) logs of ``csv`` with
    ``effects``: trained until 2020-02-15, tested from the day after."""
    store = f"sqlite:///{folder / 'mlflow.db'}"
    done = tamrun(["data=csv", f"data.path={csv}", "data.target=y", "data.group=g", "model=custom", *effects,
                   "split.train_end=2020-02-15", "split.test_start=2020-02-16", "split.test_end=null",
                   f"tracking.uri={store}", "progress=off", "tracking.log_plots=false"], folder / "cwd", {})
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(tracking_uri=store)
    (model,) = client.search_logged_models([client.get_experiment_by_name("tamrun").experiment_id])
    return Path(model.artifact_location.removeprefix("file://"))


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """A run on a 60-day CSV: (its folder, the logged model's artifact folder, its state folder, the CSV)."""
    folder = tmp_path_factory.mktemp("model_state")
    csv = folder / "d.csv"
    synthetic_frame(days=60).to_csv(csv, index=False)
    artifacts = logged_model(folder, csv, EFFECTS)
    return folder, artifacts, artifacts / "artifacts" / "fitted", csv


def test_a_logged_model_loads_without_unpickling_on_a_cpu_only_machine(logged):
    folder, artifacts, state, csv = logged
    assert not list(artifacts.rglob("*.pkl")) and {p.name for p in state.iterdir()} == {"fitted.json",
                                                                                         "fitted.safetensors"}
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    child = subprocess.run([sys.executable, "-c", CHILD, str(artifacts), str(csv)], capture_output=True, text=True,
                           env=env, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    import pandas as pd

    rows = pd.read_csv(csv, parse_dates=["date"]).head(200)
    expected = load_state(state).predict_values(rows)
    assert json.loads(child.stdout.strip().splitlines()[-1]) == pytest.approx(list(expected), abs=1e-12)


@pytest.mark.parametrize("cls", ["os:system", "subprocess:Popen", "builtins:eval", "tamrun.fit.fitted:torch.load",
                                 "tamrun.errors:os.system", "tamrun.redact:re.compile"])
def test_a_state_naming_a_class_outside_tamrun_is_refused(logged, tmp_path, cls):
    _, _, state, _ = logged
    tampered = tmp_path / "fitted"
    shutil.copytree(state, tampered)
    tree = json.loads((tampered / STATE).read_text())
    tree["root"]["class"] = cls
    tree["root"]["fields"] = {"args": ["touch pwned"]}
    (tampered / STATE).write_text(json.dumps(tree))
    with pytest.raises(ModelStateError, match="not one of tamrun's"):
        load_state(tampered)
    assert not (Path.cwd() / "pwned").exists()


def test_a_state_saved_before_the_modules_moved_loads_as_the_same_model(logged, tmp_path):
    """A model logged before tamrun's modules moved to their packages names its classes by their old
    modules (``tamrun.fitted:FittedModel``): it loads through MOVED_MODULES and predicts exactly as the
    state written today."""
    import pandas as pd

    _, _, state, csv = logged
    old = tmp_path / "fitted"
    shutil.copytree(state, old)
    text = (old / STATE).read_text()
    renamed = {}
    for before, after in MOVED_MODULES.items():
        renamed[before] = text.count(f'"{after}:')
        text = text.replace(f'"{after}:', f'"{before}:')
    (old / STATE).write_text(text)
    assert renamed["tamrun.fitted"] == 1 and sum(renamed.values()) >= 2, renamed
    rows = pd.read_csv(csv, parse_dates=["date"]).head(200)
    assert list(load_state(old).predict_values(rows)) == list(load_state(state).predict_values(rows))


def test_a_pickled_model_of_an_older_tamrun_is_refused_not_unpickled(tmp_path):
    pickled = tmp_path / "fitted.pkl"
    pickled.write_bytes(b"cos\nsystem\n(S'touch pwned'\ntR.")  # a pickle that runs a command when loaded
    with pytest.raises(ModelStateError, match="pickle"):
        load_state(pickled)
    assert not (Path.cwd() / "pwned").exists()


@pytest.mark.parametrize("tamper", ["dunder field", "unknown kind", "missing tensor", "dangling ref"])
def test_a_malformed_state_is_refused_as_such(logged, tmp_path, tamper):
    _, _, state, _ = logged
    tampered = tmp_path / "fitted"
    shutil.copytree(state, tampered)
    tree = json.loads((tampered / STATE).read_text())
    fields = tree["root"]["fields"]
    if tamper == "dunder field":
        fields["__reduce__"] = "x"
    elif tamper == "unknown kind":
        fields["coef"] = {"$": "pickle", "data": "gASV"}
    elif tamper == "missing tensor":
        fields["coef"] = {"$": "tensor", "name": "t999"}
    else:
        fields["design"] = {"$": "ref", "id": 999}
    (tampered / STATE).write_text(json.dumps(tree))
    with pytest.raises(ModelStateError):
        load_state(tampered)
