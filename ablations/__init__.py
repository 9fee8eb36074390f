"""Command-line tools: train (one run), run (Optuna studies), report (tables/figures), bench, costs."""
