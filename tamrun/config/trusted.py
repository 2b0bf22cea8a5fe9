"""A config is data: what of a composed config may name code, checked before Hydra instantiates anything.

Hydra builds objects from a config: every ``_target_`` it instantiates (``hydra.callbacks``, the launcher,
the sweeper and its sampler) and the classes and factories of ``logging.config.dictConfig``
(``hydra.job_logging``, ``hydra.hydra_logging``: ``class``, ``()``, ``ext://`` values). A target given on
the command line or in a ``--config-dir`` file (``+hydra.callbacks.x={_target_: pandas.read_pickle, ...}``)
would run before tamrun's first line. `check_composed` walks the whole composed config, the ``hydra`` node
included, before any of that, and refuses (a `ConfigError` naming the key and the value):

- a ``_target_`` anywhere but where `TARGETS` allows it, or one not listed there (tamrun's callbacks, the
  launchers and sweepers of docs/sweeps.md); tamrun instantiates nothing from the job's own fields;
- a logging handler, formatter or filter other than Hydra's defaults (`LOG_HANDLERS`: a stream handler
  on the terminal, a file handler on a ``.log`` file), an ``ext://`` value other than `LOG_STREAMS`;
- an interpolation calling a resolver not in `RESOLVERS` (``${python:...}``, ``${oc.create:...}``), or
  ``${oc.env:NAME}`` without a default for a variable that is not set;
- a variable set for the job other than a tracking one (``hydra.job.env_set``, a Ray launcher's
  ``runtime_env``: `check_environment`, `check_runtime_env`), and a ``pkg://`` config source of a package other than
  `CONFIG_PACKAGES` (`check_package`: reading it imports it);
- a logging mapping dictConfig would fail on (`check_logging_structure`: a version other than 1, a
  handler, formatter or filter named but not defined, a level logging does not know, a format that does
  not format a record);
- a ``hydra.callbacks`` value that is not a mapping with a ``_target_``;
- a config larger than `MAX_CONFIG_NODES` values once its references are expanded, or nested deeper
  than `MAX_CONFIG_DEPTH`.

`yaml_size` bounds a YAML file's aliases the same way before OmegaConf expands them (an alias bomb of
3 KB, 8 levels of 8, is 19 million values); `yaml_error` names a YAML file Hydra could not read (a tag that would
build an object, ``!!python/object``, is one: OmegaConf's loader is yaml's safe one). Hydra calls them
through `tamrun.process.hydra_loader`, which also refuses a file over `MAX_CONFIG_BYTES` before it is
parsed (`check_bytes`) and text nested past Python's recursion limit (`too_deep`).
"""

from __future__ import annotations

import logging
import os
import sys
from functools import lru_cache
from typing import Any, Dict, Iterator, List, Tuple

from tamrun.errors import ConfigError

# The most values (mappings, lists and scalars, each alias and ${reference} counted as what it expands
# to) one YAML file or one composed config may hold. tamrun's largest composed config has about 480.
MAX_CONFIG_NODES = 100_000
DEFAULT_STORE = "sqlite:///outputs/mlflow.db"  # the store of a run whose tracking.uri and MLFLOW_TRACKING_URI are unset
# The most bytes one config file (or one command-line override) may have, refused before it is parsed
# (OmegaConf reads about 130 KB a second): tamrun's largest file, conf/config.yaml, has about 3.5 KB.
MAX_CONFIG_BYTES = 256 * 1024
# The deepest a composed config may nest mappings and lists (tamrun's nest about 8 levels); deeper text
# than Python's recursion allows (about 1,000 levels) is refused as it is parsed.
MAX_CONFIG_DEPTH = 100

CALLBACKS = ("tamrun.process.hydra_files.RedactedHydraFiles", "tamrun.sweeps.sweep.SweepCallback")
LAUNCHERS = (
    "hydra._internal.core_plugins.basic_launcher.BasicLauncher",  # the default: one job after another
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",  # hydra/launcher=parallel, joblib
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",  # slurm, submitit_slurm
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",  # submitit_local
    "hydra_plugins.tamrun_ray_launcher.ray_cluster_launcher.RayClusterLauncher",  # ray_cluster (tamrun's)
)
SWEEPERS = ("hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
            "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper")
