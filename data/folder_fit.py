"""What an image folder's images are, and the geometry and augmentation that fit them (``imagefolder``'s defaults).

A user's folder may hold 32x32 grey digits or 500x375 colour photos; one fixed default (colour, 32 px, timm's
ImageNet augmentation) fits neither: it would flip and colour-jitter digits and upsample or crush photos. So the
``imagefolder`` DataModule looks at a sample of its train images first (:func:`look_at`: grey or colour, their size)
and :func:`choose` picks each option left at ``"auto"``:

========================  ===============================================================================
option                    auto
========================  ===============================================================================
``channels``              1 when every sampled image is grey (mode L, or RGB with equal channels), else 3
``img_size``              the images' median shorter side, at most :data:`MAX_AUTO_SIZE`, a multiple of the patch
patch (``patch_size``)    16 from 128 px, about 8x8 patches from 64 px, about 4x4 below (8 px at 32 px)
``crop``                  ``shift`` (a random crop of the image padded by an eighth of its side, as CIFAR's
                          4 px at 32) for grey or small (< 64 px) images; ``resized`` (timm's random-resized
                          crop) for larger colour images; ``none`` takes none
``flip``                  on for colour images (photos), off for grey ones (digits, letters, scans: a mirrored
                          digit is another symbol)
``color_jitter``          0.4 (timm's) with the ``resized`` crop of colour images, else off
========================  ===============================================================================

Every choice is stated by :meth:`Fit.text` (the dry run and a run's first lines print it) and can be set as a
dataset option (``--dataset-option flip=true``, a study's ``dataset_options``). Torch-free (PIL and numpy).
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass
from pathlib import Path

#: the largest side ``img_size: auto`` picks (ViT's 224; larger images are resized down to it)
MAX_AUTO_SIZE = 224
#: train images opened to see what the folder holds
LOOK_SAMPLES = 64
CROPS = ("auto", "shift", "resized", "none")
GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")
#: largest difference between an RGB image's channels that still counts as grey (JPEG's chroma noise)
GREY_TOLERANCE = 2


@dataclass(frozen=True)
class Look:
    """What a sample of a folder's train images shows: how many were opened, whether all are grey, their median
    shorter side and whether all have one size (width, height)."""

    sampled: int
    grey: bool
    side: int
    size: tuple[int, int] | None  # the one size of every sampled image, else None


@dataclass(frozen=True)
class Fit:
    """The geometry and training augmentation an ``imagefolder`` run uses, and where each came from."""

    channels: int
    img_size: int
    patch_size: int
    crop: str
    flip: bool
    color_jitter: float
    look: Look | None
    auto: tuple[str, ...]  # the options chosen from the images (the others were given)

    @property
    def padding(self) -> int:
        """The ``shift`` crop's padding: an eighth of the side (4 px at 32 px), at least 1."""
        return max(1, self.img_size // 8)

    def augmentation_text(self) -> str:
        crop = {"shift": f"shifts of up to {self.padding} px (a random crop of the padded image)",
                "resized": "timm's random-resized crop", "none": "no crop"}[self.crop]
        jitter = f"colour jitter {self.color_jitter:g}" if self.color_jitter else "no colour jitter"
        return f"{crop}, {'a horizontal flip' if self.flip else 'no flip'}, {jitter}"

    def text(self) -> str:
        """One line: what the images are and what the run makes of them, the options chosen from the images named."""
        seen = ""
        if self.look is not None:
            size = (f"{self.look.size[0]}x{self.look.size[1]}" if self.look.size
                    else f"of varied sizes (median shorter side {self.look.side} px)")
            seen = f"{'grey' if self.look.grey else 'colour'} images {size} ({self.look.sampled} sampled) -> "
        tokens = (self.img_size // self.patch_size) ** 2
        chosen = f" (chosen from the images: {', '.join(self.auto)}; set any with --dataset-option)" if self.auto else ""
        return (f"{seen}{self.channels} channel(s), img_size {self.img_size}, patch {self.patch_size} ({tokens} "
                f"tokens); training augmentation: {self.augmentation_text()}{chosen}")


def auto_patch(img_size: int) -> int:
    """The patch side for an image side: 16 from 128 px (ViT's), about 8x8 patches from 64 px, about 4x4 below (8 px
    patches at 32 px, as the protocol's 7 px patches of 28 px MNIST digits: 16 tokens, quick on a CPU)."""
    if img_size >= 128:
        return 16
    return max(1, round(img_size / (8 if img_size >= 64 else 4)))


def image_files(split_dir: Path, extensions: tuple[str, ...]) -> list[Path]:
    """Every image file under ``split_dir``'s class folders, sorted (ImageFolder's order)."""
    return sorted(p for p in split_dir.rglob("*") if p.suffix.lower() in extensions and p.is_file())


@functools.lru_cache(maxsize=32)
def look_at(paths: tuple[Path, ...], samples: int = LOOK_SAMPLES) -> Look:
    """Open up to ``samples`` of ``paths``, evenly spread over the sorted list (so over the classes), and say
    whether all are grey and what size they are. An unreadable file is a ``ValueError`` naming it."""
    from PIL import Image

    step = max(1, len(paths) / samples)
    picked = [paths[int(i * step)] for i in range(min(samples, len(paths)))]
    grey, sizes = True, []
    for path in picked:
        try:
            with Image.open(path) as image:
                sizes.append(image.size)
                if grey and image.mode not in GREY_MODES:
                    grey = _grey_pixels(image)
        except (OSError, ValueError) as exc:
            raise ValueError(unreadable(path, exc)) from None
    side = int(statistics.median(min(size) for size in sizes))
    return Look(sampled=len(picked), grey=grey, side=side, size=sizes[0] if len(set(sizes)) == 1 else None)


def _grey_pixels(image) -> bool:
    """Whether a colour-mode image holds a grey picture (its three channels equal, within JPEG's noise)."""
    import numpy as np

    pixels = np.asarray(image.convert("RGB"), dtype=np.int16)
    return int(np.abs(pixels - pixels[..., :1]).max()) <= GREY_TOLERANCE


def unreadable(path: Path, exc: BaseException) -> str:
    """The one-line message for an image file that cannot be decoded."""
    reason = " ".join(str(exc).replace(f" '{path}'", "").split()) or type(exc).__name__
    return f"image file '{path}' could not be read ({type(exc).__name__}: {reason}); replace or remove it"


def choose(look: Look | None, *, img_size: int | str = "auto", patch_size: int | None = None,
           channels: int | str = "auto", crop: str = "auto", flip: bool | str = "auto",
           color_jitter: float | str = "auto") -> Fit:
    """Each option left at ``"auto"`` chosen from ``look`` (the module docstring's table); ValueError (one line)
    for a value that is not valid. ``look`` may be None only when nothing is ``"auto"`` that needs it."""
    auto: list[str] = []

    def pick(name: str, given, default):
        if given != "auto":
            return given
        auto.append(name)
        return default()

    channels = pick("channels", channels, lambda: 1 if look.grey else 3)
    if channels not in (1, 3):
        raise ValueError(f"dataset option channels must be auto, 1 or 3, got {channels!r}")
    if img_size == "auto":  # the images' side, cut down to a whole number of patches
        side = min(look.side, MAX_AUTO_SIZE)
        patch_size = patch_size or auto_patch(side)
        img_size = pick("img_size", img_size, lambda: max(patch_size, side - side % patch_size))
    if isinstance(img_size, bool) or not isinstance(img_size, int) or img_size < 1:
        raise ValueError(f"dataset option img_size must be auto or a positive integer, got {img_size!r}")
    patch_size = patch_size or auto_patch(img_size)
    if img_size % patch_size:
        raise ValueError(f"img_size {img_size} is not a multiple of the patch size {patch_size}")
    crop = pick("crop", crop, lambda: "shift" if channels == 1 or img_size < 64 else "resized")
    if crop not in CROPS[1:]:
        raise ValueError(f"dataset option crop must be one of {', '.join(CROPS)}, got {crop!r}")
    flip = pick("flip", flip, lambda: channels == 3)
    if not isinstance(flip, bool):
        raise ValueError(f"dataset option flip must be auto, true or false, got {flip!r}")
    color_jitter = pick("color_jitter", color_jitter, lambda: 0.4 if channels == 3 and crop == "resized" else 0.0)
    if isinstance(color_jitter, bool) or not isinstance(color_jitter, (int, float)) or color_jitter < 0:
        raise ValueError(f"dataset option color_jitter must be auto or a number >= 0, got {color_jitter!r}")
    return Fit(channels=channels, img_size=img_size, patch_size=patch_size, crop=crop, flip=flip,
               color_jitter=float(color_jitter), look=look, auto=tuple(auto))
