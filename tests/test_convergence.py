"""The convergence measures against hand-made curves (epoch 1 = item 0)."""

from __future__ import annotations

import math

import pytest

from lit_modules.convergence import (
    best_epoch,
    epochs_to_fraction_of_best,
    epochs_to_threshold,
    fraction_keys,
    last_finite,
    steps_at_epoch,
    summarize,
    threshold_key,
    val_acc_auc,
)

CURVE = [0.2, 0.5, 0.8, 0.9, 0.95, 0.94, 0.96, 0.93]  # best 0.96 at epoch 7


def test_best_epoch_is_first_maximum_and_one_based():
    assert best_epoch(CURVE) == 7
    assert best_epoch([0.5, 0.9, 0.9]) == 2
    assert best_epoch([]) is None
    assert best_epoch([None, math.nan]) is None
    assert best_epoch([None, 0.3]) == 2


def test_epochs_to_threshold():
    assert epochs_to_threshold(CURVE, 0.5) == 2  # reached exactly
    assert epochs_to_threshold(CURVE, 0.85) == 4
    assert epochs_to_threshold(CURVE, 0.0) == 1
    assert epochs_to_threshold(CURVE, 0.97) is None
    assert epochs_to_threshold([None, math.nan, 0.6], 0.5) == 3  # missing epochs never count
    assert epochs_to_threshold([], 0.1) is None


def test_epochs_to_fraction_of_best():
    # best 0.96: 90% = 0.864 -> epoch 4 (0.9); 95% = 0.912 -> epoch 5 (0.95); 99% = 0.9504 -> epoch 7 (0.95 < 0.9504)
    assert epochs_to_fraction_of_best(CURVE, 0.90) == 4
    assert epochs_to_fraction_of_best(CURVE, 0.95) == 5
    assert epochs_to_fraction_of_best(CURVE, 0.99) == 7
    assert epochs_to_fraction_of_best(CURVE, 1.0) == 7  # float rounding never misses the best epoch itself
    assert epochs_to_fraction_of_best([0.1, 0.3, 0.7], 1.0) == 3
    assert epochs_to_fraction_of_best([], 0.95) is None


def test_steps_at_epoch():
    steps = [12, 24, 36]
    assert steps_at_epoch(steps, 2) == 24
    assert steps_at_epoch(steps, None) is None
    assert steps_at_epoch(steps, 4) is None


def test_val_acc_auc_counts_missing_epochs_as_zero():
    assert val_acc_auc([0.5, 1.0], 2) == pytest.approx(0.75)
    # a run that stopped (diverged) after 2 of 4 epochs: the missing epochs count as 0
    assert val_acc_auc([0.5, 1.0], 4) == pytest.approx(0.375)
    assert val_acc_auc([0.5, math.nan, None, 1.0], 4) == pytest.approx(0.375)
    assert val_acc_auc([0.5, 1.0, 1.0], 2) == pytest.approx(0.75)  # beyond max_epochs: ignored
    assert val_acc_auc([], 3) == 0.0
    with pytest.raises(ValueError):
        val_acc_auc([0.5], 0)


def test_last_finite_and_keys():
    assert last_finite([1.0, 2.0, math.nan, None]) == 2.0
    assert last_finite([None, math.inf]) is None
    assert threshold_key(0.95) == "epochs_to_acc_0.95"
    assert threshold_key(0.5) == "epochs_to_acc_0.5"
    assert fraction_keys(0.99) == ("epochs_to_99pct_of_best", "steps_to_99pct_of_best")


def test_summarize_hand_made_run():
    s = summarize(
        val_acc=CURVE, train_loss=[2.0, 1.5, 1.0, 0.8, 0.7, 0.6, 0.55, 0.5],
        steps=[10 * e for e in range(1, 9)], epoch_times=[2.5] + [2.0] * 6 + [60.0], train_times=[1.5] * 8,
        images_seen=1200,
        max_epochs=10, thresholds=(0.5, 0.8, 0.99), diverged=False, param_count=1234, wall_time_s=80.0,
    )
    assert s["best_val_acc"] == 0.96 and s["best_epoch"] == 7
    assert s["final_val_acc"] == 0.93
    assert (s["epochs_to_90pct_of_best"], s["epochs_to_95pct_of_best"], s["epochs_to_99pct_of_best"]) == (4, 5, 7)
    assert (s["steps_to_90pct_of_best"], s["steps_to_95pct_of_best"], s["steps_to_99pct_of_best"]) == (40, 50, 70)
    assert (s["epochs_to_acc_0.5"], s["epochs_to_acc_0.8"], s["epochs_to_acc_0.99"]) == (2, 3, None)
    assert s["val_acc_auc"] == pytest.approx(sum(CURVE) / 10)
    assert s["final_train_loss"] == 0.5
    # s/epoch is the median epoch: the last epoch's pause (60 s) and the first's warm-up do not move it
    assert s["wall_time_s"] == 80.0 and s["time_per_epoch_s"] == 2.0
    assert s["train_images_per_s"] == pytest.approx(1200 / 12.0)
    assert s["epochs_completed"] == 8 and s["diverged"] is False and s["param_count"] == 1234
    assert s["val_acc_curve"] == CURVE


