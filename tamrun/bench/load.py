"""python -m tamrun.bench.load: the fit of every preset on idle cores and beside busy processes, for tamrun's
wait policy and the alternatives, and the peer under the same load, in one invocation.

    python -m tamrun.bench.load -r 3                                  # every preset, 2 busy processes
    python -m tamrun.bench.load --models forest --spins 0,100,10000 -r 5
    python -m tamrun.bench.load --peer-python ../peer-venv/bin/python --peer-models fourier,spline,forest

A run is ``python -m tamrun model=<preset> tracking=none progress=off`` in a fresh process; its fit is the
``fit=`` it prints. The variants differ only in the environment the command starts with (`VARIANTS`, and
``GOMP_SPINCOUNT=<n>`` for each of --spins): tamrun's own choice (`tamrun.machine.threads.wait_policy`, from the
load it reads at start), OpenMP's default spin, no spin (PASSIVE), one thread. "Loaded" runs beside ``--busy`` processes that spin
(``python -c "while True: pass"``, started by the benchmark and stopped by it); "idle" runs with nothing
else running but the benchmark, which waits for its child. Per preset, all idle rounds, then all loaded
rounds, the variants' order rotating each round. A run that outlives --timeout counts as that many
seconds, marked ``>``. The peer (tam-ml, its own virtual environment) fits the preset's formula under
the same two conditions (`tamrun.bench.child`).

Prints the machine (`tamrun.bench.machine`, load average read before the first run) and two tables:
per preset and variant, the idle and loaded fit (medians), loaded / idle, and idle / the best idle
variant of that preset; then the peer's idle and loaded fit beside tamrun's default and their ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional

from tamrun.bench.commands import report_presets, run_child
from tamrun.bench.meter import reported_fit
from tamrun.machine.threads import WAIT_REASON, WAIT_VARIABLES

PRESETS = ("fourier,fourier_holidays,fourier_lags,spline,spline_holidays,spline_lags,forest,forest_big,"
           "forest_fourier")
DEFAULT = "tamrun (default)"
VARIANTS: Dict[str, Dict[str, str]] = {
    DEFAULT: {},
    "OpenMP default spin": {"GOMP_SPINCOUNT": "300000"},  # libgomp's value when nothing is set
    "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
    "OMP_NUM_THREADS=1": {"OMP_NUM_THREADS": "1"},
}
CONDITIONS = ("idle", "loaded")
BUSY_LOOP = "while True: pass"
log = logging.getLogger("tamrun.bench.load")


@dataclass
class Fits:
    """The fit seconds of one preset's runs: ``runs[condition][variant]``; ``late``: the runs that
    outlived the timeout (counted as the timeout)."""

    runs: Dict[str, Dict[str, List[float]]] = field(default_factory=lambda: {c: {} for c in CONDITIONS})
    late: Dict[str, Dict[str, int]] = field(default_factory=lambda: {c: {} for c in CONDITIONS})
    peer: Dict[str, List[float]] = field(default_factory=lambda: {c: [] for c in CONDITIONS})

    def add(self, condition: str, variant: str, seconds: float, late: bool) -> None:
        self.runs[condition].setdefault(variant, []).append(seconds)
        self.late[condition][variant] = self.late[condition].get(variant, 0) + int(late)

    def median(self, condition: str, variant: str) -> float:
        return statistics.median(self.runs[condition][variant])

    def cell(self, condition: str, variant: str) -> str:
        """The median, ``>`` when a run outlived the timeout."""
        mark = ">" if self.late[condition].get(variant) else ""
        return f"{mark}{self.median(condition, variant):.2f}"


def base_environment() -> Dict[str, str]:
    """This process's environment without a wait policy of its own (each variant sets its own) and
    without Hydra's variables of a surrounding job."""
    return {k: v for k, v in os.environ.items()
            if k not in (*WAIT_VARIABLES, WAIT_REASON, "OMP_NUM_THREADS") and not k.startswith("HYDRA_")}


@contextlib.contextmanager
def busy_processes(count: int) -> Iterator[List[subprocess.Popen]]:
    """``count`` processes that spin on a core each until the block ends (then stopped and reaped)."""
    processes = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(count)]
    try:
        yield processes
    finally:
        for process in processes:
            process.kill()
        for process in processes:
            process.wait()


