"""Batched, per-sample, seeded training augmentation that runs on whatever device the batch is on.

The in-memory datasets cut each batch from one uint8 (N, C, H, W) tensor, so augmentation works on whole batches
instead of one image at a time. This module gives batched equivalents of the per-image torchvision pipeline of the
orthogonal-residual paper's ViT-S/CIFAR-10 recipe::

    RandomCrop(32, padding=4, padding_mode="reflect") -> RandomHorizontalFlip() -> RandAugment(9, 5)
    -> ColorJitter(0.4, 0.4, 0.4, 0.1) -> ToTensor -> RandomErasing(0.25, value="random") -> Normalize
    -> timm Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1) on the batch

as :func:`random_crop`, :func:`random_hflip`, :class:`BatchRandAugment`, :class:`BatchColorJitter`,
:class:`BatchRandomErasing` and :class:`SeededMixup`. The design, shared by all of them:

* Per sample. Every image gets its own random parameters (offset, op, factor, box), as in the per-image
  pipeline; nothing is drawn once for the whole batch (except Mixup, which is per batch in timm too).
* CPU-drawn. Every random number comes from the ``torch.Generator`` passed in, a CPU generator seeded by
  (seed, epoch, rank) (``data.common.seeded_generator``), as small tensors of per-sample parameters that are then
  moved to ``images.device``. So every residual variant of a study sees the same augmentation for the same seed
  (paired comparisons), whatever device the images are on, and the same draws on CPU and CUDA.
* Device-agnostic. The images may live on any device; outputs are on the same device, with the same shape and
  dtype. Where samples must be grouped (by RandAugment op, by colour-jitter step), the grouping is done on the
  CPU-drawn parameters, so the only host-device traffic is index/parameter uploads, never a read-back.
* Vectorised. No Python loop over samples; the loops are over a handful of op groups (at most 23 per RandAugment
  layer, 16 per colour jitter), each group going through one batched torchvision functional call.
* Reproducible. The number of random draws depends only on the batch shape and the constructor arguments, never
  on the image content, so a given generator state always yields the same augmentation.

The semantics (op spaces, magnitudes, factor ranges, rounding) follow torchvision's v2 transforms and timm's Mixup;
the random *streams* do not (torchvision draws per image from the global RNG), except where noted.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import torch
from timm.data.mixup import Mixup, mixup_target
from torchvision.transforms.v2 import InterpolationMode, RandAugment
from torchvision.transforms.v2 import functional as TF

# Private torchvision helpers: the RGB <-> HSV conversions of F.adjust_hue (tests/test_augment.py guards them).
from torchvision.transforms.v2.functional._color import _hsv_to_rgb, _rgb_to_hsv

from data.common import seeded_global_rngs

PADDING_MODES = ("constant", "edge", "reflect", "symmetric")


def _max_value(dtype: torch.dtype) -> float:
    """The value of a white pixel: 1.0 for float images, the dtype's maximum for integer ones (as torchvision)."""
    return 1.0 if dtype.is_floating_point else float(torch.iinfo(dtype).max)


def _padded_source(position: torch.Tensor, size: int, padding_mode: str) -> torch.Tensor:
    """Map positions along one axis of the padded image (0 = first real pixel) to indices into the real pixels.

    Follows torch/torchvision padding: "edge" repeats the border pixel, "reflect" mirrors without repeating it
    (``dcb|abcd|cba``), "symmetric" mirrors with it (``cba|abcd|dcb``). "constant" positions outside the image are
    clamped here and masked by the caller.
    """
    if padding_mode == "reflect":
        position = position.abs()
        position = torch.where(position > size - 1, 2 * (size - 1) - position, position)
    elif padding_mode == "symmetric":
        position = torch.where(position < 0, -position - 1, position)
        position = torch.where(position > size - 1, 2 * size - 1 - position, position)
    return position.clamp(0, size - 1)


