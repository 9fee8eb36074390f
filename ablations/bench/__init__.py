"""Measurement: the benchmark (``python -m ablations.bench``: harness, sections in steps/loops/precision/malloc,
cli; ``child`` runs a section's measurement in a process of its own, ``tasks`` is that process). What a training run
uses at run time lives where the run uses it (:mod:`ablations.machine`: precision modes, malloc, the timing
harness; :mod:`ablations.pricing.gpu_hours`: the dry run's GPU-hours). Importing the package loads nothing heavy."""
