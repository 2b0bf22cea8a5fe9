"""Bringing one's own data and model: whole entries of the schema's mappings (derived columns, effects)
added on the command line; the worked ``--config-dir`` example of docs/own_data.md run as written."""

from __future__ import annotations

import dataclasses
import operator
import os
import shlex
import shutil
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest
from mlflow.tracking import MlflowClient

from tamrun.config.load import typed_config
from tamrun.config.schema import Config

# Every mapping field of the schema -> entries a user adds whole on the command line (columns of the
# embedded national table). A new mapping field needs its examples here.
MAPPING_ENTRIES = {
    "data.derived": ['{kind: expr, expr: "temperature - 273.15"}',
                     "{kind: isin, column: day_type_jf, values: [1]}",
                     "{kind: time_index, unit: h}",
                     "{kind: lag, column: Load, by: 1D}"],
    "model.effects": ["{kind: linear, column: Load_d7}",
                      "{kind: crossing, left: {kind: fourier, column: toy}, right: {kind: linear, column: Load_d7}}"],
    "aggregate.experts": ["{model: spline}",
                          "{model: fourier, mode: adaptive, overrides: ['adaptive.method=kalman']}"],
    "tco.classes": ["{kind: cpu, cores: 4, memory_gib: 8, bandwidth_gbs: 20, price_per_hour: 0.1}",
                    "{kind: gpu, memory_gib: 24, bandwidth_gbs: 4.1, price_per_hour: 0.7}"],
}
ENTRIES = [(path, entry) for path, entries in MAPPING_ENTRIES.items() for entry in entries]


def tamrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "TAMRUN_"))}
    return subprocess.run([sys.executable, "-m", "tamrun", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=300)


def schema_mappings(cls: type = Config, prefix: str = "") -> Iterator[tuple]:
    """(dotted path, type hint) of every ``Dict[...]`` field of the schema, at any depth."""
    hints = typing.get_type_hints(cls)
    for spec in dataclasses.fields(cls):
        hint = hints[spec.name]
        if typing.get_origin(hint) is dict:
            yield f"{prefix}{spec.name}", hint
        elif dataclasses.is_dataclass(hint):
            yield from schema_mappings(hint, f"{prefix}{spec.name}.")


def test_every_mapping_of_the_schema_is_open_to_hydra_and_has_examples():
    """OmegaConf refuses a plain dict as a new value of a ``Dict[str, <dataclass>]``: every mapping is
    ``Dict[str, Any]`` to Hydra (its entries are typed when the config is loaded)."""
    found = {path: hint for path, hint in schema_mappings() if typing.get_args(hint) != (str, str)}  # entries typed
    assert set(found) == set(MAPPING_ENTRIES)
    for path, hint in found.items():
        assert typing.get_args(hint) == (str, Any), f"{path}: {hint} refuses entries added on the command line"


def test_a_mapping_of_texts_takes_an_entry_on_the_command_line(compose_cfg):
    """tracking.tags (Dict[str, str]): a new tag on the command line, as `--refit` adds refit_of."""
    assert dict(typing.get_type_hints(type(Config().tracking)))["tags"] == Dict[str, str]
    config, _ = typed_config(compose_cfg("+tracking.tags.team=grid"))
    assert config.tracking.tags == {"team": "grid"}


@pytest.mark.parametrize("path,entry", ENTRIES, ids=[f"{p}={e}" for p, e in ENTRIES])
def test_a_whole_entry_can_be_added_on_the_command_line(compose_cfg, path, entry):
    config, specs = typed_config(compose_cfg(f"+{path}.added={entry}"))
    added = operator.attrgetter(path)(config)["added"]
    if path == "model.effects":  # typed into `specs` by the effects' parser
        added = specs["added"]
    assert dataclasses.is_dataclass(added)
    first_key, first_value = entry.split(",")[0].strip("{}").split(": ")  # e.g. kind: crossing, model: spline
    assert dataclasses.asdict(added)[first_key] == first_value


def test_a_derived_column_added_on_the_command_line_is_computed_and_read(tmp_path):
    """The user's command of issue 17, with an effect on the new column: the plan counts its
    coefficient (D = 61 for the fourier preset, 62 with it) and the table read holds temperature."""
    done = tamrun("mode=plan", "tracking=none", '+data.derived.tempc={kind: expr, expr: "temperature - 273.15"}',
                  "+model.effects.tempc={kind: linear, column: tempc}", cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "route: direct (D=62 " in output, output
    # date, Load and temperature: the preset derives every other column it reads (conf/derived/national.yaml)
    assert "x 3 columns" in output, output


# --- docs/own_data.md's worked example, run as written

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "own_data.md"
EXAMPLE = ROOT / "docs" / "examples" / "byo"


def guide_commands() -> list:
    """The commands that follow ``cd docs/examples/byo`` in the guide, comments dropped."""
    lines = [line.strip() for line in GUIDE.read_text(encoding="utf-8").splitlines()]
    commands = lines[lines.index("cd docs/examples/byo") + 1:]
    commands = commands[:next(i for i, line in enumerate(commands) if not line.startswith("python -m tamrun"))]
    return [shlex.split(line, comments=True) for line in commands]


def test_the_guide_shows_the_example_files_as_they_are():
    guide = GUIDE.read_text(encoding="utf-8")
    files = sorted((EXAMPLE / "conf").rglob("*.yaml"))
    assert [f.relative_to(EXAMPLE).as_posix() for f in files] == ["conf/data/mydata.yaml", "conf/model/mymodel.yaml"]
    for path in files:
        assert path.read_text(encoding="utf-8") in guide, f"{path} differs from its copy in {GUIDE.name}"
    assert "cd docs/examples/byo" in guide and len(guide_commands()) == 3


@pytest.mark.slow
def test_the_guide_commands_run_as_written(tmp_path):
    """Each command of the guide, in a copy of the example's folder: the plan, a fit without tracking
    (its RMSE as the guide states it), a fit recorded in outputs/mlflow.db with the example's data."""
    folder = tmp_path / "byo"
    shutil.copytree(EXAMPLE, folder)
    outputs = []
    for command in guide_commands():
        assert command[:3] == ["python", "-m", "tamrun"]
        done = tamrun(*command[3:], cwd=folder)
        outputs.append(done.stdout + done.stderr)
        assert done.returncode == 0, outputs[-1]
    plan, untracked, tracked = outputs
    assert "route: direct" in plan and "2 groups" in plan
    assert "rmse_test=5.295 " in untracked and "rmse_test=5.295`" in GUIDE.read_text(encoding="utf-8")
    (run,) = MlflowClient(tracking_uri=f"sqlite:///{folder / 'outputs' / 'mlflow.db'}").search_runs(["1"])
    assert run.info.status == "FINISHED"
    assert run.data.params["data.name"] == "shop" and run.data.params["model.name"] == "mymodel"