def random_crop(
    images: torch.Tensor, padding: int, generator: torch.Generator, padding_mode: str = "constant"
) -> torch.Tensor:
    """Crop each image at its own random offset from the batch padded by ``padding`` on every side.

    torchvision's ``RandomCrop(size=(H, W), padding=padding, padding_mode=padding_mode)`` per image: the offset
    (top, left) is uniform in [0, 2 * padding]. Padding is "constant" (zeros), "edge", "reflect" or "symmetric"
    (reflect needs ``padding < H, W``, symmetric ``padding <= H, W``). Works for any dtype; the output has the
    shape, dtype and device of ``images``.

    The offsets are drawn exactly as the former ``data.loader.random_shift`` drew them, and a constant crop
    equals its output bit for bit for the same generator state (so results stored with it reproduce). The padded
    batch is never built: each output pixel is gathered from the source pixel it maps to.
    """
    if padding_mode not in PADDING_MODES:
        raise ValueError(f"padding_mode must be one of {PADDING_MODES}, got {padding_mode!r}")
    b, c, h, w = images.shape
    limit = min(h, w) - (1 if padding_mode == "reflect" else 0)
    if padding < 0 or (padding_mode in ("reflect", "symmetric") and padding > limit):
        raise ValueError(f"padding {padding} is out of range for {padding_mode!r} padding of {h}x{w} images")
    offsets = torch.randint(0, 2 * padding + 1, (2, b, 1), generator=generator)  # as random_shift: (rows, cols)
    rows = offsets[0] + torch.arange(h) - padding  # (B, H): row of the unpadded image read by each output row
    cols = offsets[1] + torch.arange(w) - padding  # (B, W)
    flat_index = _padded_source(rows, h, padding_mode)[:, :, None] * w + _padded_source(cols, w, padding_mode)[:, None]
    flat_index = flat_index.view(b, 1, h * w).to(images.device).expand(b, c, h * w)
    out = images.reshape(b, c, h * w).gather(2, flat_index).view(b, c, h, w)
    if padding_mode == "constant":
        outside = ((rows < 0) | (rows >= h))[:, :, None] | ((cols < 0) | (cols >= w))[:, None, :]  # (B, H, W)
        out = out.masked_fill_(outside[:, None].to(images.device), 0)
    return out