SAMPLERS = tuple(f"optuna.samplers.{name}" for name in (
    "TPESampler", "RandomSampler", "CmaEsSampler", "NSGAIISampler", "MOTPESampler", "GridSampler"))
# The callbacks no config may remove or change: Hydra's files and logs redacted (tamrun/process/hydra_files.py).
KEPT_CALLBACKS = {"redact_files": CALLBACKS[0]}
# Where a `_target_` may be (its mapping's key, ``*`` one name) and what it may name: nowhere else.
TARGETS: Dict[Tuple[str, ...], Tuple[str, ...]] = {
    ("hydra", "callbacks", "*"): CALLBACKS,
    ("hydra", "launcher"): LAUNCHERS,
    ("hydra", "sweeper"): SWEEPERS,
    ("hydra", "sweeper", "sampler"): SAMPLERS,
}
# Fields a plugin imports and calls by name besides `_target_` (optuna's sweeper: a function extending its
# search space), and what they may name: nothing.
TARGET_FIELDS: Dict[Tuple[str, ...], Tuple[str, ...]] = {("hydra", "sweeper", "custom_search_space"): ()}
LOGGING = ("job_logging", "hydra_logging")  # the hydra node's dictConfig mappings
# The handlers Hydra's own logging configs use (hydra/job_logging, hydra/hydra_logging), each with the
# keys its constructor takes besides dictConfig's own (`HANDLER_KEYS`).
LOG_HANDLERS = {"logging.StreamHandler": ("stream",),
                "logging.FileHandler": ("filename", "mode", "encoding", "delay", "errors")}
HANDLER_KEYS = ("class", "level", "formatter", "filters")
FORMATTER_KEYS = ("format", "datefmt", "style", "validate")  # logging.Formatter's: no class, no factory
FILTER_KEYS = ("name",)  # logging.Filter's: no factory
LOG_STREAMS = ("ext://sys.stdout", "ext://sys.stderr")
LOG_FILE_SUFFIX = ".log"  # a file handler writes a log, never the tracking store or a data file
LOG_FILE_MODES = ("a", "w")
LOG_VERSION = 1  # the only version of logging.config.dictConfig's schema
# What each logging entry may name, and where the names are defined: a logger's or the root's handlers
# and filters, a handler's filters and formatter.
LOG_NAMES = (("handlers", "handlers"), ("filters", "filters"), ("formatter", "formatters"))
# Interpolations into the logging mappings: the two Hydra's default file handler names its file with.
LOG_REFERENCES = ("hydra.runtime.output_dir", "hydra.job.name")
# The packages a ``pkg://`` config source may read (importing them): Hydra's, its plugins' and tamrun's.
CONFIG_PACKAGES = ("hydra", "hydra_plugins", "tamrun")
RESOLVERS = ("now", "oc.env", "hydra")  # Hydra's ${now:...} and ${hydra:...}, OmegaConf's ${oc.env:...}
ENV_PREFIXES = ("MLFLOW_", "TAMRUN_")  # the variables a config may set for its jobs: tracking's (docs/scale.md)
MAX_JOB_VARIABLES = 100  # the most a config may set for its jobs (tracking needs a handful)

SEE = "docs/reliability.md, 'A config is data'"


def targets_at(path: Tuple[str, ...]) -> Tuple[str, ...]:
    """The targets a mapping at ``path`` may name (none outside `TARGETS`)."""
    for where, allowed in TARGETS.items():
        if len(where) == len(path) and all(w in ("*", p) for w, p in zip(where, path)):
            return allowed
    return ()


def dotted(path: Tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in path)


def walk(node: Any, path: Tuple[Any, ...] = ()) -> Iterator[Tuple[Tuple[Any, ...], Any]]:
    """Every (path, value) of a plain container tree, mappings and lists included, parents first."""
    stack = [(path, node)]
    while stack:
        where, value = stack.pop()
        yield where, value
        if isinstance(value, dict):
            stack.extend((where + (key,), child) for key, child in value.items())
        elif isinstance(value, list):
            stack.extend((where + (index,), child) for index, child in enumerate(value))


