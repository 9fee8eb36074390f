"""A study from Python: define it as a dict, run it, report it, read its runs back with pandas.

    python examples/python_study.py                 # the smoke budget: a minute or two on a laptop
    python examples/python_study.py --budget quick  # a first look (10 epochs, three seeds)

The same calls as the command line (``ablations-run`` / ``ablations-report``), each returning its exit status; the
study is an ordinary study file written to the output folder, extending the shared protocol (its tuning stage,
floor, seeds and budgets). Everything lands in ``outputs/`` (``--results-dir`` below moves it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ablations.report.cli import main as report  # noqa: E402
from ablations.run import main as run  # noqa: E402

STUDY = {
    "name": "python_study",
    "extends": "protocol/mnist5k.yaml",  # found from any folder: ablations/studies/protocol/mnist5k.yaml
    "base": {"dataset": "digits", "patch_size": 4},  # 8x8 digits in 4 px patches (any dataset, or an image folder)
    "variants": [{"label": "standard", "residual": "standard"},
                 {"label": "rezero", "residual": "rezero"},
                 {"label": "layerscale", "residual": "layerscale", "options": {"init_value": "auto"}}],
    "axes": {"depth": [4], "seed": [0, 1, 2]},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", default="smoke", help="smoke (default), quick or default")
    parser.add_argument("--results-dir", default="outputs", help="where the storage, runs and report go")
    args = parser.parse_args(argv)
    out = Path(args.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "python_study.yaml"
    path.write_text(yaml.safe_dump(STUDY, sort_keys=False))
    where = ["--study", str(path), "--budget", args.budget, "--results-dir", str(out),
             "--storage", f"sqlite:///{out / 'optuna.db'}"]
    code = run([*where, "--no-progress"]) or report([*where, "--no-figures"])
    if code:
        return code
    import pandas as pd

    name = "python_study" if args.budget == "default" else f"python_study-{args.budget}"
    runs = pd.read_csv(out / name / "runs.csv")
    reported = runs[runs["phase"] == "report"]
    print(reported.groupby("variant")["acc"].agg(["mean", "std", "count"]).round(4).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
