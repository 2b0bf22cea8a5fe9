"""A Ray sweep's request per job against the cluster's nodes: a request that no node can hold is refused
before any job starts.

Ray schedules a task only on a node that has all it asks for at once (``ray.remote``'s ``num_cpus``,
``num_gpus``, ``memory``, custom ``resources``); asked more than any node has, it waits for such a node
forever, saying only, in the autoscaler's log every 35 s, "No available node types can fulfill resource
request". `refuse_impossible` compares the request with every live node's resources (``ray.nodes()``) and
raises a `ConfigError` naming the request and what the nodes have. A cluster whose autoscaler would add a
larger node is refused too: start that node first.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

from tamrun.errors import ConfigError
from tamrun.config.units import format_size

# ray.remote's options and the resources they ask for, with the `ray start` option that gives a node more.
OPTIONS = {"num_cpus": ("CPU", "--num-cpus"), "num_gpus": ("GPU", "--num-gpus"), "memory": ("memory", "--memory")}


def request(remote: Mapping[str, Any]) -> Dict[str, float]:
    """What one job asks of a node: ``resource -> amount`` (Ray's default: 1 CPU)."""
    asked = {"CPU": 1.0 if remote.get("num_cpus") is None else float(remote["num_cpus"])}
    for option, (resource, _) in OPTIONS.items():
        if option != "num_cpus" and remote.get(option):
            asked[resource] = float(remote[option])
    asked.update({str(k): float(v) for k, v in (remote.get("resources") or {}).items()})
    return {resource: amount for resource, amount in asked.items() if amount > 0}


def shown_amount(resource: str, amount: float) -> str:
    """An amount as a message shows it: memory in bytes' units, counts as numbers."""
    return format_size(int(amount)) if resource == "memory" else f"{amount:g}"


def nodes_have(nodes: Sequence[Mapping[str, Any]], resources: Sequence[str]) -> str:
    """What the live nodes have of ``resources``: ``2 node(s): CPU 1, 1 (2 in all); GPU 0, 0 (0 in all)``."""
    alive = [node.get("Resources", {}) for node in nodes if node.get("Alive", True)]
    parts = []
    for resource in resources:
        amounts = [float(node.get(resource, 0.0)) for node in alive]
        parts.append(f"{resource} {', '.join(shown_amount(resource, a) for a in amounts)} "
                     f"({shown_amount(resource, sum(amounts))} in all)")
    return f"{len(alive)} node(s): " + "; ".join(parts)


def refuse_impossible(remote: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], address: str) -> None:
    """Raise a `ConfigError` when no live node of the cluster at ``address`` has all of a job's request."""
    asked = request(remote)
    alive = [node.get("Resources", {}) for node in nodes if node.get("Alive", True)]
    if any(all(float(res.get(k, 0.0)) >= v for k, v in asked.items()) for res in alive):
        return
    short = [k for k, v in asked.items() if not any(float(res.get(k, 0.0)) >= v for res in alive)]
    field, value = setting(remote, short or list(asked))
    largest = {k: max([float(res.get(k, 0.0)) for res in alive] or [0.0]) for k in short}
    fix = "; ".join(f"ask for at most {shown_amount(k, largest[k])} {k} per job, or start a node with "
                    f"{shown_amount(k, asked[k])} {k} ({start_option(k, asked[k])})" for k in short) or \
        "ask for less, so that one node holds a whole job, or start a node that has it all"
    raise ConfigError(field, value, f"no node of the Ray cluster at {address} can hold a job's request "
                      f"{asked} (Ray would wait for one forever): its "
                      f"{nodes_have(nodes, list(asked))}", fix)


def setting(remote: Mapping[str, Any], resources: List[str]) -> tuple:
    """The setting that asks for ``resources`` (one: its option; several: ``ray.remote``) and its value."""
    if len(resources) == 1:
        for option, (resource, _) in OPTIONS.items():
            if resource == resources[0]:
                return f"hydra.launcher.ray.remote.{option}", remote.get(option, 1 if option == "num_cpus" else 0)
        return f"hydra.launcher.ray.remote.resources.{resources[0]}", (remote.get("resources") or {}).get(resources[0])
    return "hydra.launcher.ray.remote", {k: remote.get(k) for k in (*OPTIONS, "resources") if remote.get(k)}


def start_option(resource: str, amount: float) -> str:
    """The `ray start` option that gives a node ``amount`` of ``resource``."""
    for name, flag in OPTIONS.values():
        if name == resource:
            return f"ray start {flag}={amount:.0f}"
    return f"ray start --resources='{{\"{resource}\": {amount:g}}}'"