def check_target(path: Tuple[Any, ...], node: Dict[str, Any]) -> None:
    """Refuse the ``_target_`` of the mapping at ``path`` unless `TARGETS` lists it there."""
    target = node["_target_"]
    allowed = targets_at(tuple(str(part) for part in path))
    if target in allowed:
        return
    key = dotted(path + ("_target_",))
    if not allowed:
        raise ConfigError(key, target, "a config is data: nothing is instantiated here",
                          f"remove {key}; tamrun builds only its own callbacks, launchers and sweepers ({SEE})")
    raise ConfigError(key, target, "not one of the targets tamrun ships for this key (a config is data)",
                      f"use one of: {', '.join(allowed)}; the options of docs/sweeps.md set them")


def check_value(path: Tuple[Any, ...], value: str) -> None:
    """Refuse an interpolation that calls a resolver other than `RESOLVERS` or reads an unset variable."""
    if "${" not in value:
        return
    from omegaconf.errors import GrammarParseError

    key = dotted(path)
    try:
        calls = interpolations(value)[0]
    except GrammarParseError as exc:
        raise ConfigError(key, value, f"not a valid interpolation ({str(exc).splitlines()[0]})",
                          "write ${other.key} or ${oc.env:NAME,default}, or escape the $ as \\${") from None
    for name, arguments in calls:
        if name not in RESOLVERS:
            raise ConfigError(key, value, f"the resolver '{name}' is not one of tamrun's ({', '.join(RESOLVERS)}): "
                              "a config is data", f"write the value itself ({SEE})")
        if name == "oc.env" and len(arguments) == 1 and "${" not in arguments[0] \
                and arguments[0] not in os.environ:
            raise ConfigError(key, value, f"the environment variable {arguments[0]} is not set",
                              f"export {arguments[0]}=<value>, or give a default: ${{oc.env:{arguments[0]},<default>}}")


@lru_cache(maxsize=1024)
def interpolations(value: str) -> Tuple[Tuple[Tuple[str, Tuple[str, ...]], ...], Tuple[str, ...]]:
    """(every resolver call of a value, nested ones too: its name and its arguments' texts; the keys its
    ``${key}`` interpolations name), from OmegaConf's own parser, once per distinct value.

    Raises:
        GrammarParseError: the value is not a valid interpolation.
    """
    if "${" not in value:
        return (), ()
    from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser as Grammar
    from omegaconf.grammar_parser import parse

    calls, keys, stack = [], [], [parse(value)]
    while stack:
        context = stack.pop()
        if isinstance(context, Grammar.InterpolationResolverContext):
            sequence = context.sequence()
            arguments = tuple(element.getText() for element in sequence.element()) if sequence else ()
            calls.append((context.resolverName().getText(), arguments))
        elif isinstance(context, Grammar.InterpolationNodeContext):
            keys.append(context.getText()[2:-1])
        stack.extend(context.getChildren() if hasattr(context, "getChildren") else ())
    return tuple(calls), tuple(keys)


def check_logging(path: Tuple[str, ...], config: Dict[str, Any], job_name: str) -> None:
    """Refuse, in one dictConfig mapping, a handler, formatter or filter other than Hydra's defaults
    (`LOG_HANDLERS`, `FORMATTER_KEYS`, `FILTER_KEYS`), a log file not named ``*.log`` and any value that
    would make logging import something (``ext://``, ``cfg://``) other than `LOG_STREAMS`."""
    for section in ("handlers", "formatters", "filters"):
        entries = config.get(section)
        for name, entry in (entries if isinstance(entries, dict) else {}).items():
            if not isinstance(entry, dict):
                continue
            where = path + (section, str(name))
            allowed = handler_keys(where, entry) if section == "handlers" else \
                FORMATTER_KEYS if section == "formatters" else FILTER_KEYS
            for key in entry:
                if key not in allowed:
                    raise ConfigError(dotted(where + (key,)), entry[key], f"not a key of this logging {section[:-1]} "
                                      "as Hydra's own logging configs write it (a config is data)",
                                      f"use only {', '.join(allowed)} ({SEE})")
    for where, value in walk(config, path):
        if isinstance(value, str):
            check_log_text(where, value, job_name)


