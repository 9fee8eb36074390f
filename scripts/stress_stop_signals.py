"""Stress the stop-signal handling against a shared SQLite storage (docs/reliability.md).

    python scripts/stress_stop_signals.py --tries 150

Each try: two processes on a fresh SQLite file make storage calls in a loop (set a user attribute, report a value,
read every trial), one of them with the CLI's signal handling (``ablations.studies.stopping.stop_on_signals``). After a
random 0.2–1.5 s it gets SIGTERM; it must then mark its trial FAIL within 5 s. Before signals were held during
storage calls, about one try in 80 waited SQLite's 60 s busy timeout for a write lock the process itself had left
behind. Prints one line per try and the number of bad tries; exits 1 if there were any.
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

# Imported where they are used, not here: Optuna. Each takes from a tenth of a second to seconds to import, and the
# command-line tools start without them.


def loop(url: str, handle_signals: bool) -> None:
    import optuna

    from ablations.studies import stopping
    from ablations.studies.storage import open_storage

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.load_study(study_name="stress", storage=open_storage(url))
    if handle_signals:
        stopping.stop_on_signals()
    trial = study.ask()
    print("ready", flush=True)
    step = 0
    try:
        while True:
            trial.set_user_attr("step", step)
            trial.report(float(step), step)
            study.get_trials(deepcopy=False)
            step += 1
    except KeyboardInterrupt:
        start = time.monotonic()
        trial.set_user_attr("stopped", True)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        print(f"marked FAIL in {time.monotonic() - start:.2f} s after {step} loops", flush=True)


def one_try(folder: Path, index: int) -> float | None:
    """Seconds the signalled process took to mark its trial FAIL; None if it could not."""
    import optuna

    from ablations.studies.storage import open_storage

    url = f"sqlite:///{folder / f'try_{index}.db'}"
    optuna.create_study(study_name="stress", storage=open_storage(url))
    procs = [subprocess.Popen([sys.executable, __file__, "--loop", url, *(["--handle-signals"] if i == 0 else [])],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for i in range(2)]
    try:
        for proc in procs:
            proc.stdout.readline()
        time.sleep(random.uniform(0.2, 1.5))
        procs[0].send_signal(signal.SIGTERM)
        out = procs[0].communicate(timeout=300)[0].strip().splitlines()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    last = out[-1] if out else ""
    return float(last.split(" in ")[1].split()[0]) if last.startswith("marked FAIL") else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=100)
    parser.add_argument("--loop", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--handle-signals", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    if args.loop:
        loop(args.loop, args.handle_signals)
        return 0
    bad = 0
    with tempfile.TemporaryDirectory() as folder:
        for index in range(args.tries):
            took = one_try(Path(folder), index)
            bad += took is None or took > 5.0
            print(f"try {index}: " + ("could not mark its trial FAIL" if took is None else f"FAIL marked in {took:.2f} s"),
                  flush=True)
    print(f"{bad} bad tries of {args.tries}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
