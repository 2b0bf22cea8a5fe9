"""The experts of ``mode=aggregate``: each composed by Hydra from its preset, mode and overrides and given the
run's shared settings, then grouped into families that share a design.

    aggregate.experts.<name> = {model, mode, overrides}
        -> compose(config, [model=<model>, mode=<mode>, *overrides]) with the run's SHARED nodes -> Expert
    experts -> Family: the experts whose configs differ only in their mode and adaptive settings share one
        data load, one static fit per period and, when they filter with the same inputs, one batch of filters
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from tamrun.config.effects import effect_columns, parse_effects
from tamrun.config.load import config_dir, typed_config
from tamrun.config.schema import AdaptiveMethod, Config, ExpertConfig, KalmanState, ModeName
from tamrun.config.store import register_configs
from tamrun.errors import ConfigError

# The run's own settings every expert takes (the experts forecast the same rows the same way, on the
# machine classes and prices of the run: its cost is theirs).
SHARED = ("data", "split", "hw", "memory", "dtype", "seed", "progress", "tco")
# What may differ between the experts of one family.
OWN = ("mode", "adaptive", "objective", "more_objectives", "tracking", "aggregate")


@dataclass
class Expert:
    """One expert: its name, typed config and parsed effects."""

    name: str
    config: Config
    specs: Dict[str, Any]

    @property
    def filtered(self) -> bool:
        """A Kalman-filtered expert (else the static model)."""
        return self.config.mode.name == ModeName.adaptive

    @property
    def filter_key(self) -> Tuple[KalmanState, Tuple[str, ...]]:
        """What its filters' inputs depend on: the state and the columns not learnt from."""
        kal = self.config.adaptive.kalman
        return kal.state, tuple(kal.skip_updates)

    @property
    def pairs(self) -> List[Tuple[float, float]]:
        """Its (q, p0) grid."""
        kal = self.config.adaptive.kalman
        return [(float(q), float(p0)) for q in kal.q for p0 in kal.p0]


@dataclass
class Family:
    """Experts sharing data, model, split and solver: ``config`` and ``specs`` are the first expert's, with the
    Kalman settings of the first filtered one (so that the data load reads its skip_updates columns)."""

    config: Config
    specs: Dict[str, Any]
    experts: List[Expert] = field(default_factory=list)

    @property
    def static(self) -> List[Expert]:
        return [e for e in self.experts if not e.filtered]

    def filter_groups(self) -> List[List[Expert]]:
        """The filtered experts by `Expert.filter_key`: each group's filters run as one batch."""
        groups: Dict[Tuple[Any, ...], List[Expert]] = {}
        for expert in self.experts:
            if expert.filtered:
                groups.setdefault(expert.filter_key, []).append(expert)
        return list(groups.values())


def compose_overrides(name: str, overrides: List[str]) -> DictConfig:
    """The config ``python -m tamrun <overrides>`` would run, composed from conf/ (`ConfigError` naming the
    expert when Hydra refuses an override)."""
    register_configs()
    try:
        if GlobalHydra.instance().is_initialized():  # inside `python -m tamrun` (the app's own conf/)
            return compose(config_name="config", overrides=overrides)
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            return compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"aggregate.experts.{name}", overrides, f"Hydra cannot compose this expert ({reason})",
                          "give a model preset of conf/model/ and overrides as on the command line") from None


def read_derived(composed: DictConfig) -> Dict[str, Any]:
    """The derived columns of an expert's composed config that its effects read (those its model preset
    declares, as static_day_ahead's); none when its effects do not parse (`typed_config` then names the error)."""
    try:
        columns = set(effect_columns(parse_effects(composed.model.effects)).values())
    except ConfigError:
        return {}
    return {name: copy.deepcopy(node) for name, node in composed.data.derived.items() if name in columns}


def compose_expert(run_cfg: DictConfig, name: str, spec: ExpertConfig) -> Expert:
    """Expert ``name``: its preset, mode and overrides composed, then the run's `SHARED` settings (plus the
    derived columns its effects read that the run's data lacks: the run's win on a shared name), without
    tracking of its own; typed and checked like a run's config (errors name the expert)."""
    composed = compose_overrides(name, [f"model={spec.model}", f"mode={spec.mode.value}", *spec.overrides])
    own_derived = read_derived(composed)
    for key in SHARED:
        composed[key] = copy.deepcopy(run_cfg[key])
    with open_dict(composed.data.derived):
        for column, derived in own_derived.items():
            if column not in composed.data.derived:
                composed.data.derived[column] = derived
    composed.tracking.enabled = False
    mode, method = (getattr(value, "value", str(value)) for value in (composed.mode.name, composed.adaptive.method))
    if mode not in (ModeName.run.value, ModeName.adaptive.value) or (
            mode == ModeName.adaptive.value and method != AdaptiveMethod.kalman.value):
        raise ConfigError(f"aggregate.experts.{name}", [f"mode={mode}", f"adaptive.method={method}"],
                          "an expert is a static model (mode=run) or a Kalman-filtered one (mode=adaptive with "
                          "adaptive.method=kalman)", "add adaptive.method=kalman to its overrides, or set its mode=run")
    try:
        config, specs = typed_config(composed)
    except ConfigError as exc:
        raise ConfigError(f"aggregate.experts.{name}: {exc.field}", exc.value, exc.problem, exc.fix) from None
    return Expert(name, config, specs)


def compose_experts(cfg: Any, config: Config) -> List[Expert]:
    """Every expert of ``config.aggregate.experts``, in order, from the run's composed ``cfg``."""
    run_cfg = cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg)
    return [compose_expert(run_cfg, name, spec) for name, spec in config.aggregate.experts.items()]


def design_key(config: Config) -> str:
    """The settings a family shares: the config less `OWN`, as sorted JSON."""
    container = OmegaConf.to_container(OmegaConf.structured(config), resolve=True, enum_to_str=True)
    return json.dumps({k: v for k, v in container.items() if k not in OWN}, sort_keys=True, default=str)


def families(experts: List[Expert]) -> List[Family]:
    """The experts grouped by `design_key`, in the order of their first expert. A family with filtered
    experts loads its data as a Kalman run that skips the updates of all their columns would."""
    found: Dict[str, Family] = {}
    for expert in experts:
        found.setdefault(design_key(expert.config), Family(expert.config, expert.specs)).experts.append(expert)
    for family in found.values():
        filtered = [e for e in family.experts if e.filtered]
        if filtered:
            family.config = copy.deepcopy(filtered[0].config)
            columns = [c for e in filtered for c in e.config.adaptive.kalman.skip_updates]
            family.config.adaptive.kalman.skip_updates = list(dict.fromkeys(columns))
    return list(found.values())
