"""CoMLRL 1.4.3's private ``CentralizedMAGRPOTrainer._compute_loss_with_gradients``, as a
thin adapter over ours: :func:`comlrl.trainers.preference.collaboration.joint_sequence_log_prob`
(1.4.3's scoring of one joint response) and our advantage estimators
(:func:`comlrl.algos.functional.advantages.compute_advantages`). 1.4.3's test suite calls
it directly; our recipe does not go through it (it scores tempered log-probs, see
docs/compat.md, "Differences")."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

__all__ = ["CentralizedLossHooks143", "joint_policy_loss"]


def joint_policy_loss(
    data: Mapping[str, Any],
    returns: Sequence[float],
    *,
    log_prob: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    advantage_mode: str,
    normalize: bool,
    shape_returns: Callable[[torch.Tensor, Mapping[str, Any]], torch.Tensor],
) -> torch.Tensor:
    """1.4.3's loss of one prompt's joint responses: ``mean_k(-A_k * log pi(y_k | x))``
    with ``log_prob(prompt_ids, response_ids)`` the log-probability of the whole joint
    response ``y_k`` (``data["completion_input_ids"][0][k]``, after the prompt
    ``data["prompt_input_ids"][0]``), and ``A`` our advantages (``advantage_mode``,
    ``normalize``) of ``returns`` after ``shape_returns`` (1.4.3's reference-KL shaping by
    ``data["reference_kls"]``). A float32 scalar with gradients; 0 (accepting
    ``backward()``) for no responses.

    Raises:
        ValueError: the responses and ``returns`` differ in number.
    """
    from comlrl.algos.functional.advantages import compute_advantages
    from comlrl.trainers._fields import ADVANTAGE_MODES
    from comlrl.trainers.reinforce import advantage_scale

    completions = list(data["completion_input_ids"][0])
    if len(completions) != len(returns):
        raise ValueError(
            f"{len(completions)} joint responses do not align with their returns "
            f"({len(returns)}); pass one return per response."
        )
    if not completions:
        return torch.zeros((), requires_grad=True)
    prompt = data["prompt_input_ids"][0]
    shaped = shape_returns(torch.tensor([float(r) for r in returns], dtype=torch.float32), data)
    estimator = ADVANTAGE_MODES[str(advantage_mode).lower()]
    scale = advantage_scale(estimator, bool(normalize))
    advantages = compute_advantages(shaped[None], estimator=estimator, scale=scale)[0]  # type: ignore[arg-type]
    terms = [
        -float(a) * log_prob(prompt, ids)
        for a, ids in zip(advantages.tolist(), completions, strict=True)
    ]
    return torch.stack(terms).mean()


class CentralizedLossHooks143:
    """1.4.3's ``_compute_loss_with_gradients`` of the joint actor (see the module docstring)."""

    args: Any
    tokenizer: Any
    advantage_mode: str

    #: 1.4.3's KL shaping of the returns (:class:`comlrl.trainers._kl_hooks143.ReferenceKLHooks143`)
    _apply_reference_kl_to_returns: Callable[[torch.Tensor, Mapping[str, Any]], torch.Tensor]

    formatters: list[Any]
    _reference_kl_values: Callable[..., list[float]]

    def _generate_completions(
        self,
        agent: Any,
        batch_items: Sequence[Mapping[str, Any]],
        num_return_sequences: int = 1,
        max_new_tokens: int | None = None,
        **_ignored: Any,
    ) -> dict[str, Any]:
        """1.4.3's sampling of the joint actor ``agent``: the joint prompt per item
        (``formatters[0]``), ``num_return_sequences`` joint responses each, through our
        :class:`~comlrl.algos.rollout.agent.HFAgent` sampler (a ``generate`` replaced on the
        model instance is used, as the trainer's own sampling does) under
        ``torch.inference_mode``. ``min_new_tokens`` and other ``generate`` options are
        accepted and ignored (our sampler stops at EOS).

        Returns:
            ``prompts``, ``batch_items``, ``completions`` (``[item][G]`` texts),
            ``prompt_input_ids`` (a tensor per item, its real tokens: an EOS inside the
            prompt is kept), ``completion_input_ids`` (``[item][G]`` tensors through the
            first EOS), ``response_lens`` (their lengths, items in order) and
            ``reference_kls`` (1.4.3's summed k3 KL to the reference per response, in the
            same order; ``[]`` when the reference KL is off).
        """
        from comlrl.algos.rollout.agent import HFAgent
        from comlrl.core import SamplingParams

        a = self.args
        prompts = [self.formatters[0](dict(item)) for item in batch_items]
        params = SamplingParams.from_config(a, num_return_sequences, max_new_tokens=max_new_tokens)
        backend = "hf" if "generate" in vars(agent) else "native"
        sampler = HFAgent(
            agent, self.tokenizer, name="agent_0", prompt_format="raw", backend=backend
        )
        g = params.num_generations
        with torch.inference_mode():
            samples = sampler.sample(prompts, params)
            ids, mask = samples.batch.input_ids, samples.batch.completion_mask
            width = ids.shape[1] - mask.shape[1]  # prompt width (left-padded)
            attention = samples.batch.attention_mask.bool()
            prompt_ids = [
                ids[n * g, :width][attention[n * g, :width]].clone() for n in range(len(prompts))
            ]
            completion_ids = [
                [ids[n * g + k, width:][mask[n * g + k]].clone() for k in range(g)]
                for n in range(len(prompts))
            ]
        lens = [int(c.numel()) for row in completion_ids for c in row]
        kls: list[float] = []
        pad = int(self.tokenizer.pad_token_id or 0)
        for prompt, row in zip(prompt_ids, completion_ids, strict=True):
            longest = max(int(c.numel()) for c in row)
            seqs = torch.full((g, len(prompt) + longest), pad, dtype=torch.long)
            attn = torch.zeros_like(seqs)
            for k, c in enumerate(row):
                seqs[k, : len(prompt) + len(c)] = torch.cat([prompt, c])
                attn[k, : len(prompt) + len(c)] = 1
            device = next(agent.parameters()).device
            kls += self._reference_kl_values(
                0, agent, seqs.to(device), attn.to(device), len(prompt), [len(c) for c in row]
            )
        return {
            "prompts": prompts,
            "batch_items": list(batch_items),
            "completions": samples.texts(),
            "prompt_input_ids": prompt_ids,
            "completion_input_ids": completion_ids,
            "response_lens": lens,
            "reference_kls": kls,
        }

    def _compute_loss_with_gradients(
        self, model: Any, data: Mapping[str, Any], returns: Sequence[float]
    ) -> torch.Tensor:
        """1.4.3's loss of one prompt's joint responses (:func:`joint_policy_loss`) with
        ``log pi`` the untempered log-probability of each whole joint response through its
        first EOS (:func:`comlrl.trainers.preference.collaboration.joint_sequence_log_prob`)
        and our advantages for ``self.advantage_mode`` and ``advantage_normalization``.

        Raises:
            ValueError: the responses and ``returns`` differ in number.
        """
        from comlrl.trainers.preference.collaboration import joint_sequence_log_prob

        return joint_policy_loss(
            data,
            returns,
            log_prob=lambda prompt, ids: joint_sequence_log_prob(
                model, self.tokenizer, prompt, ids
            ),
            advantage_mode=self.advantage_mode,
            normalize=bool(self.args.advantage_normalization),
            shape_returns=self._apply_reference_kl_to_returns,
        )
