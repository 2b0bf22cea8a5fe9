"""Hydra's sweeper and launcher plugins, the pip command that installs each, and the message that names
a missing one.

A missing plugin reaches the user through one of Hydra's errors: ``Could not find
'hydra/sweeper/optuna'`` (an option chosen on the command line or by an experiment, e.g.
``+experiment=tune_penalties``), ``Could not load 'hydra/launcher/submitit_slurm'`` (an option of
conf/hydra/launcher/ that extends the plugin's), or, as a multirun starts, ``Unknown plugin class :
'hydra_plugins.hydra_nevergrad_sweeper...'``, or, for tamrun's own launcher
(tamrun/hydra_plugins/tamrun_ray_launcher), the package it runs on (ray) missing as jobs start.
`missing_plugin` turns the first two into one `ConfigError` naming the plugin and the command that
installs it; `check_plugins` finds the others before Hydra instantiates the plugin.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from tamrun.errors import ConfigError


@dataclass(frozen=True)
class Plugin:
    """One of Hydra's plugins: its distribution (pip's name), its module under ``hydra_plugins``, the
    config options it provides (``hydra/<group>/<option>``, or a group of them) and tamrun's extra
    that installs it (pyproject.toml; None: not one of tamrun's extras). ``kind`` names what it is in
    the message (a package that one of tamrun's own plugins imports is not a Hydra plugin)."""

    distribution: str
    module: str
    options: Tuple[str, ...] = ()
    extra: Optional[str] = None
    kind: str = "the Hydra plugin"

    @property
    def install(self) -> str:
        return f"pip install 'tamrun[{self.extra}]'" if self.extra else f"pip install {self.distribution}"


PLUGINS = (
    Plugin("hydra-optuna-sweeper", "hydra_optuna_sweeper", ("hydra/sweeper/optuna", "hydra/sweeper/sampler"), "sweep"),
    Plugin("hydra-submitit-launcher", "hydra_submitit_launcher",
           ("hydra/launcher/submitit_slurm", "hydra/launcher/submitit_local"), "sweep"),
    # Not tamrun's: hydra/launcher=ray_cluster is tamrun's own launcher on ray (NEEDS, below).
    Plugin("hydra-ray-launcher", "hydra_ray_launcher", ("hydra/launcher/ray", "hydra/launcher/ray_aws")),
    # A dependency of tamrun's own (hydra/launcher=parallel): missing only from a broken install.
    Plugin("hydra-joblib-launcher", "hydra_joblib_launcher", ("hydra/launcher/joblib",)),
    Plugin("hydra-nevergrad-sweeper", "hydra_nevergrad_sweeper", ("hydra/sweeper/nevergrad",)),
    Plugin("hydra-ax-sweeper", "hydra_ax_sweeper", ("hydra/sweeper/ax",)),
    Plugin("hydra-rq-launcher", "hydra_rq_launcher", ("hydra/launcher/rq",)),
)

# tamrun's own plugins (tamrun/hydra_plugins/, installed as hydra_plugins.<module>) and the package each
# imports (its top-level module): hydra/launcher=ray_cluster's launcher runs jobs on ray.
NEEDS = {"tamrun_ray_launcher": Plugin("ray", "ray", extra="ray", kind="the package")}

_MISSING_OPTION = re.compile(r"Could not (?:find|load) '(hydra/(?:sweeper|launcher)/[^']+)'")
_UNKNOWN_CLASS = re.compile(r"Unknown plugin class : '(hydra_plugins\.(\w+)\.[\w.]+)'")


def plugin_of_option(path: str) -> Optional[Plugin]:
    """The plugin that provides the config option ``path`` (``hydra/launcher/submitit_slurm``), if known."""
    for plugin in PLUGINS:
        if any(path == option or path.startswith(option + "/") for option in plugin.options):
            return plugin
    return None


def plugin_of_module(module: str) -> Plugin:
    """The plugin whose module under ``hydra_plugins`` is ``module`` (one of Hydra's naming otherwise)."""
    known = [plugin for plugin in PLUGINS if plugin.module == module]
    return known[0] if known else Plugin(module.replace("_", "-"), module)


def importable(name: str) -> bool:
    """Whether the module ``name`` can be imported (without importing it)."""
    return importlib.util.find_spec(name) is not None


def installed(module: str) -> bool:
    """Whether ``hydra_plugins.<module>`` can be imported."""
    return importable(f"hydra_plugins.{module}")


def missing_requirement(module: str) -> Optional[Plugin]:
    """What ``hydra_plugins.<module>`` lacks to run: the plugin itself when it is not installed, or, for
    one of tamrun's own, the package it imports (`NEEDS`); None when nothing is missing."""
    if module in NEEDS:
        return None if importable(NEEDS[module].module) else NEEDS[module]
    return None if installed(module) else plugin_of_module(module)


def plugin_error(field: str, value: Any, plugin: Plugin) -> ConfigError:
    return ConfigError(field, value, f"needs {plugin.kind} {plugin.distribution}, which is not installed",
                       f"{plugin.install}, or pick another option (python -m tamrun --hydra-help lists them)")


def _named_plugin(text: str) -> Optional[ConfigError]:
    """The error for the plugin one of Hydra's messages (``text``) finds missing, if it does."""
    option = _MISSING_OPTION.search(text)
    plugin = plugin_of_option(option[1]) if option else None
    if option and plugin and not installed(plugin.module):
        group, _, name = option[1].rpartition("/")
        return plugin_error(group, name, plugin)
    unknown = _UNKNOWN_CLASS.search(text)
    if unknown and not installed(unknown[2]):
        group = "hydra/launcher" if "Launcher" in unknown[1] else "hydra/sweeper"
        return plugin_error(group, unknown[1], plugin_of_module(unknown[2]))
    return None


def missing_plugin(error: Optional[BaseException]) -> Optional[ConfigError]:
    """The `ConfigError` naming the plugin that Hydra's ``error`` (or an error it arose from) found
    missing; None when ``error`` is about something else (a misspelt option, a bad value) or when the
    plugin is installed."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        named = _named_plugin(str(error))
        if named is not None:
            return named
        error = error.__cause__ or error.__context__
    return None


def check_plugins(hydra: Any) -> None:
    """Refuse a multirun whose sweeper or launcher (``hydra.<group>._target_``) comes from a plugin that
    is not installed, before Hydra tries to instantiate it.

    Raises:
        ConfigError: the plugin's group and option (``hydra/launcher='ray_cluster'``) and how to install it.
    """
    for group in ("sweeper", "launcher"):
        parts = str(hydra[group].get("_target_") or "").split(".")
        missing = missing_requirement(parts[1]) if len(parts) >= 3 and parts[0] == "hydra_plugins" else None
        if missing is not None:
            choice = hydra.runtime.choices.get(f"hydra/{group}")
            raise plugin_error(f"hydra/{group}", choice or ".".join(parts), missing)
