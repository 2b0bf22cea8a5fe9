"""python -m tamrun.bench.load: its variants, busy processes, tables, and one real invocation (no timing is
asserted: only that each figure is where the report says and the ratios are the figures' own)."""

from __future__ import annotations

import os

import pytest

from tamrun.bench.load import (DEFAULT, VARIANTS, Fits, base_environment, busy_processes, main, parse_arguments,
                               peer_table, settings_of, variant_table)


def test_spin_counts_become_variants_and_an_unknown_variant_is_refused():
    settings = settings_of(parse_arguments(["--spins", "0, 3000", "--variants", f"{DEFAULT},OMP_NUM_THREADS=1"]))
    assert settings.variants == {DEFAULT: {}, "OMP_NUM_THREADS=1": {"OMP_NUM_THREADS": "1"},
                                 "GOMP_SPINCOUNT=0": {"GOMP_SPINCOUNT": "0"},
                                 "GOMP_SPINCOUNT=3000": {"GOMP_SPINCOUNT": "3000"}}
    assert set(settings_of(parse_arguments([])).variants) == set(VARIANTS)
    with pytest.raises(ValueError, match="unknown variant"):
        settings_of(parse_arguments(["--variants", "fast"]))


def test_each_variant_starts_from_an_environment_without_a_policy_of_its_own(monkeypatch):
    """The user's own OMP_* / GOMP_* settings would make every variant the same: they are left out."""
    for name, value in {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "7", "OMP_NUM_THREADS": "1",
                        "TAMRUN_OMP_WAIT": "x", "HYDRA_FULL_ERROR": "1"}.items():
        monkeypatch.setenv(name, value)
    env = base_environment()
    assert not {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "TAMRUN_OMP_WAIT", "HYDRA_FULL_ERROR"} & set(env)
    assert env["PATH"] == os.environ["PATH"]


def test_busy_processes_run_during_the_block_and_are_reaped_after():
    with busy_processes(2) as processes:
        assert len(processes) == 2 and all(process.poll() is None for process in processes)
    assert all(process.returncode is not None for process in processes)
    with busy_processes(0) as none:
        assert none == []


def test_the_tables_give_each_variant_its_ratios():
    """loaded / idle and idle / the preset's best idle variant, from the medians; '>' on a late run."""
    fits = Fits()
    for seconds in (1.0, 1.2, 1.1):
        fits.add("idle", DEFAULT, seconds, False)
    fits.add("idle", "OMP_NUM_THREADS=1", 2.2, False)
    fits.add("loaded", DEFAULT, 2.2, False)
    fits.add("loaded", "OMP_NUM_THREADS=1", 60.0, True)
    fits.peer["idle"].append(3.3)
    fits.peer["loaded"].append(11.0)
    lines = variant_table({"fourier": fits}, busy=2)
    assert lines[0].startswith("| preset | variant | idle fit s | fit s beside 2 busy |")
    assert f"| fourier | {DEFAULT} | 1.10 | 2.20 | 2.00 | 1.000 | 3 |" in lines
    assert "| fourier | OMP_NUM_THREADS=1 | 2.20 | >60.00 | 27.27 | 2.000 | 1 |" in lines
    assert "| fourier | 1.10 | 3.30 | 3.00 | 2.20 | 11.00 | 5.00 |" in peer_table({"fourier": fits})
    assert peer_table({"fourier": Fits()}) == []


def test_one_invocation_measures_idle_and_loaded_fits(capsys):
    """A real run of the benchmark (one preset, one variant, one repeat, one busy process): both conditions
    are measured, and the report names the machine and the command."""
    assert main(["--models", "fourier", "-r", "1", "--busy", "1", "--variants", DEFAULT]) == 0
    out = capsys.readouterr().out
    assert "- cpu: " in out and "`python -m tamrun.bench.load --models fourier -r 1 --busy 1" in out
    row = next(line for line in out.splitlines() if line.startswith(f"| fourier | {DEFAULT} |"))
    idle, loaded, ratio = (float(cell) for cell in row.split("|")[3:6])
    # the printed ratio lies within what the printed figures (to 0.005 s) allow, itself to 0.005
    assert idle > 0.005 and loaded > 0
    assert (loaded - 0.005) / (idle + 0.005) - 0.005 <= ratio <= (loaded + 0.005) / (idle - 0.005) + 0.005
