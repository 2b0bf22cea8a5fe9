"""The benchmark's summary, ratio and table code on recorded JSON (the peer is never needed here)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tamrun.bench.child import RESULT_PREFIX
from tamrun.bench.formula import peer_formula
from tamrun.bench.report import markdown, ratios, summarise
from tamrun.config.load import typed_config

from conftest import csv_overrides

RECORDED = json.loads((Path(__file__).parent / "data" / "bench_records.json").read_text())


def test_summaries_take_medians_and_ranges_of_successful_runs():
    summaries = {(s.model, s.side): s for s in summarise(RECORDED["records"])}
    ours = summaries[("fourier", "tamrun")]
    assert (ours.fit.median, ours.fit.low, ours.fit.high) == pytest.approx((0.20, 0.10, 0.30))
    assert ours.peak.median == 104857600 and ours.outcome == "3/3 ok"
    peer_ff = summaries[("forest_fourier", "peer")]
    assert peer_ff.ok == 1 and peer_ff.fit.median == 800.0
    assert "timeout after 900 s" in peer_ff.outcome and "error: TypeError" in peer_ff.outcome
    assert peer_ff.cg_max_iter == 30


def test_ratios_are_peer_over_tamrun_medians():
    by_model = {r.model: r for r in ratios(summarise(RECORDED["records"]))}
    assert by_model["fourier"].speedup == pytest.approx(0.70 / 0.20)
    assert by_model["fourier"].memory == pytest.approx(314572800 / 104857600)
    assert by_model["fourier"].rmse_difference == pytest.approx(1655.2 - 1659.2)
    assert by_model["forest_fourier"].speedup == pytest.approx(800.0 / 21.0)


def test_markdown_table_shows_the_figures_and_the_outcomes():
    text = markdown(RECORDED["records"], RECORDED["header"])
    assert "| fourier | tamrun | direct | 0.20 (0.10–0.30) |" in text
    assert "| fourier | 3.50× | 3.00× | -4.0 |" in text
    assert "timeout after 900 s" in text and "max_iter capped at 30" in text
    assert "`python -m tamrun.bench --peer-python ../peer-venv/bin/python`" in text


def test_a_baseline_checkout_gets_its_own_ratio_table():
    """--baseline: the same tamrun records relabelled as another checkout's, twice as slow."""
    baseline = [{**r, "side": "baseline", "fit_seconds": 2 * r["fit_seconds"]}
                for r in RECORDED["records"] if r["side"] == "tamrun" and r["status"] == "ok"]
    records = RECORDED["records"] + baseline
    by_model = {r.model: r for r in ratios(summarise(records), "baseline")}
    assert by_model["fourier"].speedup == pytest.approx(2.0) and by_model["fourier"].rmse_difference == 0.0
    text = markdown(records, RECORDED["header"])
    assert "| model | fit speed-up (baseline / tamrun) |" in text and "| fourier | 2.00× | 1.00× | +0.0 |" in text
    assert "| fourier | 3.50× | 3.00× | -4.0 |" in text  # the peer's table is still there


def test_peer_formula_is_the_preset(compose_cfg):
    config, specs = typed_config(compose_cfg("model=spline"))
    assert peer_formula(config.data.target, specs) == (
        "Load ~ l(Load_d1, ap=-30) + s(temperature_smooth_950, k=20, deg=3, p=2, ap=-5) + "
        "s(temperature_max_smooth_990, k=20, deg=3, p=2, ap=-5) + s(temperature_min_smooth_950, k=20, deg=3, p=2, ap=-5) + "
        "s(toy, k=20, deg=3, p=2, ap=-5) + c(day_type_week_sat_sun, topo='nominal', ap=-5) + "
        "c(day_type_week, topo='nominal', ap=-5) + l(trend, ap=-5)")


@pytest.mark.parametrize("bare", [False, True], ids=["the run's path", "bare"])
def test_child_reports_one_result_line(tmp_path, capsys, bare):
    """The run's path (what ``python -m tamrun`` runs: phases, meter) and the bare fit give one record
    each, with the same forecast."""
    from tamrun.bench.child import main

    assert main(["--side", "tamrun", "--model", "fourier", *(["--bare"] if bare else [])]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(RESULT_PREFIX)]
    assert len(lines) == 1
    record = json.loads(lines[0][len(RESULT_PREFIX):])
    assert record["status"] == "ok" and record["route"] == "direct"
    assert record["rmse"] == pytest.approx(1655.243238867027, rel=1e-9)  # the run's rmse_test either way
    assert record["fit_seconds"] > 0 and record["peak_bytes"] > 0


