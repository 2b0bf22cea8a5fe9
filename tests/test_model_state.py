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
import urllib.request
from importlib import metadata
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
    return folder, artifacts, artifacts / "data" / "fitted", csv


def test_a_logged_model_loads_without_unpickling_on_a_cpu_only_machine(logged):
    folder, artifacts, state, csv = logged
    assert not list(artifacts.rglob("*.pkl")) and {p.name for p in state.iterdir()} == {"fitted.json",
                                                                                         "fitted.safetensors"}
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}"}
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


# --- issue 58: a model file is data too. The logged model holds no code; every file of it is checked against the
# sha256 its run recorded in the tracking store before MLflow's load, `mlflow models serve` or --register use it.

LOAD = """
import sys, mlflow.pyfunc
mlflow.pyfunc.load_model(sys.argv[1])
print("LOADED")
"""


def payload(folder: Path) -> bytes:
    """A line that leaves a file in ``folder`` if it ever runs."""
    return f"\nopen({str(folder / 'PWNED')!r}, 'w').write('ran')\n".encode()


def rewrite_tensor(state: Path, make) -> None:
    """``fitted.safetensors`` of ``state`` rewritten with its first float64 tensor replaced by ``make(tensor)``."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(state / "fitted.safetensors"))
    name = next(key for key in sorted(tensors) if tensors[key].dtype == torch.float64)
    tensors[name] = make(tensors[name])
    save_file(tensors, str(state / "fitted.safetensors"))


def tamper(model: Path, how: str) -> str:
    """Change the model folder ``model`` as an adversary with write access to the artifact store would;
    returns the path (in the model) of the file the refusal must name."""
    import torch

    state = model / "data" / "fitted"
    if how == "wheel":
        (wheel,) = model.glob("*.whl")
        with open(wheel, "ab") as handle:
            handle.write(payload(model.parent))
        return wheel.name
    if how == "code added":
        (model / "code" / "tamrun").mkdir(parents=True)
        (model / "code" / "tamrun" / "__init__.py").write_bytes(payload(model.parent))
        (model / "pyfunc_code.py").write_bytes(payload(model.parent))
        return "code/tamrun/__init__.py"
    if how == "requirements":
        with open(model / "requirements.txt", "a") as handle:
            handle.write("\nevil-package==1.0\n")
        return "requirements.txt"
    makers = {"nan": lambda t: torch.full_like(t, float("nan")), "1e300": lambda t: torch.full_like(t, 1e300),
              "int8": lambda t: t.to(torch.int8)}
    rewrite_tensor(state, makers[how])
    return "data/fitted/fitted.safetensors"


def load_child(uri: str, cwd: Path, store: str = "") -> subprocess.CompletedProcess:
    """``mlflow.pyfunc.load_model(uri)`` in a fresh process (MLFLOW_TRACKING_URI=``store``, none when empty)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    return subprocess.run([sys.executable, "-c", LOAD, uri], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**env, **({"MLFLOW_TRACKING_URI": store} if store else {})})


def store_of(folder: Path) -> str:
    return f"sqlite:///{folder / 'mlflow.db'}"


def load_in_process(folder: Path, model: Path):
    """``mlflow.pyfunc.load_model(model)`` in this process, verified against the store of the run in
    ``folder`` (`logged_model`), the process's tracking URI restored after."""
    import mlflow

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", store_of(folder))  # not set_tracking_uri: it would outlive the call
        return mlflow.pyfunc.load_model(str(model))