def handler_keys(where: Tuple[str, ...], entry: Dict[str, Any]) -> Tuple[str, ...]:
    """The keys the logging handler ``entry`` may have; refuses its class unless `LOG_HANDLERS` lists it,
    and a file handler's file unless it is a log (`LOG_FILE_SUFFIX`, `LOG_FILE_MODES`)."""
    handler = entry.get("class")
    if handler not in LOG_HANDLERS:
        raise ConfigError(dotted(where + ("class",)), handler, "not a handler of Hydra's own logging configs "
                          "(a config is data)", f"use one of: {', '.join(LOG_HANDLERS)} ({SEE})")
    filename, mode = str(entry.get("filename", LOG_FILE_SUFFIX)), entry.get("mode", "a")
    if not filename.endswith(LOG_FILE_SUFFIX):
        raise ConfigError(dotted(where + ("filename",)), filename, "a log handler writes only a file named "
                          f"*{LOG_FILE_SUFFIX} (never the tracking store or a data file)",
                          f"name a log file ending in {LOG_FILE_SUFFIX}, e.g. ${{hydra.runtime.output_dir}}/run.log")
    stream = entry.get("stream", LOG_STREAMS[0])
    if not (isinstance(stream, str) and stream.startswith(("ext://", "cfg://"))):  # those: `check_log_text`
        raise ConfigError(dotted(where + ("stream",)), stream, "a log handler writes to the terminal only",
                          f"use one of: {', '.join(LOG_STREAMS)}")
    if mode not in LOG_FILE_MODES:
        raise ConfigError(dotted(where + ("mode",)), mode, "not a mode a log file is written with",
                          f"use one of: {', '.join(LOG_FILE_MODES)}")
    return HANDLER_KEYS + LOG_HANDLERS[handler]


def check_log_text(where: Tuple[str, ...], value: str, job_name: str) -> None:
    """Refuse a logging value that interpolates anything but `LOG_REFERENCES`, or that is (or becomes)
    an ``ext://``/``cfg://`` reference other than `LOG_STREAMS`: logging would import what it names."""
    key = dotted(where)
    calls, keys = interpolations(value)
    for name in keys + tuple(name for name, _ in calls):
        if name not in LOG_REFERENCES:
            raise ConfigError(key, value, f"a logging value may interpolate only {' and '.join(LOG_REFERENCES)}",
                              f"write the value itself ({SEE})")
    if "hydra.job.name" in keys and not job_name.replace("-", "_").replace(".", "_").isidentifier():
        raise ConfigError("hydra.job.name", job_name, f"a job name that {key} interpolates is a plain name",
                          "use letters, digits, '_', '-' and '.', e.g. hydra.job.name=tamrun")
    text = log_text(value, job_name)
    if text.startswith(("ext://", "cfg://")) and text not in LOG_STREAMS:
        raise ConfigError(key, value, "logging would import what this names (a config is data)",
                          f"use one of: {', '.join(LOG_STREAMS)}")


def log_text(value: str, job_name: str) -> str:
    """A logging value as it reads once `LOG_REFERENCES` are resolved (the output folder as ``/``)."""
    return value.replace("${hydra.runtime.output_dir}", "/").replace("${hydra.job.name}", job_name)


