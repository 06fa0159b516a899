"""CoMLRL 1.4.3's ``comlrl.trainers.preference.marlhf.JointRewardModel``, as a thin
adapter over ours (:class:`comlrl.algos.recipes.preference.marlhf.reward_model.JointRewardModel`)."""

from __future__ import annotations

import torch
from comlrl.algos.recipes.preference.marlhf.reward_model import (
    JointRewardModel as _JointRewardModel,
)
from torch import nn

__all__ = ["JointRewardModel"]


class JointRewardModel(_JointRewardModel):
    """1.4.3's ``JointRewardModel``: ours (the head on the last real token, either padding
    side), with the head also named ``reward_head`` and the hidden states read as the
    backbone's ``hidden_states[-1]`` (``output_hidden_states=True``), so a backbone that
    returns no ``last_hidden_state`` (a causal LM, or 1.4.3's test doubles) works as in
    1.4.3. Scores ``[B]`` float32; raises as ours."""

    @property
    def reward_head(self) -> nn.Linear:
        """The linear head (1.4.3's name; ours is ``head``)."""
        return self.head

    def _hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        out = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            output_hidden_states=True,
            use_cache=False,
        )
        return out.hidden_states[-1]
