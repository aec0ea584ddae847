"""How perflab reads what SLURM says of its jobs (squeue, sacct) and what each answer makes of a
point: SLURM's answers are given as text, as the commands print them (the states a real
cluster seldom shows on demand: held, a lagging sacct, squeue down). tests/test_slurm.py runs
the same code against a real cluster."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from perflab.cluster import slurm
from perflab.store.rundir import RunRecord, RunWriter


@dataclass
class Job:
    """What perflab uses of a submitit job."""

    job_id: str
    finished: bool = True
    state: str = "COMPLETED"
    cancelled: bool = False
    paths: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(stderr=Path("/logs/job.err")))

    def cancel(self, check: bool = True) -> None:
        self.cancelled = True

    def done(self) -> bool:
        return self.finished

    def result(self) -> None:
        if not self.finished:
            raise AssertionError("result() of a job that is not done waits for ever")


def point(job_dir: Path, job_id: str = "7", **job) -> slurm.Submission:
    need = slurm.Resources(nodes=1, gpus_per_node=0, cpus_per_task=1, mem_gb=4)
    return slurm.Submission(0, ["trainer.epochs=3"], need, job_dir, Job(job_id, **job))


@pytest.fixture
def answers(monkeypatch):
    """``answers(*outputs)``: what successive SLURM commands print (None: the command failed)."""
    asked: list[list[str]] = []

    def give(*outputs: str | None) -> list[list[str]]:
        replies = list(outputs)

        def query(args: list[str]) -> str | None:
            asked.append(args)
            return replies.pop(0) if len(replies) > 1 else replies[0]

        monkeypatch.setattr(slurm, "query", query)
        return asked

    monkeypatch.setattr(slurm, "POLL_S", 0.0)
    return give


SACCT_REQUEUED = """12|PREEMPTED
12.batch|CANCELLED
12.0|CANCELLED by 0
12|COMPLETED
12.batch|COMPLETED
9_1|OUT_OF_MEMORY
9_1.batch|OUT_OF_MEMORY+
9_[2-4%2]|CANCELLED by 0
"""


def test_sacct_runs_of_a_requeued_job_and_array_tasks_that_never_started():
    runs = slurm.parse_sacct(SACCT_REQUEUED)
    assert runs["12"] == [["PREEMPTED", "CANCELLED", "CANCELLED"], ["COMPLETED", "COMPLETED"]]
    assert runs["9_1"] == [["OUT_OF_MEMORY", "OUT_OF_MEMORY"]]
    assert runs["9_2"] == runs["9_3"] == runs["9_4"] == [["CANCELLED"]]
    assert slurm.array_tasks("5_[1,3-4]") == ["5_1", "5_3", "5_4"] and slurm.array_tasks("5_1") == ["5_1"]


def test_sacct_is_asked_again_while_it_lags_and_a_failed_call_keeps_the_last_answer(answers, monkeypatch):
    asked = answers("12|RUNNING\n", None, "12|RUNNING\n13|COMPLETED\n", "12|COMPLETED\n13|COMPLETED\n")
    assert slurm.histories(["12", "13"]) == {"12": [["COMPLETED"]], "13": [["COMPLETED"]]}
    assert len(asked) == 4 and "12,13" in asked[0]
    monkeypatch.setattr(slurm, "SETTLE_S", 0.05)
    answers("12|RUNNING\n", None)
    assert slurm.histories(["12", "13"]) == {"12": [["RUNNING"]]}, "sacct went silent: its last word stands"


def test_squeue_saying_invalid_job_id_means_none_is_held_and_a_failure_means_it_cannot_say(answers):
    answers("")
    assert slurm.in_queue(["1"]) == {}
    answers(None)
    assert slurm.in_queue(["1"]) is None
    answers("1 PD launch failed requeued held\n2 R None\n")
    assert slurm.in_queue(["1", "2"]) == {"1": ("PD", "launch failed requeued held"), "2": ("R", "None")}


def test_jobs_slurm_never_starts_or_holds_for_good_are_cancelled_the_rest_waited_for(answers, tmp_path):
    held, never, capped, admin = (point(tmp_path, str(i)) for i in range(1, 5))
    answers(
        "1 PD launch failed requeued held\n2 PD QOSMaxCpuPerJobLimit\n3 PD QOSMaxJobsPerUserLimit\n4 PD JobHeldAdmin\n",
        "3 R None\n4 PD JobHeldAdmin\n",
        "",
    )
    assert slurm.wait([held, never, capped, admin])
    assert held.job.cancelled and held.verdict is not None and held.verdict[0] == "error"
    assert "launch failed requeued held" in held.verdict[1]
    assert never.job.cancelled and never.verdict is not None and never.verdict[0] == "skipped"
    assert not capped.job.cancelled and capped.verdict is None, "a per-user cap clears by itself"
    assert not admin.job.cancelled and admin.verdict is None, "an administrator may release it"


def test_a_squeue_that_stops_answering_ends_the_wait_and_cancels_what_was_left(answers, tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "BLIND_S", 0.0)
    waiting = point(tmp_path)
    answers(None)
    assert slurm.wait([waiting])
    assert waiting.job.cancelled and waiting.verdict is not None and "squeue did not answer" in waiting.verdict[1]


@pytest.mark.parametrize(
    "history, spoke, expected",
    [
        ([["COMPLETED"]], "ok", None),
        ([["TIMEOUT"]], "timeout", None),  # the job's own row at the warning signal stands
        ([["PREEMPTED", "CANCELLED"]], "cancelled", ("cancelled", "preempted by a higher-priority job")),
        ([["NODE_FAIL"]], "cancelled", ("error", "its node failed")),
        ([["NODE_FAIL"]], "ok", None),  # it finished before its node went
        ([["FAILED", "OUT_OF_MEMORY"]], "", ("oom", slurm.STATES["OUT_OF_MEMORY"][1])),
        ([["COMPLETED"]], "", ("error", "the job ended without writing its result")),
    ],
)
def test_what_slurm_says_of_a_job_against_what_the_job_said(tmp_path, history, spoke, expected):
    state = slurm.final_state(history[-1])
    assert slurm.verdict(point(tmp_path), state, spoke) == expected


def test_sacct_silent_and_the_job_not_done_is_said_so_without_waiting_on_its_result(tmp_path):
    still = point(tmp_path, finished=False, state="RUNNING")
    assert slurm.verdict(still, "", "") == ("error", "the job had not ended when the sweep did (RUNNING)")


def identity(run_id: str) -> dict[str, str]:
    return {"run_id": run_id, "experiment": "train", "config_hash": "h"}


def test_a_requeued_job_killed_for_memory_in_its_second_run_is_an_oom_row(tmp_path, capsys):
    """Its first run was preempted and ended well (submitit keeps that run's result); its
    second run was killed before it wrote a word: SLURM's account is the point's."""
    RunRecord(run_id="second", experiment="train", config_hash="h").save(tmp_path)  # "running"
    preempted = point(tmp_path, "12")
    history = [["PREEMPTED", "CANCELLED"], ["OUT_OF_MEMORY", "OUT_OF_MEMORY"]]
    assert slurm.settle(preempted, identity("sweep-row"), history) == "oom"
    (row,) = RunWriter(tmp_path).rows
    assert row["status"] == "oom" and "/logs/job.err" in row["error"]
    record = RunRecord.read(tmp_path)
    assert record.outcome == "oom" and not record.complete and record.where["slurm_job_id"] == "12"
    err = capsys.readouterr().err
    assert "SLURM requeued it (preempted by a higher-priority job)" in err and "point #0" in err