def random_hflip(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Mirror each image left-right with probability 1/2 (torchvision's ``RandomHorizontalFlip()`` per image).

    Draws exactly as the former ``data.loader.random_hflip`` and gives the same output bit for bit, on any device.
    """
    flip = torch.rand(len(images), generator=generator) < 0.5
    return torch.where(flip.to(images.device)[:, None, None, None], images.flip(-1), images)


def _groups(keys: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield (key, CPU indices of the samples with that key) for each distinct value of a CPU int tensor."""
    values, counts = torch.unique(keys, sorted=True, return_counts=True)
    order = torch.argsort(keys, stable=True)
    yield from zip(values.tolist(), order.split(counts.tolist()), strict=True)


class BatchRandAugment:
    """torchvision v2 ``RandAugment`` applied per sample to a batch: each image draws its own op per layer.

    The op space (Identity, ShearX, ShearY, TranslateX, TranslateY, Rotate, Brightness, Color, Contrast,
    Sharpness, Posterize, Solarize, AutoContrast, Equalize), the magnitudes (bin ``magnitude`` of
    ``num_magnitude_bins``), the sign rule (a signed op is negated when ``U(0, 1) <= 0.5``) and the interpolation
    (NEAREST) are torchvision's: the op table is read from a torchvision ``RandAugment`` held in ``self.policy``,
    through its private ``_AUGMENTATION_SPACE`` and ``_apply_image_or_video_transform`` (tests/test_augment.py
    fails loudly if torchvision changes them). For each of the ``num_ops`` layers, the samples that drew the same
    (op, sign) form a group, and the group goes through torchvision's functional op once (the magnitude is the
    same for every sample, so a group shares all parameters).

    Expects uint8 (B, C, H, W) images with C = 1 or 3, as torchvision's RandAugment; returns the same dtype.
    ``fill`` is the value of pixels moved in from outside by the geometric ops; torchvision's default None gives
    zeros (with NEAREST interpolation, the same output as 0, without the extra mask channel).
    """

    def __init__(
        self,
        num_ops: int,
        magnitude: int,
        num_magnitude_bins: int = 31,
        fill: float | Sequence[float] | None = None,
    ) -> None:
        if not 0 <= magnitude < num_magnitude_bins:
            raise ValueError(f"magnitude must be in [0, {num_magnitude_bins}), got {magnitude}")
        self.policy = RandAugment(
            num_ops=num_ops,
            magnitude=magnitude,
            num_magnitude_bins=num_magnitude_bins,
            interpolation=InterpolationMode.NEAREST,
            fill=fill,
        )
        self.num_ops = num_ops
        self.magnitude = magnitude
        self.num_magnitude_bins = num_magnitude_bins
        space = self.policy._AUGMENTATION_SPACE
        self.op_names: tuple[str, ...] = tuple(space)
        self.signed = torch.tensor([signed for _, signed in space.values()])

    def draw(self, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-layer, per-sample choices: op ids (num_ops, B) indexing ``op_names``, and signs (num_ops, B) of +-1.

        A sign is -1 only for a signed op whose coin came up ``<= 0.5`` (torchvision's rule); unsigned ops get +1.
        """
        ops = torch.randint(len(self.op_names), (self.num_ops, batch_size), generator=generator)
        negate = torch.rand((self.num_ops, batch_size), generator=generator) <= 0.5
        signs = torch.where(self.signed[ops] & negate, -1, 1)
        return ops, signs

    def op_magnitude(self, op: int, height: int, width: int) -> float:
        """The unsigned magnitude of op ``op`` for (height, width) images (0.0 for ops without one), as torchvision."""
        magnitudes_fn, _ = self.policy._AUGMENTATION_SPACE[self.op_names[op]]
        magnitudes = magnitudes_fn(self.num_magnitude_bins, height, width)
        return 0.0 if magnitudes is None else float(magnitudes[self.magnitude])

    def apply_op(self, images: torch.Tensor, op: int, sign: int) -> torch.Tensor:
        """Apply op ``op`` with sign ``sign`` to every image of ``images`` through torchvision's own op table."""
        magnitude = sign * self.op_magnitude(op, images.shape[-2], images.shape[-1])
        return self.policy._apply_image_or_video_transform(
            images, self.op_names[op], magnitude, interpolation=self.policy.interpolation, fill=self.policy._fill
        )

    def apply(self, images: torch.Tensor, ops: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
        """Apply the choices of :meth:`draw` (CPU tensors) layer by layer, one torchvision call per (op, sign) group."""
        out = images.clone()
        for layer_ops, layer_signs in zip(ops, signs, strict=True):
            for key, index in _groups(layer_ops * 2 + (layer_signs < 0)):
                op, negative = divmod(key, 2)
                if self.op_names[op] == "Identity":
                    continue
                index = index.to(images.device)
                out[index] = self.apply_op(out[index], op, -1 if negative else 1)
        return out

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Draw per-sample choices from ``generator`` and apply them."""
        ops, signs = self.draw(len(images), generator)
        return self.apply(images, ops, signs)


class BatchColorJitter:
    """torchvision v2 ``ColorJitter`` applied per sample: each image draws its own factors and its own op order.

    Factors are drawn as torchvision draws them: brightness, contrast and saturation uniform in
    [max(0, 1 - v), 1 + v], hue uniform in [-h, h] (an argument of 0 disables its op, as torchvision); each image
    applies the four ops in its own uniformly random order (torchvision permutes them per call, i.e. per image).
    torchvision's functional ``adjust_*`` take one scalar factor, so the ops are re-implemented here with
    per-sample factors, following its tensor kernels (``functional/_color.py``) step for step, including its
    float32 arithmetic and truncating uint8 casts: brightness scales, contrast blends with the mean of the
    (floored) grayscale, saturation blends with the (floored) grayscale, hue shifts H in RGB -> HSV -> RGB (via
    torchvision's private ``_rgb_to_hsv`` / ``_hsv_to_rgb``). For 1-channel images saturation and hue are no-ops,
    as in torchvision. Works for uint8 and float images in [0, 1]; the output has the input's dtype.
    """

    OPS = ("brightness", "contrast", "saturation", "hue")

    def __init__(self, brightness: float, contrast: float, saturation: float, hue: float) -> None:
        for name, value in zip(self.OPS, (brightness, contrast, saturation, hue), strict=True):
            if value < 0:
                raise ValueError(f"{name} must be non-negative, got {value}")
        if hue > 0.5:
            raise ValueError(f"hue must be in [0, 0.5], got {hue}")
        self.ranges: tuple[tuple[float, float] | None, ...] = (
            (max(0.0, 1.0 - brightness), 1.0 + brightness) if brightness else None,
            (max(0.0, 1.0 - contrast), 1.0 + contrast) if contrast else None,
            (max(0.0, 1.0 - saturation), 1.0 + saturation) if saturation else None,
            (-hue, hue) if hue else None,
        )

    def draw(self, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample choices: ``order`` (B, 4), a permutation of the op ids 0-3 (``OPS``) per row, and ``factors``
        (B, 4) float32, the factor of each op (neutral, 1 or 0, for a disabled op)."""
        order = torch.rand((batch_size, 4), generator=generator).argsort(dim=1)
        factors = torch.tensor([1.0, 1.0, 1.0, 0.0]).repeat(batch_size, 1)
        for op, bounds in enumerate(self.ranges):
            if bounds is not None:
                factors[:, op].uniform_(*bounds, generator=generator)
        return order, factors

    def apply(self, images: torch.Tensor, order: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
        """Apply the choices of :meth:`draw` (CPU tensors): at each of the 4 steps, one call per op group."""
        out = images.clone()
        factors = factors.to(images.device)
        enabled = [op for op, bounds in enumerate(self.ranges) if bounds is not None]
        if images.shape[1] == 1:  # grayscale: torchvision returns the image unchanged for saturation and hue
            enabled = [op for op in enabled if self.OPS[op] in ("brightness", "contrast")]
        for step in range(4):
            for op, index in _groups(order[:, step]):
                if op in enabled:
                    index = index.to(images.device)
                    out[index] = self.apply_op(out[index], op, factors[index, op])
        return out

    def apply_op(self, images: torch.Tensor, op: int, factors: torch.Tensor) -> torch.Tensor:
        """Adjust ``images`` (B, C, H, W) by op ``op`` (index into ``OPS``) with per-sample ``factors`` (B,)."""
        name = self.OPS[op]
        if name == "hue":
            return self._adjust_hue(images, factors)
        factor = factors.view(-1, 1, 1, 1)
        if name == "brightness":
            return self._clamp_cast(images.mul(factor), images.dtype)
        gray = self._grayscale(images)
        if name == "contrast":
            gray = gray.mean(dim=(-3, -2, -1), keepdim=True)
        # torchvision's _blend: image * f + gray * (1 - f). It adds with ``alpha``, which torch's vectorised kernel
        # fuses into one multiply-add; addcmul rounds the same way (the tests check bit-equality on uint8), whereas
        # a separate product and sum lands one grey level off in a few pixels in 10,000.
        return self._clamp_cast(torch.addcmul(images.mul(factor), gray, 1.0 - factor), images.dtype)

    @staticmethod
    def _clamp_cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Clamp to the valid range and cast back, truncating as torchvision does."""
        return x.clamp_(0, _max_value(dtype)).to(dtype)

    @staticmethod
    def _grayscale(images: torch.Tensor) -> torch.Tensor:
        """Float grayscale (B, 1, H, W): luma of RGB (floored for integer images, as torchvision), or the image."""
        gray = TF.rgb_to_grayscale(images) if images.shape[1] == 3 else images  # uint8 output truncates = floors
        return gray if gray.is_floating_point() else gray.to(torch.float32)

    @staticmethod
    def _adjust_hue(images: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
        """Shift the hue of each image by its factor (torchvision ``adjust_hue_image`` with per-sample factors)."""
        hsv = _rgb_to_hsv(TF.to_dtype(images, torch.float32, scale=True))
        h, s, v = hsv.unbind(dim=-3)
        h = h.add(factors.view(-1, 1, 1)).remainder_(1.0)
        return TF.to_dtype(_hsv_to_rgb(torch.stack((h, s, v), dim=-3)), images.dtype, scale=True)

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Draw per-sample factors and orders from ``generator`` and apply them."""
        order, factors = self.draw(len(images), generator)
        return self.apply(images, order, factors)


class ErasingBoxes(NamedTuple):
    """Per-sample boxes of :class:`BatchRandomErasing`, CPU int64 (B,) tensors (box fields are 0 where not erased)."""

    erase: torch.Tensor  # bool
    top: torch.Tensor
    left: torch.Tensor
    height: torch.Tensor
    width: torch.Tensor


class BatchRandomErasing:
    """torchvision v2 ``RandomErasing`` applied per sample to a float batch (in [0, 1], before normalisation).

    Each image is erased with probability ``p``. Its box is sampled as torchvision samples it: up to 10 tries of
    area ``U(scale) * H * W`` and aspect ratio ``exp(U(log ratio))``, ``h = round(sqrt(area * r))``,
    ``w = round(sqrt(area / r))``; the first try with ``h < H`` and ``w < W`` is kept (no try fits: not erased);
    the top-left corner is uniform over the positions where the box fits. Vectorised: the 10 tries of every sample
    are drawn at once and the first acceptable one is picked. The box is filled with ``value``: a number, one
    number per channel, or "random" for i.i.d. standard-normal pixels (as torchvision, which draws them in
    float32 whatever the image range).
    """

    NUM_TRIES = 10

    def __init__(
        self,
        p: float,
        scale: tuple[float, float] = (0.02, 0.33),
        ratio: tuple[float, float] = (0.3, 3.3),
        value: str | float | Sequence[float] = "random",
    ) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {p}")
        if not 0.0 <= scale[0] <= scale[1] <= 1.0:
            raise ValueError(f"scale must be (min, max) within [0, 1], got {scale}")
        if not 0.0 < ratio[0] <= ratio[1]:
            raise ValueError(f"ratio must be (min, max) with 0 < min, got {ratio}")
        if isinstance(value, str) and value != "random":
            raise ValueError(f"value must be a number, a sequence of numbers or 'random', got {value!r}")
        self.p = p
        self.scale = scale
        self.ratio = ratio
        self.value = value

    def draw(self, batch_size: int, height: int, width: int, generator: torch.Generator) -> ErasingBoxes:
        """Per-sample boxes for (height, width) images, drawn on the CPU from ``generator``."""
        coin = torch.rand(batch_size, generator=generator) < self.p
        tries = (batch_size, self.NUM_TRIES)
        area = height * width * torch.empty(tries).uniform_(*self.scale, generator=generator).double()
        log_ratio = torch.empty(tries).uniform_(math.log(self.ratio[0]), math.log(self.ratio[1]), generator=generator)
        aspect = log_ratio.exp().double()  # float32 exp then double arithmetic, as torchvision's .item() + math
        h = (area * aspect).sqrt().round().long()  # round half to even, as Python's round
        w = (area / aspect).sqrt().round().long()
        fits = (h < height) & (w < width)
        first = fits.int().argmax(dim=1, keepdim=True)  # index of the first acceptable try (0 when none is)
        erase = coin & fits.any(dim=1)
        h = torch.where(erase, h.gather(1, first).squeeze(1), 0)
        w = torch.where(erase, w.gather(1, first).squeeze(1), 0)
        corner = torch.rand((2, batch_size), generator=generator).double()
        top = torch.where(erase, (corner[0] * (height - h + 1)).floor().long().clamp_(max=height - h), 0)
        left = torch.where(erase, (corner[1] * (width - w + 1)).floor().long().clamp_(max=width - w), 0)
        return ErasingBoxes(erase, top, left, h, w)

    def apply(self, images: torch.Tensor, boxes: ErasingBoxes, generator: torch.Generator) -> torch.Tensor:
        """Fill the boxes of :meth:`draw`; "random" draws standard-normal pixels for the erased samples only."""
        b, c, h, w = images.shape
        out = images.clone()
        index = boxes.erase.nonzero().squeeze(1)
        if len(index) == 0:
            return out
        top, left, bh, bw = (t[index, None] for t in boxes[1:])
        rows, cols = torch.arange(h), torch.arange(w)
        inside = ((rows >= top) & (rows < top + bh))[:, :, None] & ((cols >= left) & (cols < left + bw))[:, None, :]
        if self.value == "random":
            if not images.is_floating_point():
                raise TypeError(f"value='random' needs float images, got {images.dtype}")
            fill = torch.randn((len(index), c, h, w), generator=generator).to(images.device, images.dtype)
        else:
            values = torch.tensor(self.value, dtype=torch.float32).reshape(-1)
            if len(values) not in (1, c):
                raise ValueError(f"value must have 1 or {c} (number of channels) entries, got {len(values)}")
            fill = values.to(images.device, images.dtype).view(1, -1, 1, 1)
        index = index.to(images.device)
        out[index] = torch.where(inside[:, None].to(images.device), fill, out[index])
        return out

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Draw per-sample boxes from ``generator`` and erase them."""
        boxes = self.draw(len(images), images.shape[-2], images.shape[-1], generator)
        return self.apply(images, boxes, generator)


class SeededMixup:
    """timm's ``Mixup`` (mode "batch") with its randomness taken from our generator.

    timm draws lambda, the mixup/cutmix switch and the cutmix box from numpy's global RNG; each call draws one seed
    from ``generator`` and runs timm under :func:`seeded_global_rngs`, so the mixing is reproducible per
    generator state and the global RNG states are left as they were. The arguments are timm's; ``prob`` is the
    probability of mixing a batch at all, ``switch_prob`` of cutmix instead of mixup when both are enabled.

    As timm, image ``i`` is mixed with image ``B - 1 - i`` (the flipped batch). timm requires an even batch; for an
    odd one (say the last batch of an epoch), the first ``B - 1`` images are mixed among themselves and the last
    image is passed through unmixed with its label-smoothed one-hot target (one image per epoch at most, so
    training is unaffected, and no error in the middle of a run).
    """

    def __init__(
        self,
        mixup_alpha: float = 1.0,
        cutmix_alpha: float = 0.0,
        prob: float = 1.0,
        switch_prob: float = 0.5,
        label_smoothing: float = 0.1,
        num_classes: int = 1000,
        cutmix_minmax: tuple[float, float] | None = None,
        correct_lam: bool = True,
    ) -> None:
        self.mixup = Mixup(
            mixup_alpha=mixup_alpha,
            cutmix_alpha=cutmix_alpha,
            cutmix_minmax=cutmix_minmax,
            prob=prob,
            switch_prob=switch_prob,
            mode="batch",
            correct_lam=correct_lam,
            label_smoothing=label_smoothing,
            num_classes=num_classes,
        )
        self.num_classes = num_classes
        self.label_smoothing = label_smoothing

    def __call__(
        self, images: torch.Tensor, labels: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mix a float batch (B, C, H, W) with int labels (B,) into (mixed images, float soft targets (B, classes)).

        Both outputs are new tensors on ``images.device`` (the inputs are not modified).
        """
        seed = int(torch.randint(0, 2**32, (), generator=generator))  # one draw per call, whatever the batch
        labels = labels.to(images.device)
        even = len(images) - len(images) % 2
        if even == 0:
            return images.clone(), self._smoothed_one_hot(labels)
        with seeded_global_rngs(seed):
            mixed, targets = self.mixup(images[:even].clone(), labels[:even])  # timm mixes in place
        if even == len(images):
            return mixed, targets
        rest = images[even:]
        return torch.cat((mixed, rest)), torch.cat((targets, self._smoothed_one_hot(labels[even:])))

    def _smoothed_one_hot(self, labels: torch.Tensor) -> torch.Tensor:
        return mixup_target(labels, self.num_classes, lam=1.0, smoothing=self.label_smoothing)
