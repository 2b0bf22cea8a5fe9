"""python -m tamrun.bench.cpu_profile: where a CG fit's CPU time goes, preset by preset (issue 63).

    python -m tamrun.bench.cpu_profile --model forest --model forest_fourier
    python -m tamrun.bench.cpu_profile --model forest --override solver.max_iter=20 --copy-mib 512

Each preset's fit runs once in a fresh process (``--child``): the benchmark's bare fit (`tamrun.bench.child`:
`tamrun.pipeline.fit_model` on the embedded table, its made columns read from the file), with timers around
the functions at the code's seams (`seams`). A timer calls the function it wraps with the same arguments and
returns its result, so the fit's numbers are its own; it costs about a microsecond a call, and a CG iteration
makes about a dozen timed calls. Per preset the report gives:

- setup: the batch and the design's fit (the scalers, the forests' thresholds), the memory plan, the CG
  system (the design chunks kept between products, of which the rows' leaves; the CSR indicators O and O'
  of the leaf columns; the two-level sources, the grid blocks' inverses, the dense block's, the coarse
  system; the rest of the assembly pass: b, diag A, the Grams) and CG's start;
- the CG solve: its iterations (run, and the most any group needed) and the time per iteration split into
  A v (of which the sparse products with the leaf columns), M^-1 (of which the two-level correction's
  products), `residual_summary` (one sync) and the rest (vector updates, norms, dot products); torch's
  threads, the OpenMP wait policy and the CPU seconds per wall second while CG runs (spinning counts);
- the sparse products' bytes per iteration, an estimate: every index, value and vector array of O V and
  O' u read or written once (the least traffic), and the same with every gathered grid row or data row
  read from memory (the most), with the CSR arrays' index and value bytes named; against the host's copy
  bandwidth measured in the same process after the fit (`copy_bandwidth`: the best of a few copies of
  ``--copy-mib`` MiB, read + write counted). Only when CG keeps W Phi between products (the plan's
  cache_design; otherwise each product rebuilds it and no estimate is made).

The fit's threads wait as a command's would (the load measured before torch loads chooses the OpenMP wait
policy, `tamrun.machine.threads`), not as the benchmark's child's (OpenMP's default). Rows named "the rest"
are the parent's time less its timed parts. Writes <out>/cpu-profile-<time>.json and .md and prints the
report.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import logging
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from tamrun.bench.child import RESULT_PREFIX
from tamrun.bench.commands import run_child, write_report
from tamrun.bench.machine import header_lines, machine_info

log = logging.getLogger("tamrun.bench.cpu_profile")

SETUP, SOLVE, OUTSIDE = "setup", "solve", "outside"  # outside: the test year's prediction (not reported)
COPY_REPEATS = 5  # copies timed for the bandwidth; the fastest counts
# The report's rows: (label, parent or None, phase, what it is). A label's time is the sum of its seams'
# calls in that phase (`seams`); a row "<parent>: the rest" follows each parent's last part.
ROWS = (
    ("data", None, SETUP, "load, derive, check, split (before the fit; not in it)"),
    ("fit", None, SETUP, "tamrun.pipeline.fit_model: the benchmark's bare fit"),
    ("features", "fit", SETUP, "the training batch and the design's fit"),
    ("design fit", "features", SETUP, "the scalers, the forests' thresholds"),
    ("memory plan", "fit", SETUP, "the oracle's route and chunks"),
    ("CG system", "fit", SETUP, "tamrun.solve.assembly.CgSystem"),
    ("design chunks", "CG system", SETUP, "W Phi of each row chunk, kept between products"),
    ("rows to leaves", "design chunks", SETUP, "ForestEffect.leaf_index: the binning"),
    ("CSR indicators", "CG system", SETUP, "O and O' of the leaf columns: the index building (calls: with look-ups)"),
    ("two-level sources", "CG system", SETUP, "Phi' U_s, one pass over the rows"),
    ("grid block inverses", "CG system", SETUP, "the leaves' (Q, Q) blocks, by Cholesky"),
    ("one-level preconditioner", "CG system", SETUP, "the dense block's inverse (block-Jacobi)"),
    ("coarse system", "CG system", SETUP, "Z'AZ per group, its factor and inverse"),
    ("CG start", "fit", SETUP, "x0 moved by the coarse correction"),
    ("CG solve", "fit", SETUP, "tamrun.solve.cg.conjugate_gradient"),
    ("A v", "CG solve", SOLVE, "CgSystem.matvec"),
    ("sparse Phi v", "A v", SOLVE, "IndexedBlock.matvec: O V, times the row values"),
    ("sparse Phi' u", "A v", SOLVE, "IndexedBlock.rmatvec: O' (values o u)"),
    ("M^-1", "CG solve", SOLVE, "the preconditioner"),
    ("two-level correction", "M^-1", SOLVE, "CoarseCorrection's products (no product with Phi)"),
    ("residual summary", "CG solve", SOLVE, "one device sync per iteration"),
)
REST = {"fit": "the rest of the solve (a direct route's), the coefficients' check, the fitted model, its support",
        "features": "the training batch", "CG system": "the assembly pass: b, diag A, the dense Gram",
        "design chunks": "the dense columns, the leaves' flat index", "CG solve": "vector updates, norms, dot products",
        "A v": "the dense columns, P v, the sums", "M^-1": "block-Jacobi, the vector sums"}


def seams() -> List[Tuple[str, Any, str]]:
    """(label, owner, attribute) of every function the profile times: module-level names where their
    callers look them up, methods on their classes."""
    import tamrun.fit.dispatcher as dispatcher
    import tamrun.pipeline as pipeline
    import tamrun.solve.assembly as assembly
    import tamrun.solve.cg as cg
    from tamrun.effects.design import AdditiveDesign
    from tamrun.effects.forest import ForestEffect
    from tamrun.effects.indexed import IndexedBlock
    from tamrun.solve.coarse import CoarseCorrection

    return [("data", pipeline, "load_splits"), ("fit", pipeline, "fit_model"), ("features", pipeline, "build_features"),
            ("design fit", AdditiveDesign, "fit"), ("memory plan", pipeline, "plan_memory"),
            ("CG system", assembly.CgSystem, "__init__"), ("design chunks", assembly, "design_chunk"),
            ("rows to leaves", ForestEffect, "leaf_index"), ("CSR indicators", IndexedBlock, "indicators"),
            ("two-level sources", assembly, "accumulate_sources"),
            ("grid block inverses", assembly, "grid_block_inverses"),
            ("one-level preconditioner", assembly, "preconditioner"), ("coarse system", assembly, "coarse_correction"),
            ("CG start", assembly.CgSystem, "start"), ("CG solve", dispatcher, "conjugate_gradient"),
            ("A v", assembly.CgSystem, "matvec"), ("sparse Phi v", IndexedBlock, "matvec"),
            ("sparse Phi' u", IndexedBlock, "rmatvec"), ("two-level correction", CoarseCorrection, "a_z"),
            ("two-level correction", CoarseCorrection, "a_z_transposed"),
            ("two-level correction", CoarseCorrection, "solve_coarse"), ("residual summary", cg, "residual_summary")]


@dataclass
class Tally:
    seconds: float = 0.0
    calls: int = 0


class Stopwatch:
    """Wall time of the seams' calls, by (phase, label): the calls inside CG count in the phase ``solve``,
    the others inside the data's load or the fit in ``setup``, the rest (the test year's prediction) in
    ``outside``. Keeps the CG systems built and CG's runs (iterations, CPU time) for the report."""

    def __init__(self) -> None:
        self.tallies: Dict[Tuple[str, str], Tally] = defaultdict(Tally)
        self.phase = OUTSIDE
        self.systems: List[Any] = []
        self.iterations = 0  # CG iterations run, over the chunks
        self.most_iterations = 0  # the most any group needed
        self.cpu_seconds = 0.0  # process CPU time while CG ran (all threads)

    def timed(self, label: str, function: Callable) -> Callable:
        """``function``, its calls' wall time added to the tally of ``label`` in the current phase."""
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                tally = self.tallies[self.phase, label]
                tally.seconds += time.perf_counter() - began
                tally.calls += 1
        return wrapper

    def solver(self, function: Callable) -> Callable:
        """CG (``conjugate_gradient``): its calls in the phase ``solve``, M^-1 timed, its iterations kept."""
        def wrapper(matvec: Callable, b: Any, precondition: Optional[Callable], *args: Any, **kwargs: Any) -> Any:
            self.phase, cpu = SOLVE, time.process_time()
            try:
                timed = self.timed("M^-1", precondition) if precondition is not None else None
                result = function(matvec, b, timed, *args, **kwargs)
            finally:
                self.phase, self.cpu_seconds = SETUP, self.cpu_seconds + time.process_time() - cpu  # CG runs in the fit
            self.iterations += len(result.history) - 1
            self.most_iterations = max(self.most_iterations, int(result.iterations.max()))
            return result
        return self.timed("CG solve", wrapper)

    def top(self, label: str, function: Callable) -> Callable:
        """A top-level part (the data, the fit): its calls and theirs counted, the rest of the process not."""
        timed = self.timed(label, function)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.phase = SETUP
            try:
                return timed(*args, **kwargs)
            finally:
                self.phase = OUTSIDE
        return wrapper

    def wrapped(self, label: str, function: Callable) -> Callable:
        """The wrapper of the seam ``label``'s ``function``."""
        if label == "CG solve":
            return self.solver(function)
        if label in ("data", "fit"):
            return self.top(label, function)
        timed = self.timed(label, function)
        if label != "CG system":
            return timed

        @functools.wraps(function)
        def kept(system: Any, *args: Any, **kwargs: Any) -> None:  # the system, for its bytes
            timed(system, *args, **kwargs)
            self.systems.append(system)
        return kept

    def installed(self, points: List[Tuple[str, Any, str]]) -> "Installed":
        """The stopwatch's wrappers in place of ``points``' functions while a ``with`` block runs."""
        return Installed(self, points)


