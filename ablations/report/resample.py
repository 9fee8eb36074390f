"""The rate-aware bootstrap of a paired comparison: every source of doubt the stored runs can measure, resampled in
the order they arise.

A claim line compares row A with row B (each at a depth), each trained at the learning rate its tuning stage chose.
Three things could have come out otherwise, and each replicate of the bootstrap draws all three anew:

1. **The rate choice.** The tuning seeds are drawn with replacement (the same draw for both rows: they share their
   tuning seeds) and each row's rate is chosen again by the protocol's rule — the highest mean tuning value, a run
   that diverged or failed to train counting as 0, ties to the rate listed first. A replicate whose re-chosen rate
   has no reported runs for its row is *uncovered*: it cannot be evaluated, and the verdicts count it against the
   claim (``ablations.report.verdicts``). Training the reported seeds at each contending rate is what covers it.
2. **The reported seeds**, drawn with replacement and paired (the same seeds on both sides).
3. **The test images**, drawn with replacement and paired (the same images for both sides and every seed), where
   every run stored its per-image results; a run counted at chance level is a constant on every image.

A side with fewer than two tuning seeds, or no tuning stage, keeps its chosen rate in every replicate (the rate
level is then not measured, and the result says so). The replicates are deterministic: the generator is seeded
from the line, so a report regenerates byte-identically.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

RESAMPLES = 10_000
CHUNK = 2_000  # replicates per matrix product (memory: CHUNK x images floats)
LEVELS = ("rate", "seeds", "images")

#: a run's payload for a metric: what :data:`Diff` compares (an accuracy's per-image results, a curve, a number)
Payload = object
#: the paired difference of two payloads (A's, B's): a per-image array (both sides scored on the same images) or a
#: number
Diff = Callable[[Payload, Payload], "np.ndarray | float | None"]


@dataclass
class Side:
    """One side of a comparison: a row at a depth, as its runs give it."""

    tune: dict[float, dict[int, float]] = field(default_factory=dict)  # rate -> tuning seed -> value in the choice
    order: list[float] = field(default_factory=list)  # the rates in the rule's tie order
    chosen: float | None = None  # the rate its reported runs trained at
    reported: dict[float, dict[int, Payload]] = field(default_factory=dict)  # rate -> seed -> payload

    def tune_seeds(self) -> set[int]:
        """The tuning seeds every rate of the side ran on."""
        sets = [set(v) for v in self.tune.values()]
        return set.intersection(*sets) if sets else set()


@dataclass
class Replicates:
    """The bootstrap replicates of Δ = mean over paired seeds of (A − B), and what they resampled."""

    deltas: np.ndarray  # (R,): NaN where the replicate is uncovered
    estimate: float | None  # Δ at the chosen rates, on every paired seed and image
    n: int  # paired seeds at the chosen rates
    levels: tuple[str, ...]  # the levels resampled (LEVELS)
    coverage: float  # share of replicates whose re-chosen rates both have reported runs
    rates: dict[str, dict[float, float]] = field(default_factory=dict)  # side -> rate -> share of replicates

    @property
    def covered(self) -> np.ndarray:
        return self.deltas[np.isfinite(self.deltas)]


def line_seed(*parts: object) -> int:
    """A generator seed from a line's identity (stable across runs and machines)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


def rate_choices(side: Side, draws: np.ndarray | None, seeds: Sequence[int]) -> np.ndarray:
    """The rate (index into ``side.order``) each replicate chooses: the highest mean over its drawn tuning seeds
    (``draws``: (R, k) indices into ``seeds``), ties to the rate listed first; the chosen rate everywhere when the rate
    level is not resampled (``draws`` None)."""
    if draws is None or not side.order:
        index = side.order.index(side.chosen) if side.chosen in side.order else -1
        return np.full(len(draws) if draws is not None else 1, index)
    values = np.array([[side.tune[rate][s] for s in seeds] for rate in side.order])  # (rates, k)
    means = values[:, draws].mean(axis=2)  # (rates, R)
    return np.argmax(means >= means.max(axis=0, keepdims=True) - 1e-12, axis=0)  # the first of the tied


