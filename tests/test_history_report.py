"""The report reads a history as one (issue 42): its series lead the page, a series with a
change point before those without, each suspect subject marked as such, and a line per series,
capped with a count of the rest."""

from __future__ import annotations

import pytest
from test_history import write_history

from perflab import history
from perflab.report import load_samples
from perflab.report.page import Report
from perflab.results import load

pytest.importorskip("matplotlib")


@pytest.fixture
def tree(tmp_path):
    """Two series: a flat one (size 256, subject s03 measured on a busy machine) and one that
    steps 30 % slower from s06 (size 1024)."""
    write_history(tmp_path, "flat", [1.0] * 12, seed=1, suspect=(3,))
    write_history(tmp_path, "step", [1.0] * 6 + [1.3] * 6, seed=2, size=1024)
    return tmp_path


def test_the_series_lead_the_report_the_changed_first_suspects_marked(tree):
    rows = load(tree)
    page = Report(rows, [str(tree)], load_samples([tree], rows["row_id"])).render()
    body = page[page.index("<body") :]
    assert body.index('id="trends"') < body.index('class="experiment"'), "the history before the sections"
    trends = body[body.index('id="trends"') : body.index("</section>", body.index('id="trends"'))]
    table = trends[trends.index('class="series"') :]
    assert table.index("size=1024") < table.index("size=256"), "the series with a change point first"
    assert "regression -23.0 % at step-s06" in table.split("size=256")[0]  # tflops: 1 / 1.3
    assert "suspect (flagged)" in trends, "the busy subject drawn as suspect"


def test_the_series_table_is_capped_with_a_count(tree, monkeypatch):
    monkeypatch.setattr(history, "MAX_SERIES_LINES", 1)
    section = history.report_section(load(tree), load_samples([tree]))
    assert section.count("<tr><td>") == 1
    assert "and 1 more series" in section