def check_logging_structure(path: Tuple[str, ...], config: Dict[str, Any], job_name: str) -> None:
    """Refuse a logging mapping that ``logging.config.dictConfig`` (or each log line) would fail on: no
    ``root`` key (Hydra reads it; null configures nothing), a version other than `LOG_VERSION`, an entry
    that is not a mapping, a handler, filter or formatter named but not defined (`LOG_NAMES`), a level
    logging does not know, a formatter that does not format a record."""
    if "root" not in config:
        raise ConfigError(dotted(path + ("root",)), None, "Hydra reads the root logger of a logging config "
                          "(null: logging left as it is)", f"set {dotted(path + ('root',))}=null, or keep Hydra's")
    if config["root"] is None:
        return
    if config.get("version") != LOG_VERSION:
        raise ConfigError(dotted(path + ("version",)), config.get("version"), "logging's dictConfig reads "
                          f"version {LOG_VERSION} only", f"set {dotted(path + ('version',))}={LOG_VERSION}")
    sections = {name: config.get(name) or {} for name in ("handlers", "formatters", "filters", "loggers")}
    users = [(path + ("root",), config["root"])]
    for section, entries in sections.items():
        if not isinstance(entries, dict):
            raise ConfigError(dotted(path + (section,)), entries, "not a mapping of names to logging "
                              f"{section}", f"write {dotted(path + (section,))} as Hydra's own logging configs do")
        users += [(path + (section, str(name)), entry) for name, entry in entries.items()]
    for where, entry in users:
        if not isinstance(entry, dict):
            raise ConfigError(dotted(where), entry, "not a mapping, as logging's dictConfig reads it",
                              f"write {dotted(where)} as Hydra's own logging configs do ({SEE})")
        check_log_names(path, where, entry, sections)
        level = entry.get("level", logging.INFO)
        if not isinstance(level, int) and str(level) not in logging.getLevelNamesMapping():
            raise ConfigError(dotted(where + ("level",)), level, "not a level logging knows",
                              "use one of: DEBUG, INFO, WARNING, ERROR, CRITICAL")
    for name, entry in sections["formatters"].items():
        check_formatter(path + ("formatters", str(name)), entry, job_name)


def check_log_names(path: Tuple[str, ...], where: Tuple[str, ...], entry: Dict[str, Any],
                    sections: Dict[str, Any]) -> None:
    """Refuse a name in ``entry`` (a logger's, the root's or a handler's) of a handler, filter or
    formatter that the logging mapping at ``path`` does not define."""
    for field, section in LOG_NAMES:
        names = entry.get(field)
        if names is None or where[-2:-1] == (section,):
            continue
        listed = [(where + (field,), names)] if field == "formatter" else \
            [(where + (field, index), name) for index, name in enumerate(names)] if isinstance(names, list) \
            else [(where + (field,), names)]
        for key, name in listed:
            if not isinstance(name, str) or name not in sections[section]:
                defined = ", ".join(map(str, sections[section])) or "none"
                raise ConfigError(dotted(key), name, f"no such {section[:-1]} in {dotted(path + (section,))} "
                                  f"(defined: {defined})", f"name one defined there, or define it ({SEE})")


def check_formatter(where: Tuple[str, ...], entry: Dict[str, Any], job_name: str) -> None:
    """Refuse a logging formatter whose ``format``, ``datefmt`` or ``style`` does not format a record:
    dictConfig would refuse it, or every log line would print a '--- Logging error ---' traceback."""
    text = {key: log_text(value, job_name) if isinstance(value, str) else value for key, value in entry.items()}
    try:
        formatter = logging.Formatter(text.get("format"), text.get("datefmt"), text.get("style", "%"),
                                      bool(text.get("validate", True)))
        formatter.format(logging.LogRecord("tamrun", logging.INFO, __file__, 1, "a message", None, None))
    except Exception as exc:  # noqa: BLE001 (whatever a format raises: the user's text, named below)
        key = "format" if "format" in entry else next(iter(entry), "format")
        raise ConfigError(dotted(where + (key,)), entry.get(key), f"does not format a log record "
                          f"({type(exc).__name__}: {exc})", "use logging's record fields, e.g. "
                          "'[%(asctime)s][%(name)s][%(levelname)s] - %(message)s'") from None


