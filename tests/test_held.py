"""Runs held while the store did not answer, written once it does (`tamrun.tracking.sweep_record.held`, `held_spool`,
`sweep_end`), on a real sqlite store in tmp_path, without servers: a job refused before its run (a FAILED
run created), a run left open by a store lost mid-run (ended FAILED), a job that started and left nothing
(``UNRECORDED`` in the summary), the sweep's end held and written by the next run that opens the store, and
the claim that keeps two processes from writing one folder twice. The same with a real tracking server
killed and restarted: tests/test_team_cluster.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tamrun.config.schema import TrackingConfig
from tamrun.errors import ConfigError
from tamrun.tracking.sweep_record.held import SWEEP_END, held_runs
from tamrun.tracking.sweep_record.held_spool import claim, upload_claimed
from tamrun.tracking.mlflow_run import TrackedRun
from tamrun.tracking.store.store import open_client
from tamrun.sweeps.sweep import hold_open_run, record_failed_job
from tamrun.sweeps.sweep_end import HeldEnd, end_sweep, held_line
from tamrun.tracking.sweep_record.sweep_files import SWEEP_ENV, held_folder, mark_started, sweep_home, write_sweep_file

REFUSED = ConfigError("tracking.uri", "http://127.0.0.1:9", "the tracking server 127.0.0.1:9 does not answer",
                      "start it")
AWAY = OmegaConf.create({"tracking": {"uri": "http://127.0.0.1:9", "connect_timeout_s": 1.0}})  # the job's store


@pytest.fixture
def sweep(tmp_path, monkeypatch):
    """A sweep's file in tmp_path/sweep over a sqlite store with a parent run, this process as its launcher:
    (client, sweep file's info with the real URI)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = open_client(uri, 30.0, 30.0)
    experiment = client.create_experiment("held")
    parent = client.create_run(experiment, run_name="sweep-s1", tags={"sweep_id": "s1"}).info.run_id
    info = {"sweep_id": "s1", "sweep_dir": str(tmp_path / "sweep"), "parent_run_id": parent,
            "experiment_id": experiment, "tracking_uri": uri, "busy_timeout_s": 30.0, "lock_timeout_s": 30.0,
            "connect_timeout_s": 5.0, "objective": "rmse_test", "swept": {"model.effects.sx.k": "k"},
            "numbered": False}
    write_sweep_file(info["sweep_dir"], info)
    monkeypatch.setenv(SWEEP_ENV, "s1")
    return client, info


def job_tags(info, job):
    return {"sweep_id": "s1", "sweep_job": str(job), "mlflow.parentRunId": info["parent_run_id"],
            "sweep_overrides": f"model.effects.sx.k={6 + 2 * job}"}


def job_runs(client, info):
    runs = client.search_runs([info["experiment_id"]], filter_string="tags.sweep_id = 's1'")
    return {int(r.data.tags["sweep_job"]): r for r in runs if r.info.run_id != info["parent_run_id"]}


def job_0_done_job_1_refused(client, info, started: int) -> None:
    """``started`` jobs started; job 0 FINISHED; job 1 refused by an unreachable store (held)."""
    for job in range(started):
        mark_started(info["sweep_dir"], job, [f"model.effects.sx.k={6 + 2 * job}"])
    done = client.create_run(info["experiment_id"], run_name="k=6", tags=job_tags(info, 0)).info.run_id
    client.set_terminated(done, status="FINISHED")
    record_failed_job(AWAY, job_tags(info, 1), REFUSED, "k=8", sweep_dir=info["sweep_dir"])


def test_the_sweep_writes_its_held_jobs_at_its_end_and_lists_every_job_that_started(sweep):
    """Job 0 FINISHED; job 1 refused before its run (the store away: held); job 2's run left RUNNING by a
    store lost mid-run (its end held); job 3 started and left nothing. At the end, the store back: one
    run per job, the parent FAILED naming jobs 1, 2 and 3."""
    client, info = sweep
    job_0_done_job_1_refused(client, info, started=4)
    cut = client.create_run(info["experiment_id"], run_name="k=10", tags=job_tags(info, 2)).info.run_id
    lost = ConfigError("tracking.uri", "http://x", f"the store stopped answering during run {cut}", "run again")
    lost.run_id, lost.run_open = cut, True
    hold_open_run(info["sweep_dir"], job_tags(info, 2), lost, "k=10")
    folder = held_folder(sweep_home(info["sweep_dir"], "s1"))
    assert sorted(record.job for _, record in held_runs(folder)) == [1, 2]

    table = end_sweep(info, Path(info["sweep_dir"]) / "spool")
    assert table["status"].tolist() == ["FINISHED", "FAILED", "FAILED", "UNRECORDED"]
    runs = job_runs(client, info)
    assert runs[1].data.tags["error"].startswith("tracking.uri='http://127.0.0.1:9'") and "tamrun.held" in runs[1].data.tags
    assert runs[1].data.tags["mlflow.parentRunId"] == info["parent_run_id"] and runs[1].info.run_name == "k=8"
    assert runs[2].info.run_id == cut and runs[2].data.tags["error"].startswith("tracking.uri='http://x'")
    parent = client.get_run(info["parent_run_id"])
    assert parent.info.status == "FAILED" and parent.data.tags["sweep_failed_jobs"] == "3 of 4 (job(s) 1, 2, 3)"
    assert not folder.exists()


def test_a_sweep_end_the_store_did_not_take_is_written_by_the_next_run_on_it(sweep, tmp_path):
    """The store away at the sweep's end too: the end held beside job 1's record and listed in the spool;
    the last line names the folder; the next run that opens the store writes job 1 and closes the parent
    with its summary, and the spool is empty again."""
    client, info = sweep
    job_0_done_job_1_refused(client, info, started=2)
    spool = tmp_path / "spool"
    ended = end_sweep({**info, "tracking_uri": "http://127.0.0.1:9", "connect_timeout_s": 1.0}, spool)
    assert isinstance(ended, HeldEnd) and ended.started == 2 and [f.job for f in ended.failures] == [1]
    folder = held_folder(sweep_home(info["sweep_dir"], "s1"))
    assert held_line(ended, "http://127.0.0.1:9", info["parent_run_id"]) == (
        f"tamrun: the store http://127.0.0.1:9 did not answer at the sweep's end ({ended.reason}): 1 of 2 sweep "
        f"job(s) held too (job 1: config error ConfigError); they and the summary of parent run "
        f"{info['parent_run_id']} are held in {folder}, and the next run on that store writes them\n")
    assert (folder / SWEEP_END).exists()
    (entry,) = spool.glob("*.json")
    # listed for the store it was held for: here the sqlite store the sweep really used
    entry.write_text(json.dumps({**json.loads(entry.read_text()), "store": info["tracking_uri"]}))

    TrackedRun(TrackingConfig(uri=info["tracking_uri"], experiment="next", held_dir=str(spool)), "next", {}) \
        .start_detached()
    assert not folder.exists() and not list(spool.glob("*.json"))
    parent = client.get_run(info["parent_run_id"])
    assert parent.info.status == "FAILED" and parent.data.tags["sweep_failed_jobs"] == "1 of 2 (job(s) 1)"
    assert [r.info.status for _, r in sorted(job_runs(client, info).items())] == ["FINISHED", "FAILED"]


def test_a_folder_is_written_once_and_a_dead_claim_is_taken_over(sweep):
    client, info = sweep
    record_failed_job(AWAY, job_tags(info, 1), REFUSED, "k=8", sweep_dir=info["sweep_dir"])
    folder = held_folder(sweep_home(info["sweep_dir"], "s1"))
    # a claim by a process of this host that is gone (its pid ended): taken over, the record written once
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = folder.with_name(f"held.uploading-{socket.gethostname()}-{gone.stdout.strip()}")
    folder.rename(dead)
    assert upload_claimed(client, folder) == 1 and not dead.exists()
    assert upload_claimed(client, folder) == 0  # nothing left
    assert len(job_runs(client, info)) == 1
    # a live process's claim is left alone
    record_failed_job(AWAY, job_tags(info, 1), REFUSED, "k=8", sweep_dir=info["sweep_dir"])
    alive = folder.with_name(f"held.uploading-{socket.gethostname()}-1")  # pid 1 lives
    folder.rename(alive)
    assert claim(folder) is None and alive.exists()
