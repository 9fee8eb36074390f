"""Per-image test results of a run, compact: which test images the final model classified correctly, as one line
of text that a study stores with the trial and writes into ``runs.csv``.

``pack(correct)`` -> ``"<n>:<base64 of the bits>"`` (bit i = image i of the fixed test split, in the test loader's
order, little-endian within each byte); ``unpack(text)`` -> a boolean numpy array of length n. 1,000 images take
172 characters, 10,000 about 1,680. The accuracy is ``unpack(text).mean()``; the report's two-level bootstrap
resamples seeds and these images (``ablations.report.bootstrap``).
"""

from __future__ import annotations

import base64

import numpy as np


def pack(correct) -> str:
    """The text of a boolean vector (a numpy array, a list or a CPU tensor's ``.numpy()``)."""
    bits = np.asarray(correct, dtype=bool).ravel()
    return f"{bits.size}:" + base64.b64encode(np.packbits(bits, bitorder="little").tobytes()).decode("ascii")


def unpack(text: str) -> np.ndarray:
    """The inverse of :func:`pack`; ValueError for text that is not ``<n>:<base64>`` of at least n bits."""
    count, _, data = str(text).partition(":")
    try:
        n = int(count)
        raw = np.frombuffer(base64.b64decode(data.encode("ascii"), validate=True), dtype=np.uint8)
    except (ValueError, TypeError):
        raise ValueError(f"not a packed per-image result: {str(text)[:40]!r}") from None
    if n < 0 or raw.size * 8 < n:
        raise ValueError(f"not a packed per-image result: {n} images but {raw.size * 8} bits")
    return np.unpackbits(raw, bitorder="little")[:n].astype(bool)
