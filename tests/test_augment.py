"""data/augment.py: every sample of a batched augmentation equals torchvision's / timm's op on that sample alone."""

from __future__ import annotations

import inspect
import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import InterpolationMode, RandAugment
from torchvision.transforms.v2 import functional as TF

from data.augment import (
    PADDING_MODES,
    BatchColorJitter,
    BatchRandAugment,
    BatchRandomErasing,
    SeededMixup,
    random_crop,
    random_hflip,
)

pytestmark = pytest.mark.usefixtures("one_thread")

NEAREST = InterpolationMode.NEAREST
RANDAUGMENT_OPS = (
    "Identity",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Rotate",
    "Brightness",
    "Color",
    "Contrast",
    "Sharpness",
    "Posterize",
    "Solarize",
    "AutoContrast",
    "Equalize",
)
SIGNED_OPS = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast", "Sharpness"}


# Frozen copies of data/loader.py's random_shift / random_hflip as committed before data/augment.py replaced them:
# results stored with them must reproduce, so random_crop / random_hflip must equal them bit for bit.
def random_shift(images: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    b, c, h, w = images.shape
    padded = F.pad(images, (max_shift,) * 4)
    offsets = torch.randint(0, 2 * max_shift + 1, (2, b, 1), generator=generator)
    rows = offsets[0] + torch.arange(h)  # (B, H): padded row read for each output row
    cols = offsets[1] + torch.arange(w)  # (B, W)
    flat_index = (rows[:, :, None] * padded.shape[-1] + cols[:, None, :]).view(b, 1, h * w).expand(b, c, h * w)
    return padded.flatten(2).gather(2, flat_index).view(b, c, h, w)


def loader_random_hflip(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    flip = torch.rand(len(images), generator=generator) < 0.5
    return torch.where(flip[:, None, None, None], images.flip(-1), images)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def images_uint8(b: int, c: int = 3, h: int = 32, w: int = 32, seed: int = 0) -> torch.Tensor:
    """Smooth random shapes plus noise: geometric ops move content, colour ops have a range to work on."""
    g = gen(seed)
    smooth = F.interpolate(torch.rand((b, c, 4, 4), generator=g), size=(h, w), mode="bilinear", align_corners=False)
    noisy = smooth * 230 + torch.rand((b, c, h, w), generator=g) * 25
    return noisy.clamp(0, 255).to(torch.uint8)


# ----------------------------------------------------------------------------------------------- crop and flip


@pytest.mark.parametrize("max_shift", [0, 1, 4])
def test_constant_crop_is_bit_identical_to_the_old_random_shift(max_shift):
    x = torch.rand((16, 3, 12, 10), generator=gen(0))
    g_crop, g_shift = gen(7), gen(7)
    assert torch.equal(random_crop(x, max_shift, g_crop), random_shift(x, max_shift, g_shift))
    assert torch.equal(torch.rand(4, generator=g_crop), torch.rand(4, generator=g_shift))  # same draws consumed
    u = images_uint8(16, h=12, w=10)
    out = random_crop(u, max_shift, gen(3))
    assert out.dtype == torch.uint8
    assert torch.equal(out.float(), random_shift(u.float(), max_shift, gen(3)))


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_crop_of_each_sample_equals_torchvision_pad_then_crop(padding_mode):
    x = images_uint8(12, h=9, w=11)
    padding = 4
    out = random_crop(x, padding, gen(5), padding_mode=padding_mode)
    offsets = torch.randint(0, 2 * padding + 1, (2, 12, 1), generator=gen(5))  # (top, left) per sample
    assert len(set(offsets[0].flatten().tolist())) > 3 and len(set(offsets[1].flatten().tolist())) > 3
    for i in range(len(x)):
        padded = TF.pad(x[i], [padding], padding_mode=padding_mode)
        expected = TF.crop(padded, int(offsets[0, i]), int(offsets[1, i]), 9, 11)
        assert torch.equal(out[i], expected), i


def test_crop_rejects_out_of_range_reflect_padding():
    with pytest.raises(ValueError, match="out of range"):
        random_crop(torch.zeros(2, 1, 4, 4), 4, gen(0), padding_mode="reflect")
    with pytest.raises(ValueError, match="padding_mode"):
        random_crop(torch.zeros(2, 1, 4, 4), 1, gen(0), padding_mode="wrap")


def test_hflip_is_bit_identical_to_the_old_random_hflip():
    x = images_uint8(32)
    out = random_hflip(x, gen(4))
    assert torch.equal(out, loader_random_hflip(x, gen(4)))
    flipped = torch.tensor([torch.equal(o, xi.flip(-1)) for o, xi in zip(out, x, strict=True)])
    kept = torch.tensor([torch.equal(o, xi) for o, xi in zip(out, x, strict=True)])
    assert (flipped | kept).all() and flipped.any() and kept.any()


# ----------------------------------------------------------------------------------------------- RandAugment


def test_torchvision_randaugment_private_members_are_as_expected():
    """BatchRandAugment reads these private torchvision members; this fails loudly if torchvision changes them."""
    space = RandAugment._AUGMENTATION_SPACE
    assert tuple(space) == RANDAUGMENT_OPS
    assert {name for name, (_, signed) in space.items() if signed} == SIGNED_OPS
    params = list(inspect.signature(RandAugment._apply_image_or_video_transform).parameters)
    assert params == ["self", "image", "transform_id", "magnitude", "interpolation", "fill"]
    policy = RandAugment(num_ops=2, magnitude=5, interpolation=NEAREST)
    assert policy._fill == {"others": None}
    aug = BatchRandAugment(num_ops=2, magnitude=5)
    assert aug.op_names == RANDAUGMENT_OPS


def reference_randaugment_op(image: torch.Tensor, name: str, sign: int, magnitude: int, bins: int) -> torch.Tensor:
    """torchvision v2 RandAugment's op ``name`` on one image, written out with public functional ops."""
    h, w = image.shape[-2:]

    def level(top: float) -> float:
        return sign * float(torch.linspace(0.0, top, bins)[magnitude])

    if name == "Identity":
        return image
    if name in ("ShearX", "ShearY"):
        shear = math.degrees(math.atan(level(0.3)))
        shear_xy = [shear, 0.0] if name == "ShearX" else [0.0, shear]
        return TF.affine(image, 0.0, [0, 0], 1.0, shear_xy, interpolation=NEAREST, center=[0, 0])
    if name == "TranslateX":
        return TF.affine(image, 0.0, [int(level(150.0 / 331.0 * w)), 0], 1.0, [0.0, 0.0], interpolation=NEAREST)
    if name == "TranslateY":
        return TF.affine(image, 0.0, [0, int(level(150.0 / 331.0 * h))], 1.0, [0.0, 0.0], interpolation=NEAREST)
    if name == "Rotate":
        return TF.rotate(image, level(30.0), interpolation=NEAREST)
    if name == "Brightness":
        return TF.adjust_brightness(image, 1.0 + level(0.9))
    if name == "Color":
        return TF.adjust_saturation(image, 1.0 + level(0.9))
    if name == "Contrast":
        return TF.adjust_contrast(image, 1.0 + level(0.9))
    if name == "Sharpness":
        return TF.adjust_sharpness(image, 1.0 + level(0.9))
    if name == "Posterize":
        return TF.posterize(image, int((8 - torch.arange(bins) / ((bins - 1) / 4)).round().int()[magnitude]))
    if name == "Solarize":
        return TF.solarize(image, 255.0 * float(torch.linspace(1.0, 0.0, bins)[magnitude]))
    if name == "AutoContrast":
        return TF.autocontrast(image)
    if name == "Equalize":
        return TF.equalize(image)
    raise AssertionError(name)


@pytest.mark.parametrize(("channels", "magnitude"), [(3, 5), (3, 9), (1, 9)])
def test_randaugment_each_sample_equals_torchvision_ops_on_that_image(channels, magnitude):
    x = images_uint8(48, c=channels, seed=1)
    aug = BatchRandAugment(num_ops=2, magnitude=magnitude)
    ops, signs = aug.draw(len(x), gen(2))
    assert ops.shape == signs.shape == (2, 48)
    drawn = {(aug.op_names[o], s) for o, s in zip(ops.flatten().tolist(), signs.flatten().tolist(), strict=True)}
    assert {name for name, _ in drawn} == set(RANDAUGMENT_OPS)  # every op is exercised
    assert {(name, -1) for name in SIGNED_OPS} & drawn and all(s == 1 for n, s in drawn if n not in SIGNED_OPS)
    out = aug.apply(x, ops, signs)
    assert out.shape == x.shape and out.dtype == torch.uint8
    for i in range(len(x)):
        expected = x[i]
        for layer in range(2):
            name = aug.op_names[int(ops[layer, i])]
            expected = reference_randaugment_op(expected, name, int(signs[layer, i]), magnitude, 31)
        assert torch.equal(out[i], expected), (i, ops[:, i], signs[:, i])
    assert torch.equal(aug(x, gen(2)), out)  # __call__ = draw + apply


def test_randaugment_batch_of_one_equals_torchvision_randaugment_forward():
    """With one image and one layer our draws match torchvision's global-RNG draws, so whole outputs must agree."""
    x = images_uint8(1, seed=3)
    aug = BatchRandAugment(num_ops=1, magnitude=5)
    seen = set()
    for seed in range(60):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            expected = RandAugment(num_ops=1, magnitude=5)(x[0])
        assert torch.equal(aug(x, gen(seed))[0], expected), seed
        ops, signs = aug.draw(1, gen(seed))
        seen.add((aug.op_names[int(ops)], int(signs)))
    assert {name for name, _ in seen} == set(RANDAUGMENT_OPS)


def test_randaugment_differs_across_batch_and_is_reproducible_per_seed():
    x = images_uint8(1, seed=4).expand(32, -1, -1, -1)  # one image, 32 times
    aug = BatchRandAugment(num_ops=9, magnitude=5)
    out = aug(x, gen(0))
    assert len({o.numpy().tobytes() for o in out}) == 32  # every copy got its own ops
    ops, _ = aug.draw(32, gen(0))
    assert all(len(layer.unique()) > 5 for layer in ops)
    assert torch.equal(aug(x, gen(0)), out)
    assert not torch.equal(aug(x, gen(1)), out)


def test_randaugment_runs_on_one_channel_images():
    x = images_uint8(16, c=1, h=28, w=28, seed=5)
    out = BatchRandAugment(num_ops=9, magnitude=5)(x, gen(0))
    assert out.shape == x.shape and out.dtype == torch.uint8 and not torch.equal(out, x)


# ----------------------------------------------------------------------------------------------- ColorJitter


def test_torchvision_hsv_helpers_are_as_expected():
    """BatchColorJitter uses torchvision's private _rgb_to_hsv/_hsv_to_rgb: their hue shift must equal adjust_hue."""
    from torchvision.transforms.v2.functional._color import _hsv_to_rgb, _rgb_to_hsv

    x = images_uint8(4)
    for hue in (-0.1, 0.0, 0.07):
        batched = BatchColorJitter._adjust_hue(x, torch.full((4,), hue))
        assert torch.equal(batched, TF.adjust_hue(x, hue))
    rgb = torch.rand((2, 3, 5, 5), generator=gen(0))
    assert torch.allclose(_hsv_to_rgb(_rgb_to_hsv(rgb)), rgb, atol=1e-5)


def reference_color_jitter(image: torch.Tensor, order: list[int], factors: list[float], enabled: list[bool]):
    """torchvision v2 ColorJitter.transform on one image, with given op order and factors."""
    fns = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue)
    for op in order:
        if enabled[op]:
            image = fns[op](image, factors[op])
    return image


@pytest.mark.parametrize(
    ("channels", "dtype", "args"),
    [
        (3, torch.uint8, (0.4, 0.4, 0.4, 0.1)),
        (3, torch.uint8, (0.9, 0.0, 0.6, 0.0)),
        (1, torch.uint8, (0.4, 0.4, 0.4, 0.1)),
        (3, torch.float32, (0.4, 0.4, 0.4, 0.1)),
    ],
)
def test_color_jitter_each_sample_equals_torchvision_ops_on_that_image(channels, dtype, args):
    x = images_uint8(64, c=channels, seed=6)
    if dtype == torch.float32:
        x = x.float() / 255
    jitter = BatchColorJitter(*args)
    order, factors = jitter.draw(len(x), gen(8))
    out = jitter.apply(x, order, factors)
    assert out.shape == x.shape and out.dtype == dtype
    enabled = [v > 0 for v in args]
    expected = torch.stack(
        [reference_color_jitter(x[i], order[i].tolist(), factors[i].tolist(), enabled) for i in range(len(x))]
    )
    if dtype == torch.uint8:  # +-1 for the order of float32 operations before the truncating cast
        diff = (out.int() - expected.int()).abs()
        assert diff.max() <= 1 and (diff == 0).float().mean() > 0.999
    else:
        assert torch.allclose(out, expected, atol=1e-5)
    assert not torch.equal(out, x)
    assert torch.equal(jitter(x, gen(8)), out)  # __call__ = draw + apply


def test_color_jitter_draws_torchvision_ranges_and_per_sample_orders():
    jitter = BatchColorJitter(0.4, 0.4, 0.4, 0.1)
    order, factors = jitter.draw(2000, gen(9))
    assert torch.equal(order.sort(dim=1).values, torch.arange(4).expand(2000, 4))  # a permutation per sample
    assert len({tuple(row) for row in order.tolist()}) == 24  # all 4! orders occur
    low, high = factors.min(dim=0).values, factors.max(dim=0).values
    assert (
        torch.allclose(low, torch.tensor([0.6, 0.6, 0.6, -0.1]), atol=0.01)
        and (low >= torch.tensor([0.6] * 3 + [-0.1])).all()
    )
    assert (
        torch.allclose(high, torch.tensor([1.4, 1.4, 1.4, 0.1]), atol=0.01)
        and (high <= torch.tensor([1.4] * 3 + [0.1])).all()
    )
    order_off, factors_off = BatchColorJitter(0.0, 0.5, 0.0, 0.0).draw(100, gen(9))
    assert (factors_off[:, [0, 2]] == 1).all() and (factors_off[:, 3] == 0).all()  # disabled ops: neutral
    assert len(factors_off[:, 1].unique()) == 100 and order_off.shape == (100, 4)


def test_color_jitter_differs_across_batch_and_is_reproducible_per_seed():
    x = images_uint8(1, seed=10).expand(16, -1, -1, -1)
    jitter = BatchColorJitter(0.4, 0.4, 0.4, 0.1)
    out = jitter(x, gen(0))
    assert len({o.numpy().tobytes() for o in out}) == 16
    assert torch.equal(jitter(x, gen(0)), out)
    assert not torch.equal(jitter(x, gen(1)), out)


# ----------------------------------------------------------------------------------------------- RandomErasing


def test_erasing_erases_a_fraction_p_of_samples():
    for p in (0.0, 0.25, 1.0):
        boxes = BatchRandomErasing(p).draw(4000, 32, 32, gen(11))
        assert abs(boxes.erase.float().mean().item() - p) < 0.03, p
    x = torch.rand((8, 3, 32, 32), generator=gen(0))
    assert torch.equal(BatchRandomErasing(0.0)(x, gen(0)), x)


def test_erasing_boxes_follow_torchvision_sampling_ranges():
    h_img, w_img, scale, ratio = 32, 24, (0.02, 0.33), (0.3, 3.3)
    boxes = BatchRandomErasing(1.0, scale, ratio).draw(3000, h_img, w_img, gen(12))
    e = boxes.erase
    assert e.float().mean() > 0.99
    top, left, h, w = (t[e].double() for t in boxes[1:])
    area = h_img * w_img
    # h = round(sqrt(a r)), w = round(sqrt(a / r)) with a in scale * area and r in ratio: undo the rounding by +-0.5
    assert ((h - 0.5) * (w - 0.5) <= scale[1] * area + 1e-9).all() and ((h + 0.5) * (w + 0.5) >= scale[0] * area).all()
    assert ((h - 0.5) / (w + 0.5) <= ratio[1]).all() and ((h + 0.5) / (w - 0.5) >= ratio[0]).all()
    assert (h >= 1).all() and (h < h_img).all() and (w >= 1).all() and (w < w_img).all()
    assert (top >= 0).all() and (top + h <= h_img).all() and (left >= 0).all() and (left + w <= w_img).all()
    assert (top == 0).any() and (top + h == h_img).any() and (left == 0).any() and (left + w == w_img).any()
    assert (h / w).min() < 0.5 and (h / w).max() > 2.0  # the aspect range is used
    assert (boxes.height[~e] == 0).all() and (boxes.top[~e] == 0).all()


@pytest.mark.parametrize("value", ["random", (0.25, 0.5, 0.75)])
def test_erasing_fills_exactly_the_drawn_boxes(value):
    x = torch.rand((64, 3, 20, 16), generator=gen(0))
    erasing = BatchRandomErasing(0.5, value=value)
    out = erasing(x, gen(13))
    boxes = erasing.draw(64, 20, 16, gen(13))
    assert 10 < int(boxes.erase.sum()) < 54
    rows, cols = torch.arange(20), torch.arange(16)
    inside = [
        ((rows >= top) & (rows < top + h))[:, None] & ((cols >= left) & (cols < left + w))[None, :]
        for top, left, h, w in zip(*(b.tolist() for b in boxes[1:]), strict=True)
    ]
    inside = torch.stack(inside)[:, None].expand_as(x)  # (B, C, H, W), empty boxes for samples not erased
    assert torch.equal(out[~inside], x[~inside])  # non-erased samples and pixels outside the boxes are unchanged
    if value == "random":
        noise = out[inside]
        assert (noise != x[inside]).all() and abs(noise.mean()) < 0.05 and abs(noise.std() - 1) < 0.05
    else:
        expected = torch.tensor(value).view(1, 3, 1, 1).expand_as(x)
        assert torch.equal(out[inside], expected[inside])
    assert torch.equal(erasing(x, gen(13)), out)
    assert not torch.equal(erasing(x, gen(14)), out)


# ----------------------------------------------------------------------------------------------- Mixup


def smoothed_one_hot(labels: torch.Tensor, num_classes: int, smoothing: float) -> torch.Tensor:
    """Hand-written label smoothing: off = s / K, on = 1 - s + s / K."""
    target = torch.full((len(labels), num_classes), smoothing / num_classes)
    target[torch.arange(len(labels)), labels] = 1.0 - smoothing + smoothing / num_classes
    return target


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_mixup_target_is_lam_mix_of_smoothed_one_hots(smoothing):
    levels = torch.arange(1.0, 7.0) / 10  # image i is the constant (i + 1) / 10
    x = levels.view(6, 1, 1, 1).expand(6, 3, 4, 4).contiguous()
    y = torch.tensor([0, 1, 2, 3, 4, 0])
    mixup = SeededMixup(mixup_alpha=0.8, cutmix_alpha=0.0, label_smoothing=smoothing, num_classes=5)
    for seed in range(5):
        mixed, targets = mixup(x, y, gen(seed))
        lam = ((mixed[0, 0, 0, 0] - levels[5]) / (levels[0] - levels[5])).item()  # mixed[0] = lam x0 + (1-lam) x5
        assert 0.0 <= lam <= 1.0
        assert torch.allclose(mixed, lam * x + (1 - lam) * x.flip(0), atol=1e-6)
        expected = lam * smoothed_one_hot(y, 5, smoothing) + (1 - lam) * smoothed_one_hot(y.flip(0), 5, smoothing)
        assert targets.dtype == torch.float32 and targets.shape == (6, 5)
        assert torch.allclose(targets, expected, atol=1e-6)
        assert torch.allclose(targets.sum(dim=1), torch.ones(6), atol=1e-6)
    assert torch.equal(x, levels.view(6, 1, 1, 1).expand(6, 3, 4, 4))  # the input is not modified


def test_mixup_with_zero_probability_gives_smoothed_one_hots():
    x, y = torch.rand((4, 3, 8, 8), generator=gen(0)), torch.tensor([3, 1, 0, 2])
    mixed, targets = SeededMixup(mixup_alpha=0.8, prob=0.0, label_smoothing=0.1, num_classes=4)(x, y, gen(0))
    assert torch.equal(mixed, x) and torch.allclose(targets, smoothed_one_hot(y, 4, 0.1), atol=1e-7)


def test_cutmix_pastes_a_rectangle_of_the_flipped_batch():
    b, h, w = 8, 32, 32
    x = torch.rand((b, 3, h, w), generator=gen(0))
    y = torch.arange(b) % 10
    cutmix = SeededMixup(mixup_alpha=0.0, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=10)
    boxes = 0
    for seed in range(6):
        mixed, targets = cutmix(x, y, gen(seed))
        changed = (mixed != x).any(dim=1)  # (B, H, W)
        assert (changed == changed[0]).all()  # one box for the whole batch
        rows, cols = changed[0].any(dim=1).nonzero().flatten(), changed[0].any(dim=0).nonzero().flatten()
        area = len(rows) * len(cols)
        if area:
            boxes += 1
            box = torch.zeros((h, w), dtype=torch.bool)
            box[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1] = True
            assert torch.equal(changed[0], box)  # a filled rectangle
            assert torch.equal(mixed[:, :, box], x.flip(0)[:, :, box])
        lam = 1.0 - area / (h * w)  # timm's correct_lam: the pasted fraction
        expected = lam * smoothed_one_hot(y, 10, 0.1) + (1 - lam) * smoothed_one_hot(y.flip(0), 10, 0.1)
        assert torch.allclose(targets, expected, atol=1e-6)
    assert boxes >= 3


@pytest.fixture
def keep_global_rngs():
    """Restore numpy's and Python's global RNG states after a test that seeds them."""
    numpy_state, python_state = np.random.get_state(), random.getstate()
    yield
    np.random.set_state(numpy_state)
    random.setstate(python_state)


def test_mixup_is_reproducible_per_seed_and_restores_global_rng_states(keep_global_rngs):
    x, y = torch.rand((8, 3, 8, 8), generator=gen(0)), torch.arange(8) % 3
    mixup = SeededMixup(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, label_smoothing=0.1, num_classes=3)
    np.random.seed(123)
    random.seed(7)
    numpy_before, python_before = np.random.get_state(), random.getstate()
    mixed, targets = mixup(x, y, gen(5))
    numpy_after = np.random.get_state()
    assert numpy_after[0] == numpy_before[0] and np.array_equal(numpy_after[1], numpy_before[1])
    assert numpy_after[2:] == numpy_before[2:] and random.getstate() == python_before
    np.random.seed(999)  # a different global state must not matter
    random.seed(0)
    again = mixup(x, y, gen(5))
    assert torch.equal(again[0], mixed) and torch.equal(again[1], targets)
    other = mixup(x, y, gen(6))
    assert not torch.equal(other[1], targets)


def test_mixup_odd_batch_mixes_all_but_the_last_image():
    x, y = torch.rand((5, 3, 8, 8), generator=gen(0)), torch.tensor([0, 1, 2, 3, 1])
    mixup = SeededMixup(mixup_alpha=0.8, label_smoothing=0.1, num_classes=4)
    mixed, targets = mixup(x, y, gen(1))
    assert mixed.shape == x.shape and targets.shape == (5, 4)
    assert torch.equal(mixed[4], x[4]) and torch.allclose(targets[4], smoothed_one_hot(y[4:], 4, 0.1)[0])
    even_mixed, even_targets = mixup(x[:4], y[:4], gen(1))  # the first four are mixed as a batch of four
    assert torch.equal(mixed[:4], even_mixed) and torch.equal(targets[:4], even_targets)
    assert not torch.equal(mixed[:4], x[:4])
    assert torch.allclose(targets.sum(dim=1), torch.ones(5), atol=1e-6)
    one_mixed, one_target = mixup(x[:1], y[:1], gen(1))
    assert torch.equal(one_mixed, x[:1]) and torch.allclose(one_target, smoothed_one_hot(y[:1], 4, 0.1))


# ----------------------------------------------------------------------------------------------- the whole recipe


def recipe(images: torch.Tensor, labels: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference ViT-S/CIFAR-10 training pipeline, batched (normalisation left out)."""
    g = gen(seed)
    x = random_crop(images, 4, g, padding_mode="reflect")
    x = random_hflip(x, g)
    x = BatchRandAugment(num_ops=9, magnitude=5)(x, g)
    x = BatchColorJitter(0.4, 0.4, 0.4, 0.1)(x, g)
    x = BatchRandomErasing(0.25)(x.float() / 255, g)
    mixup = SeededMixup(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, label_smoothing=0.1, num_classes=10)
    return mixup(x, labels, g)


def test_recipe_is_reproducible_per_seed():
    images, labels = images_uint8(16, seed=15), torch.arange(16) % 10
    x, t = recipe(images, labels, 0)
    assert x.shape == (16, 3, 32, 32) and x.dtype == torch.float32 and t.shape == (16, 10)
    again = recipe(images, labels, 0)
    assert torch.equal(again[0], x) and torch.equal(again[1], t)
    assert not torch.equal(recipe(images, labels, 1)[0], x)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batches_get_the_same_augmentation_as_cpu_batches():
    x, y = images_uint8(32, seed=16), torch.arange(32) % 10
    cuda = torch.device("cuda")
    for fn in (lambda t, g: random_crop(t, 4, g, "reflect"), lambda t, g: random_crop(t, 4, g), random_hflip):
        assert torch.equal(fn(x.to(cuda), gen(0)).cpu(), fn(x, gen(0)))
    aug = BatchRandAugment(num_ops=9, magnitude=5)
    assert (aug(x.to(cuda), gen(0)).cpu() != aug(x, gen(0))).float().mean() < 0.01  # NEAREST grid edge cases
    jitter = BatchColorJitter(0.4, 0.4, 0.4, 0.1)
    assert (jitter(x.to(cuda), gen(0)).cpu().int() - jitter(x, gen(0)).int()).abs().max() <= 1
    f = x.float() / 255
    erasing = BatchRandomErasing(0.25)
    assert torch.equal(erasing(f.to(cuda), gen(0)).cpu(), erasing(f, gen(0)))
    mixup = SeededMixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=10)
    on_cuda, on_cpu = mixup(f.to(cuda), y, gen(0)), mixup(f, y, gen(0))
    assert on_cuda[1].device.type == "cuda"
    assert all(torch.allclose(a.cpu(), b, atol=1e-6) for a, b in zip(on_cuda, on_cpu, strict=True))
