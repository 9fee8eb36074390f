"""The optuna-dashboard notes of a study (``optuna_dashboard.save_note``): the reported study's note opens on the
claims and the path of its HTML report, then the tables; its tuning stage's note says which learning rate each
variant got, from which means."""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

# Imported where they are used, not here: optuna-dashboard. Each takes from a tenth of a second to seconds to import,
# and the command-line tools start without them.

#: what optuna-dashboard's own panels mean for a grid study (its note says it first)
GRID_CAVEAT = (
    "**Reading this dashboard for a grid study.** Every point of the grid trains once per seed, so the *best trial* "
    "is one seed of one row (the luckiest draw, not the best row), and *parameter importance* ranks the grid's own "
    "axes, seed among them, by how the single runs' values spread: it is not a test of any row against another. The "
    "seed-aggregated verdict is below: the claims (paired over seeds, Holm-adjusted) and the main table (mean ± sd "
    "over seeds per row), and, in full, the HTML report.")


#: a grid study's user attribute that optuna-dashboard lists on the study's first page, beside its Best Trial and
#: Hyperparameter Importance panels (sorted first: the attributes are listed by key)
READING_ATTR = "0_how_to_read"


def reading_line(html: Path | None) -> str:
    """The first page's one line for a grid study: what Best Trial and Importance are there, where the verdict is
    (``html`` None: before any report)."""
    where = (f"the Note tab and the HTML report {Path(html).resolve()}" if html is not None else
             "the Note tab and the HTML report once `python -m ablations.report --study NAME --html` has run")
    return ("a grid: 'Best Trial' is one seed of one row, and 'Hyperparameter Importance' ranks the grid's axes (seed "
            f"among them) by single runs, not rows against each other; the seed-aggregated verdict (claims, paired "
            f"over seeds) is in {where}")


def study_note(study_name: str, tables: Sequence, html: Path, grid: bool = True) -> str:
    """Markdown: for a grid study (``grid``) what the dashboard's best trial and importance mean there, then the
    claims' verdicts (when the study lists claims), the HTML report's path (whether it exists yet), then every
    table."""
    html = Path(html).resolve()
    parts = [f"## Report: {study_name}", "", *([GRID_CAVEAT, ""] if grid else [])]
    if html.is_file():
        parts.append(f"HTML report (tables, figures, claims, protocol, run): `{html}` — open "
                     f"[{html.name}]({html.as_uri()}) in a browser.")
    else:
        parts.append(f"HTML report: `{html}` (not written yet: `python -m ablations.report --study {study_name} "
                     "--html`).")
    claims = [t for t in tables if t.name == "claims"]
    parts += ["", *(t.markdown() for t in claims), *(t.markdown() for t in tables if t.name != "claims")]
    return "\n".join(parts)


def cell_text(key: str) -> str:
    """A tuning cell (:meth:`ablations.studies.spec.StudySpec.tune_key`: JSON ``[variant, [[axis, value], ...]]``) as
    ``variant axis=value``."""
    variant, cell = json.loads(key)
    return variant + "".join(f" {axis}={value}" for axis, value in cell)


def tuning_note(study_name: str, choice: Mapping[str, float], means: Mapping[str, Mapping[str, float | None]],
                *, metric: str, seeds: Sequence[int]) -> str:
    """Markdown: one line per tuning cell with the learning rate it got and the mean ``metric`` of every rate tried
    (the chosen one in bold)."""
    lines = [f"## Tuning stage of {study_name}: the learning rate each variant got", "",
             f"Chosen on tuning seeds {', '.join(map(str, seeds))} by the highest mean {metric} (a diverged run counts "
             "as 0; ties go to the rate listed first). The reported trials of the study train at these rates.", "",
             "| variant | learning rate | mean {metric} per rate tried |".replace("{metric}", metric),
             "|---|---:|---|"]
    for key, lr in choice.items():
        tried = []
        for rate, mean in (means.get(key) or {}).items():
            text = f"{float(rate):g}: {'—' if mean is None else format(100 * mean, '.2f') + '%'}"
            tried.append(f"**{text}**" if float(rate) == float(lr) else text)
        lines.append(f"| {cell_text(key)} | {float(lr):g} | {'; '.join(tried)} |")
    return "\n".join(lines) + "\n"


def save_note(study, markdown: str) -> None:
    import optuna_dashboard

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optuna_dashboard.save_note(study, markdown)