def test_summarize_diverged_before_any_validation():
    s = summarize(val_acc=[], train_loss=[math.nan], steps=[], epoch_times=[0.5], train_times=[0.5],
                  images_seen=0, max_epochs=5, diverged=True)
    assert s["best_val_acc"] is None and s["final_val_acc"] is None and s["best_epoch"] is None
    assert s["epochs_to_95pct_of_best"] is None and s["steps_to_95pct_of_best"] is None
    assert s["val_acc_auc"] == 0.0 and s["final_train_loss"] is None
    assert s["epochs_completed"] == 0 and s["diverged"] is True
    assert s["train_images_per_s"] == 0.0
    assert s["train_loss_curve"] == [None]


def test_summarize_diverged_mid_run_keeps_measured_epochs():
    s = summarize(val_acc=[0.4, 0.7], train_loss=[1.2, 0.9, math.nan], steps=[5, 10], epoch_times=[1, 1, 0.3],
                  train_times=[1, 1, 0.3], images_seen=100, max_epochs=4, diverged=True)
    assert s["best_val_acc"] == 0.7 and s["final_val_acc"] == 0.7 and s["epochs_completed"] == 2
    assert s["val_acc_auc"] == pytest.approx(1.1 / 4)
    assert s["final_train_loss"] == 0.9


def test_step_timer_compile_time_is_the_first_batch_beyond_the_median_of_the_next(monkeypatch):
    """``--compile``'s reported compile time: the first timed batch (which traces and generates code) minus the
    median of the following ones; at most ``batches`` are timed; None before two batches."""
    import lit_modules.convergence as convergence
    from lit_modules.convergence import StepTimer

    timer = StepTimer(batches=4)
    assert timer.compile_time_s() is None
    clock = iter([0.0, 30.0, 30.0, 30.5, 31.0, 31.4, 32.0, 32.7, 40.0, 99.0])  # start/end pairs of 5 batches

    monkeypatch.setattr(convergence.time, "perf_counter", lambda: next(clock))
    for i in range(5):
        timer.on_train_batch_start(None, None, None, i)
        timer.on_train_batch_end(None, None, None, None, i)
    monkeypatch.undo()
    assert timer.times == pytest.approx([30.0, 0.5, 0.4, 0.7])  # the fifth batch is not timed
    assert timer.compile_time_s() == pytest.approx(30.0 - 0.5)


def test_late_change_is_the_fitted_rise_over_the_last_fifth():
    """10 epochs: the last 2 are too few; 20 epochs: the last 4, a line through them (hand-computed)."""
    from lit_modules.convergence import late_change

    assert late_change([0.5] * 10) is None  # 2 epochs
    flat = [0.1 * i for i in range(16)] + [0.9, 0.9, 0.9, 0.9]
    assert late_change(flat) == pytest.approx(0.0, abs=1e-12)
    rising = [0.0] * 16 + [0.90, 0.91, 0.92, 0.93]  # slope 0.01 per epoch over 3 steps
    assert late_change(rising) == pytest.approx(0.03, abs=1e-12)
    noisy = [0.0] * 16 + [0.90, 0.95, 0.90, 0.95]  # least squares: slope 0.01 -> 0.03 (endpoints say 0.05)
    assert late_change(noisy) == pytest.approx(0.03, abs=1e-12)
    assert late_change([0.0] * 16 + [0.9, None, 0.9, 0.9]) is None


def test_a_tracker_filled_by_its_record_methods_summarises_and_resumes_its_run():
    """What the stacked engine writes into a run's record (and Lightning's hooks, through the same methods): two
    epochs of a run that diverges in its second, then its state loaded into a fresh tracker that resumes it."""
    import torch

    from lit_modules.convergence import ConvergenceTracker
    from lit_modules.predictions import unpack

    model = torch.nn.Linear(3, 2)  # 8 parameters
    tracker = ConvergenceTracker()
    tracker.begin(4, model)
    tracker.start(0, 0)
    tracker.trained(100, 10)
    tracker.validated(1, 0.6, 10, 0.5, torch.tensor([True, False, True, False]))
    tracker.epoch_ended(1, 2.0, 1.5, 1.1)
    tracker.trained(30, 14)  # diverged at its 4th step of epoch 2: the skipped step counted, no validation
    tracker.mark_diverged()
    tracker.epoch_ended(2, 1.0, 1.0, 1.1)
    s = tracker.summary()
    assert (s["param_count"], s["images_seen"], s["epochs_completed"], s["diverged"]) == (8, 130, 1, True)
    assert (s["best_val_acc"], s["test_acc"], s["steps_to_95pct_of_best"]) == (0.6, 0.5, 10)
    assert unpack(s["test_correct"]).tolist() == [True, False, True, False]
    assert s["train_images_per_s"] == pytest.approx(130 / 2.5) and s["time_per_epoch_s"] == pytest.approx(1.5)

    resumed = ConvergenceTracker()
    resumed.load_state_dict(tracker.state_dict())
    resumed.begin(4, model)
    resumed.start(2, resumed.global_step, "last.engine.pt")
    assert resumed.diverged and resumed.global_step == 14 and resumed.latest(resumed.train_loss) == 1.1
    own = resumed.this_process()
    assert own["resumed_from_checkpoint"] and own["resumed_checkpoint"] == "last.engine.pt"
    assert (own["start_epoch"], own["start_global_step"], own["epochs_this_process"]) == (2, 14, 0)
    assert resumed.summary()["val_acc_curve"] == [0.6]