def test_the_logged_model_holds_no_code_and_its_run_recorded_every_file(logged):
    """Nine files, none of them Python source; MLflow's loader is the installed tamrun's; the store holds the
    sha256 of every one; requirements.txt pins the one wheel of tamrun by its sha256, and torch as a plain
    pin, without an index option."""
    import yaml

    from tamrun.tracking.model_files import MANIFEST_TAG, file_digests, sha256_of

    folder, artifacts, _, _ = logged
    files = sorted(p.relative_to(artifacts).as_posix() for p in artifacts.rglob("*") if p.is_file())
    (wheel,) = artifacts.glob("tamrun-*-py3-none-any.whl")
    assert files == sorted(["MLmodel", "conda.yaml", "python_env.yaml", "requirements.txt", "input_example.json",
                            "serving_input_example.json", "data/fitted/fitted.json", "data/fitted/fitted.safetensors",
                            wheel.name]) and not list(artifacts.rglob("*.py"))
    flavor = yaml.safe_load((artifacts / "MLmodel").read_text())["flavors"]["python_function"]
    assert flavor["loader_module"] == "tamrun.tracking.pyfunc_loader" and not flavor.get("code")
    client = MlflowClient(tracking_uri=store_of(folder))
    (model,) = client.search_logged_models([client.get_experiment_by_name("tamrun").experiment_id])
    assert json.loads(model.tags[MANIFEST_TAG]) == file_digests(artifacts)
    pinned = f"file:{wheel.name}#sha256={sha256_of(wheel)}"
    listed = (artifacts / "requirements.txt").read_text().splitlines()
    assert pinned in listed
    # issue 61: plain pins the default index alone satisfies; no index option (an index the serving machine
    # could not reach made pip retry it for every package: 17 minutes)
    assert not [line for line in listed if line.startswith("-")]
    assert f"torch=={metadata.version('torch').split('+')[0]}" in listed


@pytest.mark.parametrize("how", ["wheel", "code added", "requirements", "nan", "1e300", "int8"])
def test_a_tampered_model_folder_is_refused_before_anything_of_it_runs(logged, tmp_path, how):
    """A copy of the model changed on disk: ``mlflow.pyfunc.load_model`` of it (the store reachable) ends with
    one line naming the changed file and the fix; the payload never runs."""
    folder, artifacts, _, _ = logged
    model = tmp_path / "model"
    shutil.copytree(artifacts, model)
    changed = tamper(model, how)
    child = load_child(str(model), tmp_path, store_of(folder))
    last = child.stderr.strip().splitlines()[-1]
    assert child.returncode == 1 and "LOADED" not in child.stdout, child.stderr[-3000:]
    assert last.startswith("tamrun.tracking.model_files.ModelFileError: models:/m-") and f"='{changed}': " in last
    assert "the model is refused unread. Fix: do not serve this copy; run the run again" in last, last
    assert not (tmp_path / "PWNED").exists()


