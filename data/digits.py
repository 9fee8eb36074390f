"""scikit-learn's bundled 8x8 handwritten digits (1,797 images, values 0..16): an offline smoke-test dataset."""

from __future__ import annotations

import torch

from data.in_memory import InMemoryDataModule, Splits

# Imported where they are used, not here: scikit-learn. Each takes from a tenth of a second to seconds to import, and
# the command-line tools start without them.


class DigitsDataModule(InMemoryDataModule):
    """``sklearn.datasets.load_digits`` with a fixed test split and a seeded train/val split (``data.common
    .three_way_split``: 1,077 / 360 / 360 at the defaults); augmentation: shifts of +-1 px.

    No flips: digits are not mirror-invariant. Patch size 2 gives a 4x4 grid of 16 tokens.
    """

    name = "digits"
    num_classes = 10
    in_chans = 1
    img_size = 8
    pool_size = 1797
    default_patch_size = 4
    pixel_max = 16.0
    max_shift = 1

    def load_splits(self) -> Splits:
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = torch.from_numpy(digits.images).to(torch.uint8).unsqueeze(1)  # (1797, 1, 8, 8), values 0..16
        return self.split_pool(images, torch.from_numpy(digits.target).long())