def test_the_table_shows_the_bare_fit_beside_the_runs_fit():
    """tamrun's fit column is the run's (its phases, the meter); the bare fit is the second column."""
    records = [{**r, "bare_fit_seconds": r["fit_seconds"] / 2} if r["side"] == "tamrun" else r
               for r in RECORDED["records"]]
    text = markdown(records, RECORDED["header"])
    assert "| fit s median (min–max) | bare fit s |" in text
    assert "| fourier | tamrun | direct | 0.20 (0.10–0.30) | 0.10 |" in text
    assert "| fourier | peer | direct | 0.70 (0.50–0.90) | – |" in text


def test_adaptive_benchmark_rows_agree_with_the_batched_run(capsys):
    """python -m tamrun.bench.adaptive on five daily refits: four rows, the same RMSE on each, the
    one-window and capped runs within 1e-12 of the batched one (the same Grams; only the batched
    solves' rounding may differ), the loop of static fits within 1e-9."""
    from tamrun.bench.adaptive import main

    assert main(["--windows", "730", "--test-end", "2024-01-05"]) == 0
    table = capsys.readouterr().out.strip().splitlines()
    rows = [line.split("|")[1:-1] for line in table[-4:]]
    assert [r[2].strip() for r in rows][:3] == ["batched", "one window", "loop of static fits"]
    assert rows[0][4].strip() == "5 × 48" and rows[1][4].strip() == "1 × 48"
    assert len({r[10] for r in rows}) == 1  # RMSE adaptive
    assert float(rows[1][12]) <= 1e-12 and float(rows[3][12]) <= 1e-12 and float(rows[2][12]) <= 1e-9


def test_a_baseline_child_imports_the_baseline_checkout_not_the_folder_it_was_started_from(tmp_path, monkeypatch):
    """`python -m` puts the working folder before PYTHONPATH: run from this repository's root, a
    baseline child used to import this tamrun. A stand-in checkout whose child reports the file
    it was imported from, run as the baseline side is (its PYTHONPATH, inside it), from the root."""
    import os
    import sys

    from tamrun.bench.__main__ import run_child

    child = tmp_path / "checkout" / "tamrun" / "bench"
    child.mkdir(parents=True)
    (child.parent / "__init__.py").write_text("")
    (child / "__init__.py").write_text("")
    (child / "child.py").write_text(f"import json\nprint({RESULT_PREFIX!r} + json.dumps({{'status': 'ok', 'file': __file__}}))\n")
    checkout = str(tmp_path / "checkout")
    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # the repository root: it holds a tamrun/ too
    record = run_child([sys.executable, "-m", "tamrun.bench.child"], 60, {**os.environ, "PYTHONPATH": checkout},
                       checkout)
    assert record["status"] == "ok" and Path(record["file"]).resolve().is_relative_to(Path(checkout).resolve())


def ratio_of_rounded(ratio: float, top: float, bottom: float, half: float = 0.0005,
                     half_ratio: float = 0.0005) -> bool:
    """Whether a printed ratio is that of two printed times: the times' exact values lie within ``half`` of
    the printed ones (a fit of 0.015 s printed to the ms is 3 % uncertain), the ratio's within ``half_ratio``."""
    low, high = (top - half) / (bottom + half), (top + half) / (bottom - half)
    return low - half_ratio <= ratio <= high + half_ratio


