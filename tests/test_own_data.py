"""A user's own image folder (``imagefolder``): its defaults fit the images (grey or colour, small or large), every
choice is stated and can be set, an unreadable image is named, and a run or study on it says when it trained below
the floor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import run_in_process
from PIL import Image

from data import DataError, build_datamodule
from data.folder_fit import Look, auto_patch, choose, look_at


def write_digit_folder(root: Path, per_class: int = 20, size: int = 32, mode: str = "L") -> Path:
    """``root/train/<digit>/<i>.png``: scikit-learn's 8x8 digits upscaled to ``size`` px, grey PNGs (``mode`` "L",
    or "RGB" with three equal channels as some tools save grey pictures)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    counts: dict[int, int] = {}
    for image, label in zip(digits.images, digits.target, strict=True):
        if counts.get(int(label), 0) >= per_class:
            continue
        counts[int(label)] = counts.get(int(label), 0) + 1
        folder = root / "train" / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        pixels = Image.fromarray((image * 16).clip(0, 255).astype(np.uint8)).resize((size, size), Image.BILINEAR)
        pixels.convert(mode).save(folder / f"{counts[int(label)]}.png")
    return root


def write_photo_folder(root: Path, sizes=((120, 96), (100, 90), (96, 96))) -> Path:
    """``root/train/<class>/<i>.png``: colour images of varied sizes (one base colour per class plus noise)."""
    rng = np.random.default_rng(0)
    for c, cls in enumerate(("red", "green")):
        (root / "train" / cls).mkdir(parents=True)
        for i, (w, h) in enumerate(sizes * 2):
            pixels = rng.integers(0, 60, (h, w, 3)) + np.eye(3, dtype=int)[c] * 180
            Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(root / "train" / cls / f"{i}.png")
    return root


def test_grey_digits_get_one_channel_their_own_size_and_shifts_without_flip_or_jitter(tmp_path):
    root = write_digit_folder(tmp_path / "digits")
    dm = build_datamodule("imagefolder", data_dir=str(root), batch_size=8)
    assert (dm.num_classes, dm.in_chans, dm.img_size, dm.default_patch_size) == (10, 1, 32, 8)  # 4x4 patches
    fit = dm.fit
    assert (fit.crop, fit.flip, fit.color_jitter, fit.padding) == ("shift", False, 0.0, 4)
    assert fit.auto == ("channels", "img_size", "crop", "flip", "color_jitter")
    assert dm.describe() == (
        f"imagefolder '{root}': 10 classes; grey images 32x32 (64 sampled) -> 1 channel(s), img_size 32, patch 8 "
        "(16 tokens); training augmentation: shifts of up to 4 px (a random crop of the padded image), no flip, no "
        "colour jitter (chosen from the images: channels, img_size, crop, flip, color_jitter; set any with "
        "--dataset-option)")
    assert dm.sizes() == (120, 40, 40)  # 200 images split as setup() splits them, known before loading
    dm.setup()
    assert (dm.train_size, dm.val_size, dm.test_size) == (120, 40, 40)
    names = [type(t).__name__ for t in dm.train_set.transform.transforms]
    assert names == ["Resize", "CenterCrop", "RandomCrop", "MaybeToTensor", "Normalize"]
    x, _ = next(iter(dm.train_dataloader()))
    assert x.shape == (8, 1, 32, 32) and len(dm.mean) == 1
    # grey pictures saved as RGB (three equal channels) are grey too
    rgb = build_datamodule("imagefolder", data_dir=str(write_digit_folder(tmp_path / "rgb", 2, mode="RGB")))
    assert rgb.in_chans == 1 and rgb.fit.look.grey


