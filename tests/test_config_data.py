"""A config is data (issue 58; docs/reliability.md, "A config is data"): before Hydra builds anything from
a composed config, its targets, logging classes, resolvers, tags and size are checked
(tamrun/config/trusted.py, through tamrun/process/hydra_loader.py).

Each refusal is a real ``python -m tamrun`` in a folder holding a real sqlite store with one FINISHED run
and a pickle that would write a marker file when loaded: it exits 2 with one ``tamrun: config error``
line naming the key and the value, no traceback, the marker absent, the store's bytes as they were and
no run folder created. tamrun's own documented options (every launcher, sweeper, sampler and logging
option of docs/sweeps.md and Hydra) pass the same check.
"""

from __future__ import annotations

import hashlib
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from conftest import csv_overrides, synthetic_frame
from tamrun.config.load import config_dir
from tamrun.config.store import register_configs
from tamrun.config.trusted import MAX_CONFIG_BYTES, MAX_CONFIG_NODES, check_composed, config_size, yaml_size
from tamrun.errors import ConfigError
from test_secrets import tamrun

MARKER = "PWNED"  # the file the evil pickle writes when it is loaded


class Evil:
    """Unpickled, it creates the file `MARKER` in the working folder (a stand-in for any code)."""

    def __reduce__(self):
        return open, (MARKER, "w")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A working folder: the CSV, the evil pickle, a package whose import writes the marker, an
    experiment folder for --config-dir, and one FINISHED run in the default store outputs/mlflow.db."""
    root = tmp_path_factory.mktemp("config_data")
    synthetic_frame(days=400, groups=2).to_csv(root / "d.csv", index=False)
    (root / "evil.pkl").write_bytes(pickle.dumps(Evil()))
    (root / "evilpkg").mkdir()
    (root / "evilpkg" / "__init__.py").write_text(f"open({MARKER!r}, 'w')\n")
    write_experiments(root / "experiments")
    done = tamrun(csv_overrides(Path("d.csv")), root, {}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (root / "outputs" / "mlflow.db").is_file()
    return root


def write_experiments(where: Path) -> None:
    """The --config-dir files the adversary writes (issue 58): a callback, a launcher chosen through a
    config group, a tag that builds an object, an alias bomb and a bomb of interpolations."""
    (where / "experiment").mkdir(parents=True)
    (where / "hydra" / "launcher").mkdir(parents=True)
    files: Dict[str, str] = {
        "experiment/callback.yaml": "# @package _global_\nhydra:\n  callbacks:\n    pwn:\n"
                                    "      _target_: pandas.read_pickle\n      filepath_or_buffer: evil.pkl\n",
        "hydra/launcher/evil.yaml": "_target_: joblib.load\nfilename: evil.pkl\n",
        "experiment/launcher.yaml": "# @package _global_\ndefaults:\n  - override /hydra/launcher: evil\n",
        "experiment/tag.yaml": "# @package _global_\ntracking:\n  experiment: !!python/object/apply:builtins.open "
                               f"[{MARKER}, w]\n",
        "experiment/aliases.yaml": alias_bomb(),
        "experiment/references.yaml": reference_bomb(),
        "experiment/deep.yaml": "# @package _global_\ntracking:\n  tags:\n    foo: " + "[" * 10_000 + "]" * 10_000 + "\n",
        "experiment/big.yaml": "# @package _global_\nhydra:\n  job:\n    env_set:\n"
                               + "".join(f"      MLFLOW_X{i}: v\n" for i in range(60_000)),
        "experiment/variables.yaml": "# @package _global_\nhydra:\n  job:\n    env_set:\n"
                                     + "".join(f"      MLFLOW_X{i}: v\n" for i in range(101)),
    }
    for name, text in files.items():
        (where / name).write_text(text, encoding="utf-8")


def alias_bomb(levels: int = 8, width: int = 8) -> str:
    """The issue's 3 KB YAML: each level a list of ``width`` aliases of the one below (8^8 values)."""
    lines = ["# @package _global_", "tracking:", "  tags:", f"    a0: &a0 [{', '.join(['x'] * width)}]"]
    lines += [f"    a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def reference_bomb(levels: int = 8, width: int = 8) -> str:
    """The same expansion written with ${..references} (OmegaConf resolves each copy apart)."""
    lines = ["# @package _global_", "hydra:", "  job_logging:", f"    b0: [{', '.join(['x'] * width)}]"]
    lines += [f"    b{i}: [{', '.join([repr('${..b%d}' % (i - 1))] * width)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def fingerprint(root: Path) -> tuple:
    """The store's bytes and the run folders: what a refused command must leave as they were."""
    store = hashlib.sha256((root / "outputs" / "mlflow.db").read_bytes()).hexdigest()
    return store, sorted(str(path.relative_to(root)) for path in (root / "outputs").glob("*/*"))


def refused(root: Path, args: List[str], key_value: str, env: Dict[str, str] = None) -> str:
    """Run ``python -m tamrun args`` in ``root`` and check the refusal (module doc); its line."""
    before = fingerprint(root)
    done = tamrun(args, root, env or {}, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.startswith("tamrun:")]
    assert done.returncode == 2, done.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"tamrun: config error: {key_value}"), done.stderr[-3000:]
    assert "Traceback" not in done.stderr + done.stdout
    assert not (root / MARKER).exists(), "the payload ran"
    assert fingerprint(root) == before, "the store or the run folders changed"
    return lines[0]


CSV = csv_overrides(Path("d.csv"))


@pytest.mark.parametrize("args, key_value", [
    (["+hydra.callbacks.pwn={_target_: pandas.read_pickle, filepath_or_buffer: evil.pkl}"],
     "hydra.callbacks.pwn._target_='pandas.read_pickle': not one of the targets tamrun ships"),
    (["+hydra.callbacks.pwn={_target_: numpy.load, file: evil.pkl, allow_pickle: true}"],
     "hydra.callbacks.pwn._target_='numpy.load'"),
    (["+hydra.callbacks.pwn={_target_: joblib.load, filename: evil.pkl}"], "hydra.callbacks.pwn._target_='joblib.load'"),
    (["+hydra.callbacks.t={_target_: logging.FileHandler, filename: outputs/mlflow.db, mode: w}"],
     "hydra.callbacks.t._target_='logging.FileHandler'"),
    (["+hydra.callbacks.redact_files._args_=[{_target_: joblib.load, filename: evil.pkl}]"],
     "hydra.callbacks.redact_files._args_.0._target_='joblib.load': a config is data: nothing is instantiated"),
    (["+model.effects.sx.f={_target_: joblib.load, filename: evil.pkl, _partial_: true}"],
     "model.effects.sx.f._target_='joblib.load'"),
    (["~hydra.callbacks.redact_files"], "hydra.callbacks.redact_files=None: tamrun's redaction of Hydra's files"),
    (["-m", "hydra.launcher._target_=joblib.load"], "hydra.launcher._target_='joblib.load'"),
    (["-m", "hydra.sweeper._target_=joblib.load"], "hydra.sweeper._target_='joblib.load'"),
    (["-m", "hydra/sweeper=optuna", "hydra.sweeper.custom_search_space=joblib.load"],
     "hydra.sweeper.custom_search_space='joblib.load': a config is data: a plugin would import and call"),
    (["hydra.job_logging.handlers.file.class=pandas.read_pickle"],
     "hydra.job_logging.handlers.file.class='pandas.read_pickle': not a handler of Hydra's own logging configs"),
    (["hydra.job_logging.handlers.file.filename=outputs/mlflow.db", "+hydra.job_logging.handlers.file.mode=w"],
     "hydra.job_logging.handlers.file.filename='outputs/mlflow.db': a log handler writes only a file named *.log"),
    (["hydra.hydra_logging.handlers.console.stream=ext://evilpkg.x"],
     "hydra.hydra_logging.handlers.console.stream='ext://evilpkg.x': logging would import what this names"),
    (["tracking.experiment=${python:os.getcwd}"],
     "tracking.experiment='${python:os.getcwd}': the resolver 'python' is not one of tamrun's"),
    (["tracking.experiment=${oc.decode:'[1]'}"], "tracking.experiment=\"${oc.decode:'[1]'}\": the resolver 'oc.decode'"),
    (["tracking.experiment=${oc.env:TAMRUN_TEST_UNSET_VARIABLE}"],
     "tracking.experiment='${oc.env:TAMRUN_TEST_UNSET_VARIABLE}': the environment variable "
     "TAMRUN_TEST_UNSET_VARIABLE is not set. Fix: export TAMRUN_TEST_UNSET_VARIABLE=<value>, or give a default"),
    (["hydra.searchpath=[pkg://evilpkg]"], "hydra.searchpath='pkg://evilpkg': a config is data"),
    (["+hydra.job.env_set.LD_PRELOAD=evil.so"], "hydra.job.env_set.LD_PRELOAD='evil.so': a config is data"),
    (["-m", "hydra/launcher=ray_cluster", "+hydra.launcher.ray.init.runtime_env={pip: [evilpkg]}"],
     "hydra.launcher.ray.init.runtime_env.pip=['evilpkg']: a config is data: a launcher's runtime_env sets only"),
    (["hydra.job_logging.root.handlers=[nope]"], "hydra.job_logging.root.handlers.0='nope': no such handler in "
     "hydra.job_logging.handlers (defined: console, file). Fix: name one defined there"),
    (["+hydra.job_logging.loggers.tamrun.handlers=[nope]"], "hydra.job_logging.loggers.tamrun.handlers.0='nope': "
     "no such handler"),
    (["hydra.job_logging.version=2"], "hydra.job_logging.version=2: logging's dictConfig reads version 1 only"),
    (["hydra.hydra_logging.root.handlers=[nope]"], "hydra.hydra_logging.root.handlers.0='nope': no such handler"),
    (["hydra.job_logging.formatters.simple.format='%(bogus)s'"], "hydra.job_logging.formatters.simple.format="
     "'%(bogus)s': does not format a log record (ValueError: Formatting field not found in record: 'bogus')"),
    (["hydra.job_logging.root.level=NOPE"], "hydra.job_logging.root.level='NOPE': not a level logging knows"),
    (["hydra.job_logging.handlers.console.stream=nope"],
     "hydra.job_logging.handlers.console.stream='nope': a log handler writes to the terminal only"),
    (["+tracking.tags.deep=" + "[" * 3000 + "]" * 3000], "+tracking.tags.deep='nested deeper than 100 levels': "
     "lists or mappings nested past tamrun's limit (MAX_CONFIG_DEPTH"),
    (["+hydra.callbacks.b0=[1,1]", "+hydra.callbacks.b1=[${hydra:callbacks.b0}]"],
     "hydra.callbacks.b0=[1, 1]: a Hydra callback is a mapping with a _target_"),
    (["+hydra.callbacks.sweep.x=${hydra:job.name}"], "hydra.callbacks.sweep.x='${hydra:job.name}': tamrun's "
     "callbacks take no arguments"),
    (["-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=1", '+hydra.sweeper.params={seed: "range(1,3)"}'],
     "hydra.sweeper.params='+hydra.sweeper.params={seed: \"range(1,3)\"}': Hydra could not merge this value into "
     "the config (AttributeError"),
    (["-m", "+experiment=tune_penalties", "hydra.sweeper.n_trials=1", "hydra.sweeper.storage=sqlite:///outputs/mlflow.db"],
     "hydra.sweeper.storage='sqlite:///outputs/mlflow.db': it names the tracking store's sqlite file: Optuna would"),
], ids=["read_pickle", "numpy_load", "joblib_load", "file_handler_on_the_store", "nested_in_a_callback",
        "under_model", "redaction_removed", "launcher", "sweeper", "search_space", "log_handler_class",
        "log_file_on_the_store", "ext_stream",
        "python_resolver", "oc_decode", "unset_variable", "pkg_searchpath", "env_set", "ray_runtime_env",
        "log_root_handler", "log_logger_handler", "log_version", "hydra_log_root_handler", "log_format",
        "log_level", "log_stream", "deep_override", "callback_not_a_mapping", "callback_argument",
        "mapping_onto_null", "optuna_storage_on_the_store"])
def test_the_command_line_names_no_code(folder, args, key_value):
    refused(folder, [*args, *CSV], key_value)


@pytest.mark.parametrize("experiment, key_value", [
    ("callback", "hydra.callbacks.pwn._target_='pandas.read_pickle'"),
    ("launcher", "hydra.launcher._target_='joblib.load'"),
    ("tag", "{folder}/experiments/experiment/tag.yaml='YAML (line 3)': not a YAML file tamrun reads: could not "
            "determine a constructor for the tag 'tag:yaml.org,2002:python/object/apply:builtins.open'"),
    ("aliases", "{folder}/experiments/experiment/aliases.yaml line 9='more than 100,000 values': this YAML file "
                "expands past tamrun's limit (MAX_CONFIG_NODES"),
    ("references", "hydra.job_logging.b5='more than 100,000 values': the composed config expands past"),
    ("deep", "{folder}/experiments/experiment/deep.yaml='nested deeper than 100 levels': lists or mappings nested "
             "past tamrun's limit (MAX_CONFIG_DEPTH"),
    ("big", "{folder}/experiments/experiment/big.yaml='{size:,} bytes': this config file is larger than tamrun "
            "reads (MAX_CONFIG_BYTES = 262,144 bytes"),
    ("variables", "hydra.job.env_set='101 variables': a config sets at most 100 variables for its jobs "
                  "(MAX_JOB_VARIABLES"),
])
def test_a_config_dir_file_names_no_code_and_no_bomb(folder, experiment, key_value):
    """The same in an experiment file of ``--config-dir`` (the bombs took > 120 s before: the timeout; the
    file of 10,000 nested lists was a RecursionError, a 14 MB one read for minutes, and 40,000 variables set
    for the job took 2 minutes and ended in an internal error)."""
    multirun = ["-m"] if experiment == "launcher" else []
    big = folder / "experiments" / "experiment" / "big.yaml"
    assert big.stat().st_size > MAX_CONFIG_BYTES
    refused(folder, [*multirun, "--config-dir", "experiments", *CSV, f"+experiment={experiment}"],
            key_value.format(folder=folder.resolve(), size=big.stat().st_size))


@pytest.mark.parametrize("options", [
    [], ["hydra/launcher=parallel"], ["hydra/launcher=joblib"], ["hydra/launcher=slurm"],
    ["hydra/launcher=submitit_local"], ["hydra/launcher=submitit_slurm"], ["hydra/launcher=ray_cluster"],
    ["+experiment=tune_penalties"], ["+experiment=day_ahead_aggregate"],
    *[["hydra/sweeper=optuna", f"hydra/sweeper/sampler={sampler}"]
      for sampler in ("tpe", "random", "cmaes", "nsgaii", "motpe", "grid")],
    ["hydra/job_logging=stdout", "hydra/hydra_logging=hydra_debug"],
    ["hydra/job_logging=disabled", "hydra/hydra_logging=disabled"], ["hydra/job_logging=none"],
    ["tracking=server", "tracking.experiment=${oc.env:HOME}", "hydra.job.name=nightly-1.2",
     "+hydra.job.env_set.MLFLOW_EXPERIMENT_NAME=nightly"],
])
def test_what_tamrun_ships_passes(options):
    """Every launcher, sweeper, sampler and logging option tamrun documents composes and passes."""
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            check_composed(compose(config_name="config", overrides=options, return_hydra_config=True))
    finally:
        GlobalHydra.instance().clear()


def test_hydra_s_help_composes_without_tamrun_s_primary_config_and_passes(tmp_path):
    """``--hydra-help`` composes Hydra's own config alone (no job, no tamrun callback): not refused."""
    done = tamrun(["--hydra-help"], tmp_path, {}, timeout=120)
    assert done.returncode == 0 and "hydra/launcher" in done.stdout, done.stderr[-3000:]


def test_the_size_limit_counts_what_aliases_and_references_expand_to():
    """A list of 8 aliases of a list of n values holds 1 + 8 n: 4 levels of the issue's file hold 42,807
    values with its keys and mappings (under the limit), 8 levels pass it at the 5th (line 9); a
    ${reference} to a list counts the list, so the same bomb written with references is refused too."""
    assert yaml_size(alias_bomb(levels=4)) == (42_807, "line 2")
    assert yaml_size(alias_bomb()) == (1 + 8 * 37_449, "line 9")
    assert yaml_size(alias_bomb(levels=4))[0] < MAX_CONFIG_NODES < 1 + 8 * 37_449
    assert yaml_size("a: 1\nb: [1, 2]\n") == (0, "")  # no anchor: nothing to expand, nothing measured
    with pytest.raises(ConfigError, match="hydra.job_logging.b5=.*expands past tamrun's limit"):
        check_composed(OmegaConf.create(yaml.safe_load(reference_bomb())))
    # b0 = 9 values, b(i) = 1 + 8 (1 + b(i-1)): 9 + 81 + 657 + 5,265 + 42,129, and 3 mappings above them
    assert config_size(yaml.safe_load(reference_bomb(levels=4))) == (48_144, "config")


def test_a_hydra_resolver_reference_counts_as_what_it_names():
    """``${hydra:callbacks.b0}`` expands to the list it names, as ``${hydra.callbacks.b0}`` would: the
    root, hydra, callbacks, b0 (3 values) and b1 (its list, and the reference's 4)."""
    tree = {"hydra": {"callbacks": {"b0": [1, 1], "b1": ["${hydra:callbacks.b0}"]}}}
    assert config_size(tree) == (11, "config")


def test_an_override_over_the_byte_limit_is_refused_before_it_is_parsed():
    """Linux passes no command-line argument over 128 KiB, but Hydra's compose API has no such bound: an
    override over `MAX_CONFIG_BYTES` is refused, named by its key, before Hydra's parser reads it."""
    size = MAX_CONFIG_BYTES + 1
    code = ("from hydra import compose, initialize_config_dir\n"
            "from tamrun.config.load import config_dir\nfrom tamrun.config.store import register_configs\n"
            "from tamrun.process.hydra_loader import install\ninstall()\nregister_configs()\n"
            "with initialize_config_dir(config_dir=str(config_dir()), version_base='1.3'):\n"
            f"    compose(config_name='config', overrides=['+tracking.tags.x=' + 'a' * {size - 17}])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert (f"+tracking.tags.x='{size:,} bytes': this override is larger than tamrun reads (MAX_CONFIG_BYTES = "
            f"{MAX_CONFIG_BYTES:,} bytes") in done.stderr, done.stderr[-3000:]
