"""The done marks' key: one format (done_marks.KEY_FORMAT) that point_key writes and the rebuild
reads back (KEY), so that a rebuild never takes the current markers for an older perflab's."""

from __future__ import annotations

import pytest

from perflab.store import done_marks
from perflab.store.rundir import RunRecord, RunWriter


@pytest.mark.parametrize(
    "config, subject, process",
    [
        ("0123abcd", "", 1),
        ("0123abcd", "a1b2c3d", 2),
        ("hash-with-dashes", "refs/heads/main", 12),
        ("h", "ünïcode subject", 1),
    ],
)
def test_every_key_point_key_makes_is_read_as_one(config, subject, process):
    assert done_marks.KEY.fullmatch(done_marks.point_key(config, subject, process))


@pytest.mark.parametrize("older", ["0123abcd", "0123abcd-p1", "0123abcd-NONE-p1", "0123abcd-abc-p1"])
def test_an_older_perflabs_key_is_not_read_as_one(older):
    assert not done_marks.KEY.fullmatch(older)


def test_a_rebuild_keeps_the_markers_point_key_names_and_drops_an_older_perflabs(tmp_path):
    """The whole round trip on a real store: a run of a subject and process 2 marked done, an
    older perflab's marker (config hash only) beside it; the rebuild keeps the first, drops the
    second, and the point is still found."""
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    RunWriter(run, samples=False).add({"run_id": "r1", "experiment": "matmul", "measurement": "m", "status": "ok"})
    record = RunRecord(
        run_id="r1",
        experiment="matmul",
        config_hash="h9",
        subject="v1.2",
        process=2,
        outcome="ok",
        complete=True,
        rows=1,
    )
    record.save(run)
    done_marks.mark_done(tmp_path, record, run)
    older = tmp_path / ".perflab" / "done" / "h9"
    older.mkdir()
    (older / "r1").write_text("runs/r1\n")
    done_marks.rebuild_done(tmp_path)
    key = done_marks.point_key("h9", "v1.2", 2)
    assert (tmp_path / ".perflab" / "done" / key / "r1").is_file() and not older.exists()
    assert done_marks.find_done(tmp_path, key) == run


def test_a_model_folders_digest_makes_another_point_and_none_keeps_the_key():
    """A rewritten model folder (its model_digest) is another point; without one the key is the
    one an earlier perflab wrote, so a store's done marks stay valid."""
    key = done_marks.point_key
    assert key("h", "v1", 1, "") == key("h", "v1", 1)
    for subject in ("v1", ""):
        assert key("h", subject, 1, "0123456789ab") not in (key("h", subject, 1), key("h", subject, 1, "ba9876543210"))
        assert done_marks.KEY.fullmatch(key("h", subject, 1, "0123456789ab"))