def test_colour_photos_of_varied_sizes_get_a_resized_crop_flip_and_jitter_and_every_option_can_be_set(tmp_path):
    root = write_photo_folder(tmp_path / "photos")
    dm = build_datamodule("imagefolder", data_dir=str(root), batch_size=4)
    # shorter sides 96, 90, 96 (twice): median 96 -> 12 px patches (8x8 of them); 90 px -> 11 px patches, 88 px
    assert (dm.in_chans, dm.img_size, dm.default_patch_size) == (3, 96, 12) and auto_patch(96) == 12
    assert (choose(Look(1, False, 90, None)).img_size, auto_patch(90)) == (88, 11)
    assert (dm.fit.crop, dm.fit.flip, dm.fit.color_jitter) == ("resized", True, 0.4)
    assert "colour images of varied sizes (median shorter side 96 px)" in dm.describe()
    x, _ = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 3, 96, 96)
    given = build_datamodule("imagefolder", data_dir=str(root), img_size=64, crop="none", flip=False,
                             color_jitter=0, channels=1)
    assert (given.in_chans, given.img_size, given.default_patch_size) == (1, 64, 8)
    assert given.fit.auto == () and "flip" not in given.fit.augmentation_text().replace("no flip", "")
    assert next(iter(given.train_dataloader()))[0].shape[1:] == (1, 64, 64)
    assert choose(look_at(tuple(sorted((root / "train").rglob("*.png")))), img_size=224).patch_size == 16


@pytest.mark.parametrize(("options", "message"), [
    ({"crop": "random"}, "dataset option crop must be one of auto, shift, resized, none, got 'random'"),
    ({"flip": "yes"}, "dataset option flip must be auto, true or false, got 'yes'"),
    ({"channels": 2}, "dataset option channels must be auto, 1 or 3, got 2"),
    ({"img_size": 30, "patch_size": 4}, "img_size 30 is not a multiple of the patch size 4"),
])
def test_a_bad_dataset_option_is_one_line_naming_it_and_the_folder(tmp_path, options, message):
    root = write_digit_folder(tmp_path / "d", per_class=2)
    with pytest.raises(DataError) as caught:
        build_datamodule("imagefolder", data_dir=str(root), **options)
    assert "\n" not in str(caught.value) and message in str(caught.value) and f"'{root}'" in str(caught.value)


def test_an_unreadable_image_is_named_by_its_file(tmp_path):
    """A corrupt PNG is a one-line error naming the file, whether the first look at the folder opens it (building
    the data) or training meets it (in a DataLoader worker): the folder's layout is fine."""
    root = write_digit_folder(tmp_path / "d", per_class=2)
    bad = root / "train" / "0" / "1.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"not a picture")
    with pytest.raises(DataError) as caught:
        build_datamodule("imagefolder", data_dir=str(root))
    assert str(caught.value).startswith(f"image file '{bad}' could not be read (UnidentifiedImageError")
    assert str(caught.value).endswith("replace or remove it") and "layout" not in str(caught.value)
    from ablations.train import main as train_main

    result = run_in_process("--dataset", "imagefolder", "--data-dir", root, "--dataset-option", "channels=1",
                            "--dataset-option", "img_size=32", "--dataset-option", "crop=shift",
                            "--dataset-option", "flip=false", "--dataset-option", "color_jitter=0",
                            "--num-workers", "1", "--max-epochs", "1", "--embed-dim", "8", "--num-heads", "2",
                            "--depth", "1", "--no-progress-bar", "--log-dir", tmp_path / "runs", cwd=tmp_path,
                            main=train_main)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: image file '{bad}' could not be read"), result.stderr


def test_a_flag_of_another_tool_points_to_the_one_meant():
    """``train --workers 0`` is the study runner's flag; the one-line error names ``--num-workers``."""
    from ablations.train import main as train_main

    result = run_in_process("--workers", "0", cwd=Path.cwd(), main=train_main)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "unrecognized arguments: --workers 0; did you mean --num-workers?" in result.stderr


STUDY = """\
name: my_study
extends: protocol/mnist5k.yaml      # the shared protocol, found from any folder
base: {{dataset: imagefolder, data_dir: {data}}}
variants:
  - {{label: standard, residual: standard}}
  - {{label: layerscale, residual: layerscale, options: {{init_value: auto}}}}
axes: {{depth: [6], seed: [0, 1, 2, 3, 4]}}
"""