def graph_size(root: Any, edges: Any, key: Any, limit: int = MAX_CONFIG_NODES) -> Tuple[int, Any]:
    """(the values under ``root``, ``root``) of a graph whose shared nodes (YAML aliases, ${references})
    count once per use: each node is 1 plus what its ``edges(node)`` count, a node met again on its own
    path (a cycle) 1. Memoized on ``key(node)``, without recursion; it stops as soon as a node passes
    ``limit``: (its size, that node)."""
    sizes: Dict[Any, int] = {}
    entered: Dict[Any, List[Any]] = {}
    stack: List[Tuple[Any, bool]] = [(root, False)]
    while stack:
        node, ready = stack.pop()
        name = key(node)
        if name in sizes:
            continue
        if ready:
            sizes[name] = 1 + sum(sizes.get(key(edge), 1) for edge in entered[name])
            if sizes[name] > limit:
                return sizes[name], node
        elif name not in entered:
            entered[name] = list(edges(node))
            stack.append((node, True))
            stack.extend((edge, False) for edge in entered[name])
    return sizes.get(key(root), 1), root


def config_size(tree: Dict[str, Any]) -> Tuple[int, str]:
    """`graph_size` of a plain config tree: a ${reference} counts as the value it names (``${a}`` to a
    list of 8 is 9 values), so that references of references (a bomb of interpolations) are measured as
    OmegaConf would expand them."""

    def lookup(path: Tuple[str, ...]) -> Any:
        node: Any = tree
        for part in path:
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        return node

    def edges(path: Tuple[str, ...]) -> List[Tuple[str, ...]]:
        node = lookup(path)
        if isinstance(node, dict):
            return [path + (str(name),) for name in node]
        if isinstance(node, list):
            return [path + (str(index),) for index in range(len(node))]
        return [reference_path(path, name) for name in references(node)] if isinstance(node, str) else []

    size, path = graph_size((), edges, lambda path: path)
    return size, dotted(path) or "config"


def references(value: str) -> Tuple[str, ...]:
    """The keys a value's interpolations name: ``${key}`` and ``${hydra:key}`` (as ``hydra.key``)."""
    calls, keys = interpolations(value)
    return keys + tuple(f"hydra.{arguments[0]}" for name, arguments in calls
                        if name == "hydra" and len(arguments) == 1 and "${" not in arguments[0])


def reference_path(path: Tuple[str, ...], name: str) -> Tuple[str, ...]:
    """The path ``${name}`` names from the value at ``path`` (``.x`` a sibling, ``..x`` its parent's)."""
    dots = len(name) - len(name.lstrip("."))
    base = path[:len(path) - dots] if dots else ()
    return base + tuple(part for part in name.lstrip(".").replace("[", ".").replace("]", "").split(".") if part)


def yaml_size(text: str) -> Tuple[int, str]:
    """(the values a YAML text holds once its aliases are expanded, the line where the first value
    past `MAX_CONFIG_NODES` starts): `graph_size` of yaml's node graph, which shares an alias's node
    (composing it is linear in the text). Text without an anchor (``&``) holds no alias: (0, "")."""
    if "&" not in text:
        return 0, ""
    import yaml
    from omegaconf._utils import get_yaml_loader

    root = yaml.compose(text, Loader=get_yaml_loader())

    def edges(node: Any) -> List[Any]:
        if isinstance(node, yaml.MappingNode):
            return [part for pair in node.value for part in pair]
        return list(node.value) if isinstance(node, yaml.SequenceNode) else []

    if root is None:
        return 0, ""
    size, node = graph_size(root, edges, id)
    return size, f"line {node.start_mark.line + 1}"


def check_bytes(where: str, size: int, what: str) -> None:
    """Refuse a config text (a file, an override) over `MAX_CONFIG_BYTES`, before anything parses it."""
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(where, f"{size:,} bytes", f"{what} is larger than tamrun reads (MAX_CONFIG_BYTES = "
                          f"{MAX_CONFIG_BYTES:,} bytes, tamrun/config/trusted.py)",
                          "write a smaller config: tamrun's own largest file has about 3.5 KB")


def too_deep(where: str) -> ConfigError:
    """The `ConfigError` of a config text (a file, an override) nested past what Python's parsers recurse."""
    return ConfigError(where, f"nested deeper than {MAX_CONFIG_DEPTH} levels", "lists or mappings nested past "
                       f"tamrun's limit (MAX_CONFIG_DEPTH, tamrun/config/trusted.py; Python's parsers stop near "
                       f"{sys.getrecursionlimit():,})", "write the values with less nesting")