def test_a_tampered_artifact_store_refuses_runs_and_models_uris_and_register(logged, tmp_path):
    """The wheel in the artifact store itself changed: ``runs:/<id>/model`` and ``models:/<id>`` are refused,
    and ``python -m tamrun.compare --best --register`` exits 2 with one line, registering nothing. The same
    model restored registers and loads as ``models:/<name>@champion``."""
    from test_compare import compare

    folder, artifacts, _, _ = logged
    store = store_of(folder)
    client = MlflowClient(tracking_uri=store)
    (model,) = client.search_logged_models([client.get_experiment_by_name("tamrun").experiment_id])
    (wheel,) = artifacts.glob("*.whl")
    original = wheel.read_bytes()
    try:
        with open(wheel, "ab") as handle:
            handle.write(payload(tmp_path))
        for uri in (f"runs:/{model.source_run_id}/model", f"models:/{model.model_id}"):
            child = load_child(uri, tmp_path, store)
            assert child.returncode == 1 and f"='{wheel.name}': changed since the run logged it" in child.stderr
        done = compare("--store", store, "--best", "--register", "tampered", cwd=tmp_path)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-3000:]
        assert done.stderr.startswith(f"tamrun: model error: models:/{model.model_id}='{wheel.name}': changed")
        assert not client.search_registered_models()
    finally:
        wheel.write_bytes(original)
    assert not (tmp_path / "PWNED").exists()
    done = compare("--store", store, "--best", "--register", "restored", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert load_child("models:/restored@champion", tmp_path, store).stdout.strip() == "LOADED"


def test_a_model_is_loaded_only_against_the_store_that_recorded_it(logged, tmp_path):
    """A model folder loaded with no tracking store named, or with a store that never saw it, is refused:
    nothing says its files are the run's."""
    _, artifacts, _, _ = logged
    alone = load_child(str(artifacts), tmp_path)
    assert alone.returncode == 1 and "='no tracking store': its files cannot be checked" in alone.stderr
    assert "Fix: set MLFLOW_TRACKING_URI to the store its run logged it to" in alone.stderr
    other = load_child(str(artifacts), tmp_path, store_of(tmp_path))
    assert other.returncode == 1 and "the tracking store has no record of this model" in other.stderr


def free_port() -> int:
    """A local port nothing listens on (bound, read, closed)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_tracking_store_that_does_not_answer_is_not_said_to_lack_the_model(logged, tmp_path):
    """MLFLOW_TRACKING_URI names a server nothing answers at (its password in the URI): the load is refused
    saying the store did not answer, its password not shown, never that the store has no record of it."""
    _, artifacts, _, _ = logged
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    store = f"http://bob:S3cretPw0rd@127.0.0.1:{free_port()}"
    child = subprocess.run([sys.executable, "-c", LOAD, str(artifacts)], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300, env={**env, "MLFLOW_TRACKING_URI": store, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"})
    last = child.stderr.strip().splitlines()[-1]
    assert child.returncode == 1 and "LOADED" not in child.stdout, child.stderr[-3000:]
    assert "the tracking store http://" in last and "did not answer (" in last, last
    assert "whether it records this model is not known. Fix: start the tracking server" in last, last
    assert "has no record" not in last and "S3cretPw0rd" not in child.stderr, last


@pytest.mark.parametrize("how, message", [
    ("nan", "holds 1 non-finite value(s) (NaN or infinite), where fitted.json declares it finite"),
    ("int8", "is int8, where fitted.json declares float64"),
    ("shape", "has the shape [2], where fitted.json declares"),
])
def test_a_tensor_that_is_not_what_the_json_declares_is_refused_naming_it(logged, tmp_path, how, message):
    """Past the digests (the state read alone), each tensor is checked against its JSON node: dtype, shape,
    finiteness."""
    import torch

    _, _, state, _ = logged
    copy = tmp_path / "fitted"
    shutil.copytree(state, copy)

    def make(tensor):
        if how == "nan":
            return tensor.flatten().index_fill(0, torch.tensor([0]), float("nan")).reshape(tensor.shape)
        return tensor.to(torch.int8) if how == "int8" else torch.zeros(2, dtype=tensor.dtype)

    rewrite_tensor(copy, make)
    with pytest.raises(ModelStateError, match="the tensor 't[0-9]+' of fitted.safetensors ") as refused:
        load_state(copy)
    assert message in str(refused.value) and "the model is refused" in str(refused.value)


def test_the_model_s_wheel_installs_only_with_its_pinned_sha256(logged, tmp_path):
    """What ``mlflow models serve --env-manager virtualenv`` does with the requirements' wheel line, without
    an index: pip installs the model's own wheel (its tamrun imports from there), and refuses a changed one."""
    _, artifacts, _, _ = logged
    model = tmp_path / "model"
    shutil.copytree(artifacts, model)
    line = next(x for x in (model / "requirements.txt").read_text().splitlines() if x.startswith("file:tamrun-"))
    (model / "wheel.txt").write_text(line + "\n")

    def install(target):
        return subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target",
                               str(tmp_path / target), "-r", "wheel.txt"], cwd=model, capture_output=True,
                              text=True, timeout=300)

    assert install("good").returncode == 0
    where = subprocess.run([sys.executable, "-c", "import tamrun.tracking.pyfunc_loader as m; print(m.__file__)"],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path,
                           env={**os.environ, "PYTHONPATH": str(tmp_path / "good")})
    assert where.stdout.strip().startswith(str(tmp_path / "good" / "tamrun")), where.stderr[-2000:]
    tamper(model, "wheel")
    refused = install("bad")
    assert refused.returncode != 0 and "THESE PACKAGES DO NOT MATCH THE HASHES" in refused.stderr
    assert not (tmp_path / "bad" / "tamrun").exists()