def tamrun_fit(model: str, env: Dict[str, str], workdir: Path, timeout: float) -> tuple:
    """(fit seconds, outlived the timeout) of one ``python -m tamrun`` of ``model`` with ``env``."""
    arguments = [f"model={model}", "tracking=none", "progress=off", f"hydra.run.dir={workdir / 'run'}"]
    try:
        done = subprocess.run([sys.executable, "-m", "tamrun", *arguments], cwd=workdir, env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return timeout, True
    if done.returncode != 0:
        raise RuntimeError(f"{model} exited {done.returncode}: {done.stderr[-2000:]}")
    return reported_fit(done.stdout + done.stderr), False


def peer_fit(peer_python: str, model: str, peer_max_iter: Optional[int], timeout: float) -> float:
    """The peer's fit seconds for ``model``'s formula (`tamrun.bench.child`), in its own environment."""
    from tamrun.bench.__main__ import CHILD, peer_arguments

    command = [peer_python, str(CHILD), "--side", "peer", "--model", model, *peer_arguments(model)]
    command += ["--peer-max-iter", str(peer_max_iter)] if peer_max_iter is not None else []
    record = run_child(command, timeout, env=base_environment())
    if record.get("status") != "ok":
        raise RuntimeError(f"the peer's {model}: {record}")
    return float(record["fit_seconds"])


@dataclass(frozen=True)
class Settings:
    """The command line's choices (`parse_arguments`)."""

    variants: Dict[str, Dict[str, str]]
    repeats: int
    busy: int
    timeout: float
    peer_python: Optional[str] = None
    peer_models: tuple = ()
    peer_max_iter: Optional[int] = None


def measure(model: str, settings: Settings, workdir: Path) -> Fits:
    """Every variant's fits of ``model``, idle then loaded (module doc)."""
    fits = Fits()
    names = list(settings.variants)
    base = base_environment()
    for condition in CONDITIONS:
        with busy_processes(settings.busy if condition == "loaded" else 0):
            for repeat in range(settings.repeats):
                shift = repeat % len(names)
                for name in names[shift:] + names[:shift]:
                    seconds, late = tamrun_fit(model, {**base, **settings.variants[name]}, workdir, settings.timeout)
                    fits.add(condition, name, seconds, late)
                    log.info("%s %s %s #%d: fit %s%.2f s", model, condition, name, repeat, ">" if late else "", seconds)
                if settings.peer_python and model in settings.peer_models:
                    fits.peer[condition].append(peer_fit(settings.peer_python, model, settings.peer_max_iter,
                                                         settings.timeout))
    return fits


def variant_table(results: Dict[str, Fits], busy: int) -> List[str]:
    """Per preset and variant: idle and loaded fit, loaded / idle, idle / the preset's best idle variant."""
    lines = [f"| preset | variant | idle fit s | fit s beside {busy} busy | loaded / idle | idle / best idle | runs |",
             "|---|---|---|---|---|---|---|"]
    for model, fits in results.items():
        best = min(fits.median("idle", name) for name in fits.runs["idle"])
        for name in fits.runs["idle"]:
            idle, loaded = fits.median("idle", name), fits.median("loaded", name)
            lines.append(f"| {model} | {name} | {fits.cell('idle', name)} | {fits.cell('loaded', name)} | "
                         f"{loaded / idle:.2f} | {idle / best:.3f} | {len(fits.runs['idle'][name])} |")
    return lines


def peer_table(results: Dict[str, Fits]) -> List[str]:
    """Per preset the peer measured: tamrun's default and the peer's fit, idle and loaded, and the ratios."""
    lines = ["| preset | tamrun idle s | peer idle s | peer / tamrun idle | tamrun loaded s | peer loaded s | "
             "peer / tamrun loaded |", "|---|---|---|---|---|---|---|"]
    for model, fits in results.items():
        if not fits.peer["idle"] or DEFAULT not in fits.runs["idle"]:
            continue
        ours = {c: fits.median(c, DEFAULT) for c in CONDITIONS}
        peer = {c: statistics.median(fits.peer[c]) for c in CONDITIONS}
        lines.append(f"| {model} | {ours['idle']:.2f} | {peer['idle']:.2f} | {peer['idle'] / ours['idle']:.2f} | "
                     f"{ours['loaded']:.2f} | {peer['loaded']:.2f} | {peer['loaded'] / ours['loaded']:.2f} |")
    return lines if len(lines) > 2 else []


def parse_arguments(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tamrun.bench.load", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=PRESETS, help="comma-separated presets")
    parser.add_argument("-r", "--repeats", type=int, default=3)
    parser.add_argument("--busy", type=int, default=2, help="busy processes beside the loaded runs")
    parser.add_argument("--spins", default="", help="comma-separated GOMP_SPINCOUNT values to add as variants")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names of VARIANTS to run")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a run counts as that many")
    parser.add_argument("--peer-python", help="python of the peer's virtual environment (tam-ml 1.5.0)")
    parser.add_argument("--peer-models", default="fourier,spline,forest", help="presets the peer fits too")
    parser.add_argument("--peer-max-iter", type=int, default=None, help="cap on the peer's CG iterations")
    return parser.parse_args(argv)


def settings_of(args: argparse.Namespace) -> Settings:
    """The `Settings` of a parsed command line (an unknown variant name: ValueError naming the known ones)."""
    chosen = [name for name in args.variants.split(",") if name]
    unknown = [name for name in chosen if name not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}: use some of {list(VARIANTS)}")
    variants = {name: VARIANTS[name] for name in chosen}
    spins = [n.strip() for n in args.spins.split(",") if n.strip()]
    variants.update({f"GOMP_SPINCOUNT={n}": {"GOMP_SPINCOUNT": n} for n in spins})
    return Settings(variants, args.repeats, args.busy, args.timeout, args.peer_python,
                    tuple(args.peer_models.split(",")), args.peer_max_iter)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_arguments(argv)
    settings = settings_of(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    return report_presets("python -m tamrun.bench.load", argv, args.models,
                          lambda model, workdir: measure(model, settings, workdir),
                          lambda results: [*variant_table(results, settings.busy), "", *peer_table(results)])


if __name__ == "__main__":
    raise SystemExit(main())
