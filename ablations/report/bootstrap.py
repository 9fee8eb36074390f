"""The two-level bootstrap of a paired difference: seeds × test images.

The paired t-interval of a Δ covers seed-to-seed variation only: every run is scored on the same fixed test images,
so a different draw of test images would move every run together and the interval does not see it. With each run's
per-image results (``test_correct``, :mod:`lit_modules.predictions`) the bootstrap resamples both levels at once:
each replicate draws the seeds (pairs) with replacement and, independently, the test images with replacement (the
same images for both sides of every pair: they are paired by image too), recomputes each run's accuracy on the drawn
images and averages the paired differences over the drawn seeds. The percentile interval of the replicates covers
both sources of variation. A run that counts at chance level (diverged, failed to train) has no per-image results:
its accuracy is chance level in every replicate.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

RESAMPLES = 2000
SEED = 0  # fixed: a report regenerates byte-identically
CHUNK = 250  # replicates per matrix product (memory: CHUNK x images floats)


def two_level_ci(own: Mapping[int, np.ndarray | float], ref: Mapping[int, np.ndarray | float],
                 confidence: float = 0.95, resamples: int = RESAMPLES,
                 seed: int = SEED) -> tuple[float, float] | None:
    """Percentile interval of Δ = mean over seeds of (own − ref) under the two-level bootstrap. ``own``/``ref``: seed
    -> the run's per-image correctness (a boolean array over the same test images) or a constant accuracy (a run
    at chance level). None with fewer than 2 paired seeds or without any per-image results."""
    seeds = sorted(set(own) & set(ref))
    arrays = [v for s in seeds for v in (own[s], ref[s]) if isinstance(v, np.ndarray)]
    if len(seeds) < 2 or not arrays:
        return None
    images = arrays[0].size
    if any(a.size != images for a in arrays):
        raise ValueError("per-image results of different lengths: the runs were not scored on the same test images")

    def matrix(side: Mapping[int, np.ndarray | float]) -> np.ndarray:
        """(seeds, images): a run's correctness, or its constant accuracy on every image (any weights that sum to
        1 average it back to the constant)."""
        return np.stack([side[s].astype(np.float64) if isinstance(side[s], np.ndarray)
                         else np.full(images, float(side[s])) for s in seeds])

    diff = matrix(own) - matrix(ref)
    rng = np.random.default_rng(seed)
    deltas = np.empty(resamples)
    for start in range(0, resamples, CHUNK):
        count = min(CHUNK, resamples - start)
        weights = rng.multinomial(images, np.full(images, 1.0 / images), size=count) / images  # (count, images)
        per_seed = diff @ weights.T  # (seeds, count): each pair's Δ on each replicate's images
        picks = rng.integers(0, len(seeds), size=(count, len(seeds)))
        deltas[start:start + count] = per_seed[picks.T, np.arange(count)].mean(axis=0)
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(deltas, [tail, 1.0 - tail])
    return float(low), float(high)

