"""The loss options as the trainer's settings take them: a reference KL estimator that
belongs in the reward is refused with a positive ``kl_coef``, and ``seq_sum`` needs the
completion budget (the losses themselves: comlrl-estimators' ``test_losses.py``)."""

from __future__ import annotations

import pytest


def test_config_refuses_k1_with_a_positive_kl_coef() -> None:
    from comlrl.algos.training.config.rl import TrainConfig
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="k1 belongs in the reward"):
        TrainConfig(kl_coef=0.05, kl_estimator="k1")
    assert TrainConfig(kl_coef=0.0, kl_estimator="k1").kl_estimator == "k1"
    assert TrainConfig(kl_coef=0.05, kl_estimator="k2").kl_estimator == "k2"


def test_update_settings_with_seq_sum_need_the_budget() -> None:
    from comlrl.algos.training.update.settings import UpdateSettings

    with pytest.raises(ValueError, match="pass max_completion_length"):
        UpdateSettings(loss_reduction="seq_sum")
    assert UpdateSettings(loss_reduction="seq_sum", max_completion_length=8).loss_reduction
