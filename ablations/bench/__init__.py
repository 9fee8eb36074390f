"""Measurement: the benchmark (``python -m ablations.bench``: harness, sections in steps/loops/precision, cli), the
timing harness it shares with precision ``auto`` (``timing``), the precision/attention mode tables (``modes``) and the
dry-run time and GPU-hours estimate (``gpu_hours``). Importing the package loads nothing heavy."""
