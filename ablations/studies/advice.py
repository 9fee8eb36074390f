"""What to say when runs end below the floor (:class:`ablations.studies.spec.Floor`): how many, and the likely
causes read from the runs themselves, so that a study whose every run failed to train says so at its end instead
of leaving the report to find it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .spec import PROTOCOL, Floor

#: a validation accuracy that rose by more than this over the last fifth of the epochs was still learning
STILL_RISING = 0.02
#: train images per class below which a run has little to learn from
FEW_PER_CLASS = 30


def protocol_floor() -> Floor:
    """The shared protocol's floor (``protocol/mnist5k.yaml``: 5x chance level): a single run is held to it."""
    import yaml

    raw = yaml.safe_load(PROTOCOL.read_text())["floor"]
    return Floor(metric=raw.get("metric", "final_val_acc"), chance_multiple=float(raw.get("chance_multiple", 2.0)))


def likely_causes(summary: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """What in one run's summary and config can keep it below the floor, most telling first."""
    causes = []
    epochs = int(summary.get("epochs_completed") or config.get("max_epochs") or 0)
    curve = [v for v in summary.get("val_acc_curve") or [] if v is not None]
    if summary.get("diverged"):
        causes.append(f"the loss diverged: a lower learning rate than {config.get('lr')} or a longer warm-up")
    if epochs <= 3:
        causes.append(f"only {epochs} epoch(s) (a smoke budget checks that a study runs, not what it learns; "
                      "max_epochs)")
    elif len(curve) >= 5 and curve[-1] - curve[-max(2, len(curve) // 5)] > STILL_RISING:
        causes.append(f"still learning at its last epoch ({epochs}): more epochs (max_epochs)")
    classes = summary.get("num_classes") or config.get("num_classes")
    images = summary.get("images_seen") and epochs and int(summary["images_seen"]) // max(1, epochs)
    if images and classes and images / classes < FEW_PER_CLASS:
        causes.append(f"few images per class ({images} train images, {classes} classes)")
    if not summary.get("diverged"):
        causes.append(f"a learning rate that does not suit the data (lr {config.get('lr')}; a study's tuning stage "
                      "chooses one per row)")
    if config.get("dataset") == "imagefolder":
        causes.append("a crop, flip or size that does not fit the images (the 'data:' line says what was chosen; "
                      "--dataset-option crop=..., flip=..., img_size=...)")
    return causes


def below_floor_line(failed: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]], total: int, floor: Floor,
                     what: str = "run(s)") -> str | None:
    """One line for the ``(summary, config)`` of the runs that ended below ``floor`` out of ``total``: how many,
    the floor, and the likely causes (those of the first such run); None when none did. ``total`` 0: a single run
    held to the protocol's floor (it says a study would count it as failed)."""
    if not failed:
        return None
    summary, config = failed[0]
    classes = summary.get("num_classes") or config.get("num_classes")
    value = summary.get(floor.metric)
    at = f"{value:.1%}" if isinstance(value, (int, float)) else "no value"
    below = (f"the floor ({floor.metric} under {floor.threshold(classes):.0%}, {floor.chance_multiple:g}x chance with "
             f"{classes or 10} classes")
    head = (f"this run ended below {below}: {at})" + ", where a study counts a run as failed to train" if not total
            else f"{len(failed)} of {total} {what} ended below {below}; the first at {at}) and count as failed to "
                 "train")
    return f"{head}. Likely causes: " + "; ".join(likely_causes(summary, config))
