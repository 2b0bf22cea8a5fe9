"""A sweeper or launcher plugin that is not installed: one message naming the plugin and the pip
command (tamrun's extra where it has one), exit code 2, no traceback.

The installed plugins (optuna, submitit, joblib: the ``test`` extra) and ray (the package tamrun's own
Ray launcher runs on) are hidden from one subprocess, or one test's process, only
(``sys.modules['hydra_plugins.<module>'] = None`` before Hydra scans its plugins), never uninstalled:
every case runs whether the plugin is installed or not."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf

from tamrun.config.plugins import PLUGINS, check_plugins, missing_plugin, plugin_of_option
from tamrun.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
RAY_PLUGIN = "hydra_plugins.hydra_ray_launcher"  # not installed by tamrun's extras: hidden to be sure

SWEEP, RAY, RAY_PLUGIN_INSTALL = "pip install 'tamrun[sweep]'", "pip install 'tamrun[ray]'", "pip install hydra-ray-launcher"
PLUGIN, PACKAGE = "the Hydra plugin", "the package"
# (module hidden from the run, the command line, the option named, what is missing, the pip command)
HIDDEN = [
    ("hydra_plugins.hydra_optuna_sweeper", ["+experiment=tune_penalties"], "hydra/sweeper='optuna'",
     f"{PLUGIN} hydra-optuna-sweeper", SWEEP),
    ("hydra_plugins.hydra_optuna_sweeper", ["-m", "hydra/sweeper=optuna"], "hydra/sweeper='optuna'",
     f"{PLUGIN} hydra-optuna-sweeper", SWEEP),
    ("hydra_plugins.hydra_submitit_launcher", ["-m", "hydra/launcher=slurm"], "hydra/launcher='submitit_slurm'",
     f"{PLUGIN} hydra-submitit-launcher", SWEEP),
    ("hydra_plugins.hydra_submitit_launcher", ["-m", "hydra/launcher=submitit_local"],
     "hydra/launcher='submitit_local'", f"{PLUGIN} hydra-submitit-launcher", SWEEP),
    # (ray missing for tamrun's own hydra/launcher=ray_cluster: test_ray_missing_is_named_before_the_sweep_starts)
    # hydra-ray-launcher's own option: the plugin, which none of tamrun's extras installs
    (RAY_PLUGIN, ["-m", "hydra/launcher=ray"], "hydra/launcher='ray'", f"{PLUGIN} hydra-ray-launcher",
     RAY_PLUGIN_INSTALL),
    ("hydra_plugins.hydra_joblib_launcher", ["-m", "hydra/launcher=parallel"], "hydra/launcher='joblib'",
     f"{PLUGIN} hydra-joblib-launcher", "pip install hydra-joblib-launcher"),
]
HIDE = ("import sys; sys.modules[sys.argv.pop(1)] = None\n"
        "from tamrun.__main__ import main; main(sys.argv[1:])")


def run(argv: list, cwd: Path, hidden: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "TAMRUN_"))}
    command = [sys.executable, "-c", HIDE, hidden] if hidden else [sys.executable, "-m", "tamrun"]
    return subprocess.run([*command, *argv, "tracking=none", "mode=plan"], cwd=cwd, capture_output=True,
                          text=True, env=env, timeout=300)


def assert_one_plugin_message(done: subprocess.CompletedProcess, option: str, missing: str, install: str) -> None:
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    lines = [line for line in output.splitlines() if line.startswith("tamrun: ")]
    assert lines == [f"tamrun: config error: {option}: needs {missing}, which is not installed. "
                     f"Fix: {install}, or pick another option (python -m tamrun --hydra-help lists them)"], output
    assert "Traceback" not in output and "spelling" not in output


@pytest.mark.parametrize("hidden,argv,option,missing,install", HIDDEN, ids=[" ".join(h[1]) for h in HIDDEN])
def test_a_missing_plugin_is_named_with_its_install_command(tmp_path, hidden, argv, option, missing, install):
    assert_one_plugin_message(run(argv, tmp_path, hidden), option, missing, install)


def test_ray_missing_is_named_before_the_sweep_starts(tmp_path):
    """ray_cluster composes without ray (conf/hydra/launcher/ray_cluster.yaml names tamrun's own
    launcher): the sweep callback refuses it before Hydra instantiates it (no parent run, no traceback)."""
    done = run(["-m", "hydra/launcher=ray_cluster"], tmp_path, hidden="ray")
    assert_one_plugin_message(done, "hydra/launcher='ray_cluster'", f"{PACKAGE} ray", RAY)
    assert "sweep " not in done.stdout + done.stderr  # the callback stopped before opening the sweep


def test_a_misspelt_option_keeps_the_spelling_hint(tmp_path):
    done = run(["-m", "hydra/launcher=slrum"], tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "Could not find 'hydra/launcher/slrum'" in output
    assert "check the field's spelling" in output and "pip install" not in output


@pytest.mark.parametrize("message,installed_here", [
    ("In 'hydra/config': Could not find 'hydra/launcher/ray'", False),
    ("In 'hydra/launcher/ray_cluster': Could not load 'hydra/launcher/ray'.", False),
    ("Unknown plugin class : 'hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher'", False),
    ("In 'hydra/config': Could not find 'hydra/sweeper/optuna'", True),
    ("In 'hydra/launcher/slurm': Could not load 'hydra/launcher/submitit_slurm'.", True),
])
def test_hydra_s_messages_map_to_the_plugin_when_it_is_missing(message, installed_here, monkeypatch):
    """Hydra's own errors, as it raises them (the exit's context, or a cause of it): named when the plugin
    is missing (the ray plugin, hidden from this process for the test), None when it is installed (then
    the message is about something else)."""
    monkeypatch.setitem(sys.modules, RAY_PLUGIN, None)
    try:
        try:
            raise MissingConfigException(message, missing_cfg_file="x")
        except MissingConfigException as cause:
            raise ConfigCompositionException("composition failed") from cause
    except ConfigCompositionException as error:
        found = missing_plugin(error)
    if installed_here:
        assert found is None
    else:
        assert found is not None and "hydra-ray-launcher" in str(found) and RAY_PLUGIN_INSTALL in str(found)
        assert found.field == "hydra/launcher"


def test_other_errors_map_to_nothing():
    assert missing_plugin(None) is None
    assert missing_plugin(MissingConfigException("Could not find 'hydra/launcher/slrum'", missing_cfg_file="x")) is None
    assert missing_plugin(ValueError("Could not find 'model/nope'")) is None


def test_every_option_of_the_table_names_its_plugin():
    assert plugin_of_option("hydra/sweeper/sampler/tpe").distribution == "hydra-optuna-sweeper"
    assert plugin_of_option("hydra/launcher/submitit_local").extra == "sweep"
    assert plugin_of_option("hydra/launcher/ray_aws").extra is None  # not tamrun's: ray_cluster is
    assert plugin_of_option("hydra/launcher/slrum") is None
    assert plugin_of_option("hydra/launcher/rayon") is None


def requirement_names(requirements: list) -> set:
    return {re.split(r"[<>=\[ ;]", req, maxsplit=1)[0] for req in requirements}


def test_the_table_agrees_with_pyproject_extras():
    """A plugin with an extra is in that extra of pyproject.toml, one without is in none, and every
    Hydra plugin pyproject.toml names is in the table."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = {extra: requirement_names(reqs) for extra, reqs in project["optional-dependencies"].items()}
    for plugin in PLUGINS:
        holding = {extra for extra, names in extras.items() if plugin.distribution in names} - {"test"}
        assert holding == ({plugin.extra} if plugin.extra else set()), plugin
    named = requirement_names(project["dependencies"]).union(*extras.values())
    assert {n for n in named if n.startswith("hydra-")} - {"hydra-core"} <= {p.distribution for p in PLUGINS}


def test_check_plugins_passes_installed_plugins_and_refuses_a_missing_one():
    hydra = {"sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"},
             "launcher": {"_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"},
             "runtime": {"choices": {"hydra/launcher": "parallel"}}}
    check_plugins(OmegaConf.create(hydra))
    hydra["launcher"]["_target_"] = "hydra_plugins.hydra_nowhere_launcher.nowhere.NowhereLauncher"
    with pytest.raises(ConfigError, match=r"hydra/launcher='parallel': needs the Hydra plugin hydra-nowhere-launcher"):
        check_plugins(OmegaConf.create(hydra))