def check_size(where: str, size: int, what: str) -> None:
    if size > MAX_CONFIG_NODES:
        raise ConfigError(where, f"more than {MAX_CONFIG_NODES:,} values", f"{what} expands past tamrun's limit "
                          "(MAX_CONFIG_NODES, tamrun/config/trusted.py): YAML aliases or ${references} nested in "
                          "each other", "write the values out, without nesting aliases or references in each other")


def check_package(path: str) -> None:
    """Refuse a ``pkg://`` config source (``hydra.searchpath``) whose package is not in
    `CONFIG_PACKAGES`: Hydra imports a package to read its configs."""
    if path.split(".")[0] not in CONFIG_PACKAGES:
        raise ConfigError("hydra.searchpath", f"pkg://{path}", "a config is data: reading configs from a package "
                          "imports it", "put the configs in a folder: --config-dir <folder> or "
                          "hydra.searchpath=[file://<folder>]")


def check_environment(path: Tuple[str, ...], variables: Any) -> None:
    """Refuse a variable a config sets for its jobs (``hydra.job.env_set``, a Ray launcher's
    ``runtime_env.env_vars``) unless it is a tracking variable (`ENV_PREFIXES`): another (LD_PRELOAD,
    PATH, GIT_CONFIG_GLOBAL, PYTHONSTARTUP, ...) can make a program the job starts run code; more than
    `MAX_JOB_VARIABLES` of them."""
    if len(variables or {}) > MAX_JOB_VARIABLES:
        raise ConfigError(dotted(path), f"{len(variables):,} variables", f"a config sets at most "
                          f"{MAX_JOB_VARIABLES} variables for its jobs (MAX_JOB_VARIABLES, tamrun/config/trusted.py)",
                          "export the others in the shell that starts tamrun")
    for name, value in (variables or {}).items():
        if not str(name).startswith(ENV_PREFIXES):
            raise ConfigError(dotted(path + (name,)), value, "a config is data: the variables it sets for a job are "
                              f"tracking variables only ({', '.join(p + '*' for p in ENV_PREFIXES)})",
                              f"export {name} in the shell that starts tamrun")


def check_runtime_env(path: Tuple[str, ...], runtime_env: Any) -> None:
    """Refuse in a Ray launcher's ``runtime_env`` anything but ``env_vars`` (``pip``, ``py_modules``,
    ``working_dir``, ``worker_process_setup_hook``, ... install or run code on the nodes), and those
    unless `check_environment` allows them."""
    for key, value in (runtime_env or {}).items():
        if key != "env_vars":
            raise ConfigError(dotted(path + (key,)), value, "a config is data: a launcher's runtime_env sets only "
                              "env_vars (this installs or runs code on the nodes)",
                              "install tamrun and its dependencies on the cluster's nodes (docs/scale.md)")
        check_environment(path + (key,), value)


def check_target_fields(tree: Dict[str, Any]) -> None:
    """Refuse a field of `TARGET_FIELDS` set to a name it does not list."""
    for path, allowed in TARGET_FIELDS.items():
        node: Any = tree
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None and node not in allowed:
            raise ConfigError(dotted(path), node, "a config is data: a plugin would import and call what this names",
                              f"remove {dotted(path)} (search spaces go in hydra.sweeper.params, docs/sweeps.md)")


