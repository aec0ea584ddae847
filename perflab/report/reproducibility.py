"""The report's reproducibility summary: does what the book says hold on this machine? One line
per claim (claim | the book | expected here | measured | verdict, and why), in the book's
order, then why each run was sized as it was (the rows' ``results.note``, which ``perflab
chapter`` fills). The claims come from the experiments (:func:`perflab.analysis.claims.judge`); this
module only lays them out, as one HTML block the report puts before its sections."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from perflab.analysis.claims import INVALID, NOT_APPLICABLE, UNDERPOWERED, VALID, Claim, counts, judge
from perflab.report.html import esc, section_id

NOTE = "cfg.results.note"
VERDICT_CLASS = {VALID: "valid", INVALID: "invalid", UNDERPOWERED: "underpowered", NOT_APPLICABLE: "na"}
STYLE = """
section.claims table td.verdict { font-weight: 700; white-space: nowrap; }
section.claims .valid { color: #2f7d32; } section.claims .invalid { color: #b3261e; }
section.claims .underpowered { color: #a35d00; } section.claims .na { color: #5d6875; }
section.claims td .why { display: block; font-weight: normal; color: #5d6875; font-size: 12px; white-space: normal; }
section.claims td .tolerance { display: block; color: #5d6875; font-size: 12px; }
section.claims td.statement { min-width: 240px; }
section.claims .tally span { margin-right: 14px; font-weight: 600; }
"""


def summary(rows: pd.DataFrame, samples: Mapping[str, np.ndarray] | None = None) -> str:
    """The summary block for these rows ("" when they make no claim and say no sizes)."""
    found = judge(rows, samples)
    sized = sizes(rows)
    if not found and not sized:
        return ""
    parts = [f'<section class="claims" id="reproducibility"><style>{STYLE}</style><h2>Reproducibility summary</h2>']
    if found:
        tally = "".join(f'<span class="{VERDICT_CLASS[v]}">{n} {esc(v)}</span>' for v, n in counts(found).items())
        parts.append(
            f'<p class="tally">{len(found)} claims of the book, checked on these rows: {tally}</p>'
            '<p class="note">VALID: the measurement supports the claim within its tolerance. INVALID: it '
            "contradicts it, on clean evidence. UNDERPOWERED: the evidence cannot decide (and what would). "
            "NOT APPLICABLE: it cannot be checked here (and why).</p>"
        )
        parts.append(
            "<table><thead><tr><th>§</th><th>claim</th><th>the book</th><th>expected here</th>"
            "<th>measured</th><th>verdict</th></tr></thead><tbody>"
        )
        parts += [_row(c, section_id(c.experiment)) for c in found]
        parts.append("</tbody></table>")
    if sized:
        parts.append(
            "<h3>Why these sizes</h3><table><thead><tr><th>experiment</th><th>run</th><th>why</th></tr></thead><tbody>"
        )
        parts += [f"<tr><td>{esc(s)}</td><td>{esc(run)}</td><td>{esc(why)}</td></tr>" for s, run, why in sized]
        parts.append("</tbody></table>")
    parts.append("</section>")
    return "".join(parts)


def _row(c: Claim, anchor: str) -> str:
    why = f'<span class="why">{esc(c.why)}</span>' if c.why else ""
    tolerance = f'<span class="tolerance">tolerance: {esc(c.tolerance)}</span>' if c.tolerance not in ("", "-") else ""
    return (
        f'<tr data-verdict="{esc(c.verdict)}"><td>{esc(c.section)}</td>'
        f'<td class="statement"><a href="#{esc(anchor)}">{esc(c.statement)}</a></td>'
        f"<td>{esc(c.book)}</td><td>{esc(c.expected)}{tolerance}</td><td>{esc(c.measured or '-')}</td>"
        f'<td class="verdict {VERDICT_CLASS[c.verdict]}">{esc(c.verdict)}{why}</td></tr>'
    )


def sizes(rows: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(experiment, run, why) for each run whose rows say why it was sized so."""
    if NOTE not in rows or "run_id" not in rows:
        return []
    noted = rows.dropna(subset=[NOTE])
    noted = noted[noted[NOTE].astype(str).str.strip() != ""]
    out = []
    for run_id, part in noted.groupby("run_id", sort=False):
        first = part.iloc[0]
        devices = first.get("cfg.devices.count")
        label = f", {int(devices)} device{'s' if devices != 1 else ''}" if pd.notna(devices) and devices else ""
        out.append((str(first.get("experiment", "")), f"{run_id}{label}", str(first[NOTE])))  # the id names its folder
    return out