def resample(a: Side, b: Side, diff: Diff, *, resamples: int = RESAMPLES, seed: int = 0,
             min_tune_seeds: int = 2) -> Replicates:
    """The rate-aware bootstrap of A − B (module docstring)."""
    rng = np.random.default_rng(seed)
    estimate, n, images = _at(a, b, a.chosen, b.chosen, diff)
    tune_seeds = sorted(a.tune_seeds() & b.tune_seeds()) if a.tune and b.tune else []
    resample_rates = len(tune_seeds) >= min_tune_seeds and a.chosen in a.order and b.chosen in b.order
    draws = rng.integers(0, len(tune_seeds), size=(resamples, len(tune_seeds))) if resample_rates else None
    pick_a = np.broadcast_to(rate_choices(a, draws, tune_seeds), (resamples,))
    pick_b = np.broadcast_to(rate_choices(b, draws, tune_seeds), (resamples,))
    deltas = np.full(resamples, np.nan)
    image_level = images is not None
    for ia, ib in sorted({(int(x), int(y)) for x, y in zip(pick_a, pick_b, strict=True)}):
        ra = a.order[ia] if ia >= 0 else a.chosen
        rb = b.order[ib] if ib >= 0 else b.chosen
        rows = np.flatnonzero((pick_a == ia) & (pick_b == ib))
        matrix = _matrix(a, b, ra, rb, diff, images)
        if matrix is None:
            continue  # uncovered: a re-chosen rate without reported runs
        for start in range(0, len(rows), CHUNK):
            chunk = rows[start:start + CHUNK]
            deltas[chunk] = _replicate(matrix, len(chunk), rng, image_level)
    shares = {name: _shares(side, picks) for name, side, picks in (("a", a, pick_a), ("b", b, pick_b))}
    levels = (("rate",) if resample_rates else ()) + ("seeds",) + (("images",) if image_level else ())
    return Replicates(deltas, estimate, n, levels, float(np.isfinite(deltas).mean()), shares)


def _shares(side: Side, picks: np.ndarray) -> dict[float, float]:
    counts = np.bincount(picks[picks >= 0], minlength=len(side.order)) if len(side.order) else np.zeros(0)
    return {rate: float(c) / len(picks) for rate, c in zip(side.order, counts, strict=True) if c}


def _pairs(a: Side, b: Side, ra, rb, diff: Diff) -> list:
    """The paired differences at rates (ra, rb), by seed: a list of arrays or numbers (None: a pair with no value)."""
    own, ref = a.reported.get(ra) or {}, b.reported.get(rb) or {}
    out = [diff(own[s], ref[s]) for s in sorted(set(own) & set(ref))]
    return [d for d in out if d is not None]


def _at(a: Side, b: Side, ra, rb, diff: Diff) -> tuple[float | None, int, int | None]:
    """(Δ, paired seeds, images per run or None when the differences are numbers) at rates (ra, rb)."""
    pairs = _pairs(a, b, ra, rb, diff)
    if not pairs:
        return None, 0, None
    arrays = [p for p in pairs if isinstance(p, np.ndarray)]
    images = arrays[0].size if arrays and len(arrays) == len(pairs) else None
    return float(np.mean([np.mean(p) for p in pairs])), len(pairs), images


def _matrix(a: Side, b: Side, ra, rb, diff: Diff, images: int | None) -> np.ndarray | None:
    """(seeds, images) of the paired differences at (ra, rb) — (seeds, 1) without the image level —; None with
    fewer than 2 pairs."""
    pairs = _pairs(a, b, ra, rb, diff)
    if len(pairs) < 2:
        return None
    if images is None or not all(isinstance(p, np.ndarray) and p.size == images for p in pairs):
        return np.array([[float(np.mean(p))] for p in pairs])
    return np.stack([p.astype(np.float64) for p in pairs])


def _replicate(matrix: np.ndarray, count: int, rng: np.random.Generator, image_level: bool) -> np.ndarray:
    """``count`` replicates of the mean paired difference: seeds drawn with replacement and, with the image level,
    the images too (multinomial weights shared by every seed of a replicate)."""
    seeds, images = matrix.shape
    if image_level and images > 1:
        weights = rng.multinomial(images, np.full(images, 1.0 / images), size=count) / images  # (count, images)
        per_seed = matrix @ weights.T  # (seeds, count)
    else:
        per_seed = np.repeat(matrix.mean(axis=1, keepdims=True), count, axis=1)
    picks = rng.integers(0, seeds, size=(count, seeds))
    return per_seed[picks.T, np.arange(count)].mean(axis=0)


def accuracy_diff(a: Payload, b: Payload) -> np.ndarray | float | None:
    """A − B of two runs' accuracy payloads: per-image results (boolean arrays over the same test images) or a
    number (a run at chance level, or one without per-image results)."""
    if a is None or b is None:
        return None
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        if a.size != b.size:
            raise ValueError("per-image results of different lengths: the runs were not scored on the same test images")
        return a.astype(np.float64) - b.astype(np.float64)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):  # one side constant: it is that on every image
        arr = a if isinstance(a, np.ndarray) else b
        const = float(b if isinstance(a, np.ndarray) else a)
        return arr.astype(np.float64) - const if arr is a else const - arr.astype(np.float64)
    return float(a) - float(b)


def number_diff(a: Payload, b: Payload) -> float | None:
    """A − B of two numbers."""
    return None if a is None or b is None else float(a) - float(b)


def shares_text(shares: Mapping[float, float]) -> str:
    """``2e-3 (71%), 4e-3 (29%)``: how often each rate was re-chosen."""
    return ", ".join(f"{rate:g} ({100 * share:.0f}%)" for rate, share in sorted(shares.items()))