def check_callbacks(hydra: Dict[str, Any]) -> None:
    """Refuse a callback that is not a mapping of a ``_target_`` alone (tamrun's take no arguments), and a
    job's composed config (``hydra.job.config_name`` set by Hydra: not ``--hydra-help``'s composition of
    Hydra's own) without `KEPT_CALLBACKS`."""
    for name, entry in (hydra.get("callbacks") or {}).items():
        if not isinstance(entry, dict) or "_target_" not in entry:
            raise ConfigError(f"hydra.callbacks.{name}", entry, "a Hydra callback is a mapping with a _target_ "
                              "(Hydra builds each)", f"remove hydra.callbacks.{name} ({SEE})")
        extra = sorted(set(entry) - {"_target_"})
        if extra:
            key = extra[0]
            raise ConfigError(f"hydra.callbacks.{name}.{key}", entry[key], "tamrun's callbacks take no arguments "
                              "(Hydra builds them before ${hydra:...} resolves)", f"remove hydra.callbacks.{name}.{key}")
    if (hydra.get("job") or {}).get("config_name") is None:
        return
    for name, target in KEPT_CALLBACKS.items():
        entry = (hydra.get("callbacks") or {}).get(name)
        if not isinstance(entry, dict) or entry.get("_target_") != target:
            raise ConfigError(f"hydra.callbacks.{name}", entry, "tamrun's redaction of Hydra's files and logs is "
                              "not a config's to remove", f"keep hydra.callbacks.{name} as conf/config.yaml has it")


def sqlite_file(uri: Any) -> Any:
    """The real path of a ``sqlite:///`` URI's file (relative to the working folder), None for another."""
    if not isinstance(uri, str) or not uri.startswith("sqlite:///") or "${" in uri:
        return None
    return os.path.realpath(uri[len("sqlite:///"):].split("?", 1)[0])


def check_sweeper_storage(storage: Any, tracking_uri: Any) -> None:
    """Refuse Optuna's ``hydra.sweeper.storage`` naming the tracking store's sqlite file (tracking.uri, else
    the environment's MLFLOW_TRACKING_URI, else tamrun's `DEFAULT_STORE`): Optuna would add its tables to
    MLflow's store."""
    store = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_STORE
    if sqlite_file(storage) is not None and sqlite_file(storage) == sqlite_file(store):
        raise ConfigError("hydra.sweeper.storage", storage, "it names the tracking store's sqlite file: Optuna "
                          "would write its own tables into MLflow's store", "give Optuna a file of its own "
                          "(hydra.sweeper.storage=sqlite:///outputs/optuna.db), or leave it unset (in memory)")


def check_composed(cfg: Any) -> None:
    """Refuse a composed config (the ``hydra`` node included) that names code, a resolver or an unset
    variable tamrun does not allow, or that expands past `MAX_CONFIG_NODES` (module doc).

    Raises:
        ConfigError: the key and its value, what is refused and the fix.
    """
    from omegaconf import OmegaConf

    tree = OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)
    for path, value in walk(tree):
        if len(path) > MAX_CONFIG_DEPTH:
            raise too_deep(dotted(path[:MAX_CONFIG_DEPTH]))
        if isinstance(value, dict) and "_target_" in value:
            check_target(path, value)
        elif isinstance(value, str):
            check_value(path, value)
        if path[:2] == ("hydra", "launcher") and path[-1] == "runtime_env" and isinstance(value, dict):
            check_runtime_env(path, value)
    size, where = config_size(tree)
    check_size(where, size, "the composed config")
    check_target_fields(tree)
    hydra = tree.get("hydra") or {}
    check_callbacks(hydra)
    check_environment(("hydra", "job", "env_set"), (hydra.get("job") or {}).get("env_set"))
    check_sweeper_storage((hydra.get("sweeper") or {}).get("storage"), (tree.get("tracking") or {}).get("uri"))
    for name in LOGGING:
        if isinstance(hydra.get(name), dict):
            job_name = str((hydra.get("job") or {}).get("name"))
            check_logging_structure(("hydra", name), hydra[name], job_name)
            check_logging(("hydra", name), hydra[name], job_name)


def yaml_error(where: str, error: Exception) -> ConfigError:
    """The `ConfigError` of a YAML file (``where``) yaml could not read: a tag that would build an object
    (``!!python/object``) or a syntax error, with the line yaml names."""
    mark = getattr(error, "problem_mark", None)
    line = f" (line {mark.line + 1})" if mark is not None else ""
    problem = str(getattr(error, "problem", None) or error).splitlines()[0]
    return ConfigError(where, f"YAML{line}", f"not a YAML file tamrun reads: {problem} (a config is data: no "
                       "tag builds an object)", "write plain values (mappings, lists, strings, numbers)")
