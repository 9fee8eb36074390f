"""Section 15 (opt-in, ``--sections storage``): a finished trial's summary written to the study's storage, one
transaction per attribute (optuna's ``Trial.set_user_attr``, as a study wrote it before) against one transaction
for the whole summary (:func:`ablations.studies.storage.set_user_attrs`, what a study writes), on a fresh SQLite file
of the suite's storage (``open_storage``: heartbeat, ``BEGIN IMMEDIATE``). A plain trial on a CPU lasts a minute and
does not notice; a stacked trial on a GPU lasts about a second, and every worker of a study shares one lock."""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..machine.timing import interleave, median, round_ratios
from ..studies.storage import open_storage, set_user_attrs
from .harness import Section, Settings, ms, ratio_cell

# Imported where they are used, not here: Optuna. Each takes from a tenth of a second to seconds to import, and the
# command-line tools start without them.

#: a run's summary as a study stores it: per-epoch curves (30 epochs) and scalars, about 53 attributes in all
CURVES, SCALARS, EPOCHS = 8, 45, 30


def summary() -> dict:
    """A summary shaped as a trained run's (the values do not matter to the storage: JSON of the same size)."""
    curves = {f"curve_{i}": [round(0.5 + j / 100 + i / 1000, 6) for j in range(EPOCHS)] for i in range(CURVES)}
    return curves | {f"scalar_{i}": round(0.9 + i / 1000, 6) for i in range(SCALARS)}


def bench_storage(s: Settings) -> Section:
    import optuna

    attrs = summary()
    sec = Section("storage", "15. A trial's summary into the study's storage (opt-in)",
                  f"a fresh SQLite file of the suite's storage in {tempfile.gettempdir()}; one call writes a summary "
                  f"of {len(attrs)} attributes ({CURVES} curves of {EPOCHS} values, {SCALARS} scalars) to a running "
                  f"trial; {s.reps} rounds x {s.steps} calls interleaved, each call on a trial of its own",
                  ["write", "ms per trial", "vs one transaction per attribute [round min-max]", "goal", "met"])
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as folder:
        storage = open_storage(f"sqlite:///{Path(folder) / 'bench.db'}")
        study = optuna.create_study(storage=storage, study_name="bench-storage")
        calls = s.warmup + s.reps * s.steps
        trials = {name: [study.ask() for _ in range(calls)] for name in ("per attribute", "one transaction")}

        def per_attribute() -> None:
            trial = trials["per attribute"].pop()
            for key, value in attrs.items():
                trial.set_user_attr(key, value)

        def one_transaction() -> None:
            set_user_attrs(trials["one transaction"].pop(), attrs)

        times = interleave({"per attribute": per_attribute, "one transaction": one_transaction},
                           reps=s.reps, steps=s.steps, warmup=s.warmup)
        stored = study.get_trials()
        storage.remove_session()
    if any(t.user_attrs != attrs for t in stored):  # both ways must have stored the whole summary
        raise RuntimeError("a trial's stored attributes differ from the summary written")
    ratios = round_ratios(times, "one transaction", "per attribute")
    sec.rows.append(["one transaction per attribute (optuna's set_user_attr)", ms(median(times["per attribute"])),
                     "reference", "", ""])
    sec.rows.append(["one transaction (set_user_attrs)", ms(median(times["one transaction"])), ratio_cell(ratios),
                     *sec.goal("storage: one transaction vs one per attribute", median(ratios), 0.5,
                               "<= 0.5x", f"{median(ratios):.2f}x", rounds=ratios)])
    sec.notes.append("A PostgreSQL storage saves a network round trip and a commit per attribute instead of a file "
                     "lock and sync; the time per trial holds the storage's lock from other workers as well.")
    sec.data = {"attributes": len(attrs), "times_s": times, "ratio": median(ratios)}
    return sec