class Installed:
    """The stopwatch's wrappers in place of the seams' functions while the block runs; the originals back after."""

    def __init__(self, stopwatch: Stopwatch, points: List[Tuple[str, Any, str]]) -> None:
        self.stopwatch, self.points = stopwatch, points
        self.originals: List[Tuple[Any, str, Any]] = []

    def __enter__(self) -> Stopwatch:
        try:
            for label, owner, name in self.points:
                original = vars(owner)[name]  # defined on the owner itself, so that it can be put back
                self.originals.append((owner, name, original))
                setattr(owner, name, self.stopwatch.wrapped(label, original))
        except BaseException:
            self.__exit__()
            raise
        return self.stopwatch

    def __exit__(self, *exc: Any) -> None:
        for owner, name, original in reversed(self.originals):
            setattr(owner, name, original)


def csr_bytes(matrix: Any) -> Tuple[int, int]:
    """(index bytes: row pointers and column indices, value bytes) of a CSR matrix."""
    index = sum(part.numel() * part.element_size() for part in (matrix.crow_indices(), matrix.col_indices()))
    return index, matrix.values().numel() * matrix.values().element_size()


def sparse_bytes(systems: List[Any]) -> Optional[Dict[str, int]]:
    """Bytes one A v moves through the sparse products of the kept design chunks (the module docstring):
    ``least`` (every array once), ``most`` (every gathered row from memory), and of them the CSR arrays'
    ``index`` and ``values`` bytes; None when CG kept no chunk (W Phi rebuilt at each product: the estimate
    would leave the rebuilding out)."""
    out = dict.fromkeys(("least", "most", "index", "values"), 0)
    for system in systems:
        if system.cached is None:
            return None
        for chunk in system.cached:
            for _, block in chunk.indexed:
                for matrix in block.indicators(chunk.dense.dtype):  # kept by `prepare`: no new work
                    index, values = csr_bytes(matrix)
                    out["index"], out["values"] = out["index"] + index, out["values"] + values
                g, n, slots = block.shape
                item, q = chunk.dense.element_size(), block.q
                grid, rows, gathered = g * block.n_rows_grid * q * item, g * n * q * item, g * n * slots * q * item
                # O V: V read, the picked rows written, read and times the row values, the sums written;
                # O' u: the values times u written, that source read, the grid written
                vectors = 7 * rows + 2 * g * n * item
                out["least"] += vectors + 2 * grid + rows
                out["most"] += vectors + grid + 2 * gathered
    out["least"] += out["index"] + out["values"]
    out["most"] += out["index"] + out["values"]
    return out


