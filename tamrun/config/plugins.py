"""Hydra's sweeper and launcher plugins, the pip command that installs each, and the message that names
a missing one.

A missing plugin reaches the user through one of Hydra's errors: ``Could not find
'hydra/sweeper/optuna'`` (an option chosen on the command line or by an experiment, e.g.
``+experiment=tune_penalties``), ``Could not load 'hydra/launcher/submitit_slurm'`` (an option of
conf/hydra/launcher/ that extends the plugin's), or, as a multirun starts, ``Unknown plugin class :
'hydra_plugins.hydra_ray_launcher...'`` (conf/hydra/launcher/ray_cluster.yaml composes without its
plugin). `missing_plugin` turns any of them into one `ConfigError` naming the plugin and the command
that installs it; `check_plugins` finds the last kind before Hydra instantiates the plugin.
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
    that installs it (pyproject.toml; None: not one of tamrun's extras)."""

    distribution: str
    module: str
    options: Tuple[str, ...] = ()
    extra: Optional[str] = None

    @property
    def install(self) -> str:
        return f"pip install 'tamrun[{self.extra}]'" if self.extra else f"pip install {self.distribution}"


PLUGINS = (
    Plugin("hydra-optuna-sweeper", "hydra_optuna_sweeper", ("hydra/sweeper/optuna", "hydra/sweeper/sampler"), "sweep"),
    Plugin("hydra-submitit-launcher", "hydra_submitit_launcher",
           ("hydra/launcher/submitit_slurm", "hydra/launcher/submitit_local"), "sweep"),
    Plugin("hydra-ray-launcher", "hydra_ray_launcher", ("hydra/launcher/ray", "hydra/launcher/ray_aws"), "ray"),
    # A dependency of tamrun's own (hydra/launcher=parallel): missing only from a broken install.
    Plugin("hydra-joblib-launcher", "hydra_joblib_launcher", ("hydra/launcher/joblib",)),
    Plugin("hydra-nevergrad-sweeper", "hydra_nevergrad_sweeper", ("hydra/sweeper/nevergrad",)),
    Plugin("hydra-ax-sweeper", "hydra_ax_sweeper", ("hydra/sweeper/ax",)),
    Plugin("hydra-rq-launcher", "hydra_rq_launcher", ("hydra/launcher/rq",)),
)

# tamrun's own plugins (tamrun/hydra_plugins/, installed as hydra_plugins.<module>) and the plugin module each
# needs: hydra/launcher=ray_cluster's launcher runs on ray, which hydra-ray-launcher brings.
NEEDS = {"tamrun_ray_launcher": "hydra_ray_launcher"}

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


def installed(module: str) -> bool:
    """Whether ``hydra_plugins.<module>`` can be imported."""
    return importlib.util.find_spec(f"hydra_plugins.{module}") is not None


def plugin_error(field: str, value: Any, plugin: Plugin) -> ConfigError:
    return ConfigError(field, value, f"needs the Hydra plugin {plugin.distribution}, which is not installed",
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
        needed = NEEDS.get(parts[1], parts[1]) if len(parts) >= 3 else ""
        if len(parts) < 3 or parts[0] != "hydra_plugins" or (installed(needed) and installed(parts[1])):
            continue
        choice = hydra.runtime.choices.get(f"hydra/{group}")
        raise plugin_error(f"hydra/{group}", choice or ".".join(parts), plugin_of_module(needed))