def test_the_sweep_benchmark_times_both_launchers_and_reports_their_ratio(csv_path, capsys):
    """`python -m tamrun.bench.sweeps` on a 2-job sweep of the synthetic data, one round (its figures are
    measured on a quiet machine, never asserted: only that both sides ran and the table adds up)."""
    from tamrun.bench.sweeps import main as sweeps_main

    assert sweeps_main(["-r", "1", *csv_overrides(csv_path), "model.effects.sx.ap=-5,-6"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ")]
    assert [cells[0].strip() for cells in rows] == ["round", "1", "median"]
    parallel, serial, ratio = (float(cell) for cell in rows[1][1:])
    assert parallel > 0 and serial > 0 and ratio_of_rounded(ratio, parallel, serial, half=0.05, half_ratio=0.005)
    assert out.startswith("- cpu: ") and "- load average at start: " in out  # the machine comes with the figures


def test_the_whole_commands_time_is_split_into_its_parts(csv_path, capsys):
    """`python -m tamrun.bench.e2e` on the synthetic data, one run: start-up, data, fit, predict and
    recording are each a part of the command's wall time, and together all of it (the figures are
    measured on a quiet machine, never asserted)."""
    from tamrun.bench.e2e import PARTS, main as e2e_main

    overrides = [item for item in csv_overrides(csv_path) if item != "model=custom"]
    assert e2e_main(["--models", "custom", "-r", "1", *overrides]) == 0
    out = capsys.readouterr().out
    assert out.startswith("- cpu: ") and "- command: `python -m tamrun.bench.e2e --models custom" in out
    header, row = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert [cell.strip() for cell in header[3:3 + len(PARTS)]] == [f"{part} s (share)" for part in PARTS]
    wall = float(row[2])
    seconds = [float(cell.split()[0]) for cell in row[3:3 + len(PARTS)]]
    assert row[:2] == [" custom ", " this "] and all(s > 0 for s in seconds)
    assert sum(seconds) == pytest.approx(wall, abs=0.05)  # the table rounds each part


def test_the_meter_benchmark_runs_every_variant_and_reports_their_ratios(csv_path, capsys):
    """`python -m tamrun.bench.meter --child`, one round on the synthetic data: the command with the meter
    (the default) and with memory.meter=false, and the benchmark's child; their fits and ratios."""
    from tamrun.bench.meter import main as meter_main

    overrides = [item for item in csv_overrides(csv_path) if item != "model=custom"]
    assert meter_main(["--models", "custom", "-r", "1", "--child", *overrides]) == 0
    out = capsys.readouterr().out
    row = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| custom ")][0]
    on, off, ratio, child, beside = (float(cell.split()[0]) for cell in row[1:6])
    assert on > 0 and off > 0 and child > 0
    assert ratio_of_rounded(ratio, on, off) and ratio_of_rounded(beside, child, on)
    assert "- load average at start: " in out and "| bench child" not in out  # a column, not a row


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
flags\t\t: fpu avx512f

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: Another CPU
"""


def test_the_machine_header_names_the_cpu_family_and_model(tmp_path):
    """Two hosts named "AMD EPYC" differ by their family: the header says which (from the first processor)."""
    from tamrun.bench.machine import cpu_description, header_lines

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPUINFO)
    assert cpu_description(str(cpuinfo)) == "AMD EPYC (family 26, model 2)"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\n")  # no family: the name alone
    assert cpu_description(str(cpuinfo)) == "Some CPU"
    assert cpu_description(str(tmp_path / "missing")) != ""  # not Linux: the platform's name
    assert header_lines({"cpu": "x", "load average at start": "0.50"}) == ["- cpu: x", "- load average at start: 0.50"]


# A Sapphire Rapids Xeon's first processor (flags abridged to those around the vector extensions).
INTEL_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2 ssse3 fma cx16 sse4_1 sse4_2 avx f16c avx2 avx512f avx512dq avx512cd avx512bw avx512vl \
avx512_bf16 avx512_vnni avx512_fp16 amx_bf16 amx_tile amx_int8

processor\t: 1
flags\t\t: fpu sse
"""


def test_the_machine_header_names_the_vector_extensions(tmp_path):
    """The header carries the CPU's vector extensions, in `VECTOR_EXTENSIONS`' order whatever the flags'
    order, only those present, and torch's own view of them (issue 63: the same code is 72 times the peer
    on one host, 25 times on another)."""
    import torch

    from tamrun.bench.machine import VECTOR_EXTENSIONS, machine_info, vector_description, vector_extensions

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(INTEL_CPUINFO)
    assert vector_extensions(str(cpuinfo)) == ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512dq", "avx512bw",
                                               "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
                                               "amx_bf16", "amx_int8")  # avx512cd, f16c: not in the tuple
    cpuinfo.write_text("processor\t: 0\nFeatures\t: fp asimd sve\n")  # an Arm host names them "Features"
    assert vector_extensions(str(cpuinfo)) == ("asimd", "sve")
    assert vector_extensions(str(tmp_path / "missing")) == ()
    assert vector_description(str(tmp_path / "missing")).startswith("none named (torch: ")
    # this host: its own flags line, read here independently
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    flags = next((line.split(":", 1)[1].split() for line in lines
                  if line.split(":")[0].strip() in ("flags", "Features")), [])
    assert vector_extensions() == tuple(name for name in VECTOR_EXTENSIONS if name in flags)
    described = machine_info()["vector extensions"]
    assert described.endswith(f"(torch: {torch.backends.cpu.get_cpu_capability()})")
    assert all(name in described.split() for name in vector_extensions())


def test_the_machine_header_names_threads_per_core_and_caches(tmp_path):
    """Two logical cores may be one core's two hyperthreads: the header says so, with the caches from level 2
    up (unified or data) and how many CPUs share each, read from a sysfs tree; this host's own line is read
    back from its sysfs independently."""
    from tamrun.bench.machine import cpu_list_size, machine_info, topology_description

    assert [cpu_list_size(text) for text in ("0", "0-1", "0-3,6", "0,2,4-5\n", "")] == [1, 2, 5, 4, 0]
    cpu0 = tmp_path / "cpu0"
    (cpu0 / "topology").mkdir(parents=True)
    (cpu0 / "topology" / "thread_siblings_list").write_text("0,1\n")
    for index, (level, kind, size, shared) in enumerate([("1", "Data", "48K", "0-1"), ("1", "Instruction", "32K", "0-1"),
                                                         ("2", "Unified", "2048K", "0-1"),
                                                         ("3", "Unified", "107520K", "0-1")]):
        folder = cpu0 / "cache" / f"index{index}"
        folder.mkdir(parents=True)
        for name, text in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (folder / name).write_text(text + "\n")
    assert topology_description(str(tmp_path)) == "2 threads per core; L2 2048K per 2 CPUs, L3 107520K per 2 CPUs"
    assert topology_description(str(tmp_path / "missing")) == "unknown"
    here = Path("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list")
    if here.exists():  # Linux: the first part is this host's own sibling count
        threads = cpu_list_size(here.read_text())
        assert machine_info()["cores and caches"].startswith(f"{threads} thread")


def test_torch_capability_comes_from_a_fresh_python_when_torch_is_not_loaded():
    """A benchmark's own process stays lean: without torch loaded, the capability comes from a child python."""
    import subprocess
    import sys

    import torch

    code = ("import sys; from tamrun.bench.machine import torch_capability; "
            "print(torch_capability(), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == [torch.backends.cpu.get_cpu_capability(), "False"]


def profile_rows(section: str):
    """(depth, label, seconds) of a preset's parts table in the profile's markdown."""
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if len(cells) == 6 and re.fullmatch(r"-?\d+\.\d+", cells[3]):  # a negative part would show
            label = cells[0]
            depth = 0
            while label.startswith("· "):
                depth, label = depth + 1, label[2:]
            rows.append((depth, label, float(cells[3])))
    return rows


def test_cpu_profile_splits_a_forest_fit_into_parts_that_add_up(csv_path, tmp_path, capsys):
    """`python -m tamrun.bench.cpu_profile` on a tiny forest fitted by two-level CG: the summary row, the parts'
    table (every part non-negative, each parent's parts within it), the threads and the bytes (named
    estimates) against a measured copy bandwidth, and the JSON beside it. No figure is compared with a time."""
    from tamrun.bench.cpu_profile import main as profile_main

    overrides = [item for item in csv_overrides(csv_path) if item != "model=custom" and "sx" not in item]
    overrides += ["+model.effects.fx={kind: forest, column: x, others: [dow], n_trees: 4, max_depth: 3, ap: -3}",
                  "solver.name=cg"]
    out = tmp_path / "out"
    assert profile_main(["--model", "custom", "--copy-mib", "4", "--out", str(out),
                         *[f"--override={item}" for item in overrides]]) == 0
    text = capsys.readouterr().out
    assert "- vector extensions: " in text and "- load average (1, 5, 15 min) at start: " in text
    summary = next(line for line in text.splitlines() if line.startswith("| custom |"))
    assert len(summary.split("|")) == 11 and float(summary.split("|")[2]) > 0  # the fit's seconds, not an outcome
    section = text.split("### custom: ", 1)[1]
    assert section.startswith("fit ") and "route cg" in section.splitlines()[0]
    rows = profile_rows(section)
    labels = [label for _, label, _ in rows]
    for part in ("data", "fit", "rows to leaves", "CSR indicators", "two-level sources", "CG solve", "A v",
                 "sparse Phi v", "sparse Phi' u", "M^-1", "two-level correction", "the rest"):
        assert part in labels, part
    assert all(seconds >= 0 for _, _, seconds in rows), rows
    fit = next(seconds for _, label, seconds in rows if label == "fit")
    for index, (depth, label, seconds) in enumerate(rows):  # a parent's direct parts add up to at most it
        parts = []
        for later_depth, _, later_seconds in rows[index + 1:]:
            if later_depth <= depth:
                break
            if later_depth == depth + 1:
                parts.append(later_seconds)
        assert sum(parts) <= seconds + 0.0015 * len(parts), (label, seconds, parts)  # the table rounds to ms
    assert sum(seconds for depth, label, seconds in rows if depth == 1) <= fit + 0.01
    assert "GB/s (estimate) against the copy's" in section and "(measured, 4 MiB" in section
    assert "torch intra-op " in section and "CPU s per wall s while CG ran: " in section
    saved = json.loads(next(out.glob("cpu-profile-*.json")).read_text())
    record = saved["records"]["custom"]
    assert record["status"] == "ok" and record["iterations"] > 0 and record["copy_gb_s"] > 0
    moved = record["sparse_bytes"]
    assert 0 < moved["index"] + moved["values"] < moved["least"] <= moved["most"]