def copy_bandwidth(mebibytes: int, repeats: int = COPY_REPEATS) -> float:
    """GB/s of the fastest of ``repeats`` copies of ``mebibytes`` MiB of float64 with torch's threads, read +
    write counted (a cache's write-allocate read is not)."""
    import torch

    source = torch.ones(mebibytes * 2**20 // 8, dtype=torch.float64)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - began)
    return 2 * source.nbytes / best / 1e9


def child(args: argparse.Namespace) -> Dict[str, Any]:
    """The profiled fit of one preset in this (fresh) process: `tamrun.bench.child`'s bare fit with the
    stopwatch installed, then the copy bandwidth. Its threads wait as a command's would (the load measured
    before torch loads, `tamrun.machine.threads.apply_wait_policy`), not as the benchmark's child's (idle)."""
    from tamrun.machine.threads import LOAD_WINDOW_S, CpuClock, apply_wait_policy

    clock = CpuClock.read()  # as ``python -m tamrun``: the load before torch loads chooses how its threads wait
    time.sleep(LOAD_WINDOW_S)
    wait = apply_wait_policy(clock)
    from tamrun.bench.child import PeakMeter, parse_arguments, run_tamrun

    import torch

    fit_args = parse_arguments(["--side", "tamrun", "--bare", "--model", args.model,
                                *[f"--override={item}" for item in args.override]])
    meter = PeakMeter(fit_args.device)
    with Stopwatch().installed(seams()) as stopwatch:
        record = run_tamrun(fit_args, meter)
    tallies = [[phase, label, tally.seconds, tally.calls] for (phase, label), tally in stopwatch.tallies.items()
               if phase != OUTSIDE]
    record.update(status="ok", peak_bytes=meter.peak_above_baseline(), tallies=tallies, iterations=stopwatch.iterations,
                  most_iterations=stopwatch.most_iterations,
                  cg_cpu_seconds=stopwatch.cpu_seconds, sparse_bytes=sparse_bytes(stopwatch.systems),
                  threads=torch.get_num_threads(), interop_threads=torch.get_num_interop_threads(), wait_policy=wait,
                  copy_gb_s=copy_bandwidth(args.copy_mib), copy_mib=args.copy_mib)
    return record


def measured(record: Dict[str, Any]) -> Dict[str, Tuple[float, int]]:
    """(seconds, calls) of each report row's label in its phase (`ROWS`), for the labels the fit called."""
    tallies = {(phase, label): (seconds, calls) for phase, label, seconds, calls in record.get("tallies", [])}
    return {label: tallies[phase, label] for label, _, phase, _ in ROWS if (phase, label) in tallies}


def tree_rows(record: Dict[str, Any]) -> List[Tuple[int, str, str, float, int]]:
    """(depth, label, what it is, seconds, calls) in the report's order: each part under its parent, and
    after a parent's parts "the rest" (its time less theirs; calls 0)."""
    times = measured(record)
    notes = {label: note for label, _, _, note in ROWS}
    children: Dict[Optional[str], List[str]] = defaultdict(list)
    for label, parent, _, _ in ROWS:
        if label in times:
            children[parent].append(label)
    out: List[Tuple[int, str, str, float, int]] = []

    def visit(label: str, depth: int) -> None:
        out.append((depth, label, notes[label], *times[label]))
        for part in children[label]:
            visit(part, depth + 1)
        if children[label] and label in REST:
            rest = times[label][0] - sum(times[part][0] for part in children[label])
            out.append((depth + 1, "the rest", REST[label], rest, 0))

    for top in children[None]:
        visit(top, 0)
    return out


def per_iteration(record: Dict[str, Any], seconds: float) -> str:
    """``seconds`` as milliseconds per CG iteration run, or a dash without iterations."""
    return f"{1000 * seconds / record['iterations']:.2f}" if record.get("iterations") else "—"


def preset_table(model: str, record: Dict[str, Any]) -> List[str]:
    """One preset's section: its parts' table and the lines on its threads and bytes."""
    if record.get("status") != "ok":
        outcome = f"{record.get('status')} {record.get('error_kind', '')} {record.get('error', '')}".rstrip()
        return [f"### {model}: {outcome}", ""]
    fit = measured(record)["fit"][0]
    solve_labels = {label for label, _, phase, _ in ROWS if phase == SOLVE} | {"CG solve"}
    lines = [f"### {model}: fit {fit:.2f} s, route {record['route']}, D = {record['width']:,}, "
             f"{record.get('iterations', 0)} CG iterations run (the most a group needed: "
             f"{record.get('most_iterations', 0)}), peak memory above the loaded data "
             f"{record['peak_bytes'] / 2**20:.0f} MiB (the fit and the test year's prediction)", "",
             "| part | what it is | calls | s | share of the fit | ms per CG iteration |", "|---|---|---|---|---|---|"]
    solving = False
    for depth, label, note, seconds, calls in tree_rows(record):
        solving = label in solve_labels or (solving and label == "the rest" and depth > 1)
        share = "—" if label == "data" else f"{100 * seconds / fit:.1f} %"
        lines.append(f"| {'· ' * depth}{label} | {note} | {calls or ''} | {seconds:.3f} | {share} | "
                     f"{per_iteration(record, seconds) if solving else ''} |")
    return lines + [""] + detail_lines(record)


def detail_lines(record: Dict[str, Any]) -> List[str]:
    """The threads and the sparse products' bytes against the copy bandwidth (estimates named as such)."""
    times = measured(record)
    cg_wall = times.get("CG solve", (0.0, 0))[0]
    lines = [f"- threads: torch intra-op {record['threads']}, inter-op {record['interop_threads']}; OpenMP wait: "
             f"{record['wait_policy']}; CPU s per wall s while CG ran: "
             + (f"{record['cg_cpu_seconds'] / cg_wall:.2f}" if cg_wall else "—") + " (measured; spinning counts)"]
    sparse = sum(times.get(label, (0.0, 0))[0] for label in ("sparse Phi v", "sparse Phi' u"))
    moved = record.get("sparse_bytes")
    if moved and record.get("iterations") and sparse:
        least, most = moved["least"], moved["most"]
        seconds = sparse / record["iterations"]
        lines.append(f"- sparse products per A v: {least / 1e6:.1f} MB moved at least, {most / 1e6:.1f} MB if every "
                     f"gathered row came from memory (estimates; of them the CSR arrays of O and O': "
                     f"{moved['index'] / 1e6:.1f} MB of indices, {moved['values'] / 1e6:.1f} MB of values, all ones); "
                     f"{1000 * seconds:.2f} ms measured: {least / seconds / 1e9:.1f}-{most / seconds / 1e9:.1f} GB/s "
                     f"(estimate) against the copy's {record['copy_gb_s']:.1f} GB/s (measured, {record['copy_mib']} "
                     f"MiB, best of {COPY_REPEATS})")
    else:
        lines.append(f"- copy bandwidth: {record['copy_gb_s']:.1f} GB/s (measured, {record['copy_mib']} MiB, best of "
                     f"{COPY_REPEATS}); no sparse products kept between CG's products to estimate")
    return lines + [""]


def summary_table(records: Dict[str, Dict[str, Any]]) -> List[str]:
    """One row per preset: the fit, its setup and solve, the iteration and its sparse share, the bandwidths."""
    lines = ["| preset | fit s | setup s | CG iterations | ms per iteration | sparse products' share | "
             "sparse GB/s (estimate) | copy GB/s | CPU s per wall s in CG |", "|---|---|---|---|---|---|---|---|---|"]
    for model, record in records.items():
        if record.get("status") != "ok":
            lines.append(f"| {model} | {record.get('status')} |  |  |  |  |  |  |  |")
            continue
        times = measured(record)
        fit, solve = times["fit"][0], times.get("CG solve", (0.0, 0))[0]
        sparse = sum(times.get(label, (0.0, 0))[0] for label in ("sparse Phi v", "sparse Phi' u"))
        its, moved = record.get("iterations") or 0, record.get("sparse_bytes")
        rate = (f"{moved['least'] * its / sparse / 1e9:.1f}-{moved['most'] * its / sparse / 1e9:.1f}"
                 if moved and its and sparse else "—")
        share = f"{100 * sparse / solve:.0f} %" if solve else "—"
        busy = f"{record['cg_cpu_seconds'] / solve:.2f}" if solve else "—"
        lines.append(f"| {model} | {fit:.2f} | {fit - solve:.2f} | {its} | {per_iteration(record, solve)} | {share} | "
                     f"{rate} | {record['copy_gb_s']:.1f} | {busy} |")
    return lines + [""]


def report(records: Dict[str, Dict[str, Any]], header: Dict[str, str]) -> str:
    """The markdown report: the machine and command, the summary, then each preset's parts."""
    lines = ["## Where a CG fit's CPU time goes (`python -m tamrun.bench.cpu_profile`)", "", *header_lines(header), "",
             *summary_table(records)]
    for model, record in records.items():
        lines += preset_table(model, record)
    lines.append("Measured: wall seconds of each part (the timed calls), CG iterations, threads, CPU seconds, the "
                 "copy bandwidth. Estimates: the sparse products' bytes and their GB/s (the module docstring of "
                 "tamrun/bench/cpu_profile.py). \"the rest\": the parent's time less its timed parts.")
    return "\n".join(lines) + "\n"


def parse_arguments(argv: Optional[List[str]]) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m tamrun.bench.cpu_profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", help="a preset (repeatable; default forest and forest_fourier)")
    parser.add_argument("--override", action="append", default=[], help="a tamrun override for every preset")
    parser.add_argument("--copy-mib", type=int, default=256, help="MiB of the copy that measures the bandwidth")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per preset's fit")
    parser.add_argument("--out", default="outputs/bench")
    parser.add_argument("--child", action="store_true", help="profile one --model in this process (internal)")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_arguments(argv)
    models = args.model or ["forest", "forest_fourier"]
    if args.child:
        args.model = models[0]
        sys.stdout.write(RESULT_PREFIX + json.dumps(child(args)) + "\n")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    header = {"command": "`python -m tamrun.bench.cpu_profile " + " ".join(argv if argv is not None else sys.argv[1:])
              + "`", "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"), **machine_info()}
    header.pop("load average at start", None)  # all three, as uptime shows them
    header["load average (1, 5, 15 min) at start"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    records = {}
    for model in models:
        command = [sys.executable, "-m", "tamrun.bench.cpu_profile", "--child", "--model", model,
                   f"--copy-mib={args.copy_mib}", *[f"--override={item}" for item in args.override]]
        records[model] = run_child(command, args.timeout)
        log.info("%s: %s", model, records[model].get("status"))
    stem = write_report(args.out, "cpu-profile", header, records, report(records, header))
    log.info("wrote %s.json and .md", stem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
