"""What a study costs on a GPU it has not run on: the GPU-hours of its trials on a named GPU class
(``gpu_hours``: FLOPs at a measured or assumed utilisation, and the launch-bound step floor) and the stacked engine's
price from a measured stacked step (``engine``). ``python -m ablations.run --study NAME --dry-run --gpu CLASS``
prints both; the benchmark (:mod:`ablations.bench`) and ``scripts/device_check.py`` make the measurements they read.
Nothing a study runs imports this package."""