def test_the_dry_run_of_a_study_on_own_images_says_what_its_budget_changes_and_keeps(tmp_path):
    """The README's own-data study, at the smoke budget, from a folder outside the repository: the dry run says the
    budget shrinks it and keeps its data, and how the images will be read; the committed study's quick budget says
    that its data changes."""
    from ablations.run import main as run_main

    images = write_digit_folder(tmp_path / "my_images", per_class=4)
    (tmp_path / "my_study.yaml").write_text(STUDY.format(data=images))
    result = run_in_process("--study", "my_study.yaml", "--budget", "smoke", "--dry-run", cwd=tmp_path, main=run_main)
    assert result.returncode == 0, result.stderr
    budget, data = [line for line in result.stderr.splitlines() if line.startswith(("budget '", "data: "))]
    assert budget == ("budget 'smoke' against the study's default: embed_dim 64 -> 16, num_heads 4 -> 2, max_epochs "
                      "30 -> 1, seed [0, 1, 2, 3, 4] -> [0], tuning rates [0.001, 0.002, 0.004, 0.008] -> [0.001, "
                      "0.004], tuning seeds [100, 101, 102] -> [100], tuning bounds [0.000125, 0.032] -> none (one "
                      f"grid, never extended); trials 10+24 -> 2+4; the data stays (dataset=imagefolder, "
                      f"data_dir={images})")
    assert data.startswith(f"data: imagefolder '{images}': 10 classes; grey images 32x32 (40 sampled) -> 1 channel(s)")
    assert f"dataset=imagefolder, data_dir={images}" in result.stdout and "digits" not in result.stdout
    quick = run_in_process("--study", "residual_variants", "--budget", "quick", "--dry-run", cwd=tmp_path,
                           main=run_main)
    assert "trials 200+120 -> 30+30; its data changes: dataset mnist5k -> digits, patch_size 7 -> 4" in quick.stderr


def test_a_run_below_the_floor_says_so_at_its_end_with_its_likely_causes(tmp_path):
    from ablations.studies.advice import below_floor_line, likely_causes, protocol_floor
    from ablations.train import main as train_main

    result = run_in_process("--dataset", "digits", "--max-epochs", "1", "--embed-dim", "8", "--num-heads", "2",
                            "--depth", "1", "--no-progress-bar", "--log-dir", tmp_path / "runs", cwd=tmp_path,
                            main=train_main)
    assert result.returncode == 0, result.stderr
    (note,) = [line for line in result.stderr.splitlines() if line.startswith("note: this run ended below the floor")]
    assert "(final_val_acc under 50%, 5x chance with 10 classes: " in note and "only 1 epoch(s)" in note
    floor = protocol_floor()
    rising = {"final_val_acc": 0.3, "val_acc_curve": [0.1, 0.12, 0.15, 0.2, 0.25, 0.3], "epochs_completed": 6,
              "num_classes": 2, "images_seen": 6 * 40}
    causes = likely_causes(rising, {"lr": 0.01, "dataset": "imagefolder"})
    assert causes[0] == "still learning at its last epoch (6): more epochs (max_epochs)"
    assert causes[1] == "few images per class (40 train images, 2 classes)"
    assert "lr 0.01" in causes[2] and "--dataset-option crop=" in causes[3]
    assert likely_causes({"diverged": True, "epochs_completed": 10}, {"lr": 0.05})[0].startswith(
        "the loss diverged: a lower learning rate than 0.05")
    line = below_floor_line([(rising, {"lr": 0.01})], 8, floor, what="completed trials of 'x'")
    assert line.startswith("1 of 8 completed trials of 'x' ended below the floor (final_val_acc under 75%, 5x chance "
                           "with 2 classes; the first at 30.0%) and count as failed to train. Likely causes: still")
    assert below_floor_line([], 8, floor) is None


def test_the_image_folder_script_writes_a_folder_to_try_the_own_data_path_with(tmp_path):
    """``scripts/image_folder.py``: an embedded dataset as grey PNGs at the size asked (mnist5k's digits centred on
    a black canvas, not stretched); a folder that already holds files is refused in one line."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "image_folder.py"
    done = subprocess.run([sys.executable, script, tmp_path / "f", "--per-class", "3"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote 30 32x32 grey PNGs of mnist5k to {tmp_path / 'f'}/train/<class>/"
    files = sorted((tmp_path / "f" / "train").rglob("*.png"))
    assert len(files) == 30 and sorted({p.parent.name for p in files}) == [str(d) for d in range(10)]
    image = np.asarray(Image.open(files[0]))
    assert image.shape == (32, 32) and image[:2].max() == 0 and image[2:30, 2:30].max() > 0  # the 28 px digit, centred
    again = subprocess.run([sys.executable, script, tmp_path / "f"], capture_output=True, text=True)
    assert again.returncode == 2 and again.stderr.strip() == f"error: '{tmp_path / 'f'}' already holds files; give an " \
        "empty or new folder"