def test_mlflow_models_serve_refuses_a_tampered_model_and_serves_it_restored(logged, tmp_path):
    """`mlflow models serve` of a copy whose code was added to: the server ends, its log's last line the
    refusal naming the file; the payload never ran. The untouched model serves the run's predictions."""
    import pandas as pd

    from servers import model_server

    folder, artifacts, state, csv = logged
    model = tmp_path / "model"
    shutil.copytree(artifacts, model)
    changed = tamper(model, "code added")
    env = {"MLFLOW_TRACKING_URI": store_of(folder), "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    with pytest.raises(AssertionError) as ended:
        with model_server(sys.executable, str(model), tmp_path / "serve.log", env):
            pass
    last = [line for line in (tmp_path / "serve.log").read_text().splitlines() if "ModelFileError" in line]
    assert last and f"='{changed}': was added (the run recorded no such file)" in last[-1], str(ended.value)
    assert not (tmp_path / "PWNED").exists()
    rows = pd.read_csv(csv).head(20)
    with model_server(sys.executable, str(artifacts), tmp_path / "good.log", env) as url:
        body = json.dumps({"dataframe_split": json.loads(rows.to_json(orient="split", index=False))}).encode()
        request = urllib.request.Request(f"{url}/invocations", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as answer:
            served = [row["predicted"] for row in json.loads(answer.read())["predictions"]]
    expected = load_state(state).predict_values(pd.read_csv(csv, parse_dates=["date"]).head(20))
    assert served == pytest.approx(list(expected), rel=1e-9)


def test_a_model_without_recorded_digests_is_not_registered(logged, tmp_path):
    """A LoggedModel whose store holds no digests (logged before tamrun recorded them, or the tag removed):
    ``--register`` exits 2 with one line naming the tag and the fix, registering nothing."""
    from tamrun.tracking.model_files import MANIFEST_TAG
    from test_compare import compare

    folder, _, _, _ = logged
    client = MlflowClient(tracking_uri=store_of(folder))
    (model,) = client.search_logged_models([client.get_experiment_by_name("tamrun").experiment_id])
    client.delete_logged_model_tag(model.model_id, MANIFEST_TAG)
    try:
        done = compare("--store", store_of(folder), "--best", "--register", "unrecorded", cwd=tmp_path)
    finally:
        client.set_logged_model_tags(model.model_id, {MANIFEST_TAG: model.tags[MANIFEST_TAG]})
    assert done.returncode == 2 and done.stderr == (
        f"tamrun: model error: models:/{model.model_id}='tamrun.model_files': the store records no digest of its "
        "files (a model logged before tamrun recorded its files, or the tag was removed). Fix: run the run again: "
        "it logs the model anew, its files recorded\n")
    assert "unrecorded" not in [m.name for m in client.search_registered_models()]


@pytest.mark.parametrize("entry, how", [
    ("data/fitted/extra", "was added (the run recorded no such file; it is a FIFO (named pipe))"),
    ("data/fitted/fitted.json", "is a FIFO (named pipe), not the regular file the run logged"),
])
def test_a_fifo_in_a_model_folder_is_refused_unopened(logged, tmp_path, entry, how):
    """A FIFO added to a copy of the model folder, or put in place of one of its files: the load is refused with
    one line naming it, without opening it (opening a FIFO waits for a writer: the load would hang)."""
    folder, artifacts, _, _ = logged
    model = tmp_path / "model"
    shutil.copytree(artifacts, model)
    (model / entry).unlink(missing_ok=True)
    os.mkfifo(model / entry)
    child = load_child(str(model), tmp_path, store_of(folder))
    last = child.stderr.strip().splitlines()[-1]
    assert child.returncode == 1 and "LOADED" not in child.stdout, child.stderr[-3000:]
    assert f"='{entry}': {how}: the model is refused unread. Fix: do not serve this copy" in last, last


def test_a_fifo_in_the_artifact_store_s_model_is_not_registered(logged, tmp_path):
    """A FIFO added inside the logged model's folder in the artifact store: ``--register`` exits 2 with one line
    naming it, registering nothing."""
    from test_compare import compare

    folder, artifacts, _, _ = logged
    client = MlflowClient(tracking_uri=store_of(folder))
    fifo = artifacts / "data" / "fitted" / "extra"
    os.mkfifo(fifo)
    try:
        done = compare("--store", store_of(folder), "--best", "--register", "piped", cwd=tmp_path)
    finally:
        fifo.unlink()
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-3000:]
    assert done.stderr.startswith("tamrun: model error: models:/m-") and "='data/fitted/extra': was added (the run " \
        "recorded no such file; it is a FIFO (named pipe)): the model is refused unread" in done.stderr, done.stderr
    assert "piped" not in [m.name for m in client.search_registered_models()]
