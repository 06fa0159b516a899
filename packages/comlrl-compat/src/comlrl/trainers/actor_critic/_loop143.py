"""CoMLRL 1.4.3's actor-critic loop hooks on :class:`RolloutSample` lists, as adapters.

1.4.3's IAC/MAAC trainers buffer each agent's :class:`RolloutSample` records, drain the
full buffers (:meth:`ActorCriticLoop143._drain_ready_agent_buffers`: concurrently per agent
under ``parallel_training="mp"``, one after another for MAAC, whose critic is shared) and
update each agent on its samples (:meth:`~ActorCriticLoop143._update`: advantages
``target - V_old``, optionally whitened, then :meth:`~ActorCriticLoop143._ac_step` per
``train_batch_size`` samples). A script or test that builds such records itself (or
overrides ``_collect_rollouts``) can drive these hooks; ``train()`` runs our recipe
(:mod:`comlrl.algos.recipes.actor_critic.recipe`), which does not produce them.

The update of :meth:`~ActorCriticLoop143._ac_step` is 1.4.3's: for a batch of ``B``
samples, policy loss ``mean_b(-A_b * log pi(y_b | x_b))`` (log-probs summed over the
response, untempered; ``A`` the normalised advantage) and value loss ``value_loss_coef *
mean_b (target_b - V_b)^2``; IAC with a value head on the agent clips ``V`` to
``V_old +- value_clip_range`` (the larger of the clipped and unclipped errors, Schulman et
al. 2017's PPO value clip) and takes one step on the sum; separate critics (IAC) and MAAC's
centralised critic take their own optimizer step. ``V`` is the value of the prompt (``"v"``)
or of prompt and response (``"q"``); MAAC's critic reads the joint prompt in the sample's
``metadata`` (``joint_input_ids``, ``joint_attention_mask``, ``joint_prompt_len``).
Values come from the model's own ``values`` output, so the critics (or the agents, for
value heads on them) must be 1.4.3-style models whose ``forward`` takes ``output_values``;
our recipe's critics keep their value heads apart (:class:`comlrl.algos.models.value.Critic`).
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["ActorCriticLoop143", "forward_143"]


def forward_143(model: Any, ids: torch.Tensor, mask: torch.Tensor | None, values: bool) -> Any:
    """``model(input_ids=ids, attention_mask=mask)``, with ``output_values=values`` when the
    model takes it (1.4.3's models with a value head do; a plain ``transformers`` model
    does not)."""
    try:
        takes = "output_values" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError, AttributeError):
        takes = False
    if takes:
        return model(input_ids=ids, attention_mask=mask, output_values=values)
    return model(input_ids=ids, attention_mask=mask)


def _device(model: Any) -> torch.device:
    param = next(iter(model.parameters()), None)
    return param.device if param is not None else torch.device("cpu")


def _finite(name: str, *tensors: torch.Tensor) -> None:
    if not all(bool(torch.isfinite(t).all()) for t in tensors):
        raise FloatingPointError(
            f"non-finite {name} in the actor-critic step; lower the learning rates or check "
            "the rewards"
        )


class ActorCriticLoop143:
    """1.4.3's private loop methods of ``IACTrainer``/``MAACTrainer`` (see the module
    docstring). Reads ``args`` (``use_separate_critic``, ``value_loss_coef``,
    ``value_clip_range``, ``train_batch_size``, ``advantage_normalization``), ``agents``,
    ``critics``, ``agent_optimizers``, ``critic_optimizers``, ``critic_type`` and
    ``method``."""

    args: Any
    method: str
    env_step: int

    # --- values -----------------------------------------------------------------
    def _value_on_full_sequence(
        self,
        model: Any,
        sequences: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_len: int,
        response_lens: Sequence[int],
    ) -> torch.Tensor:
        """``[B]`` ``Q(h, a)``: the value output at the last response token of each row."""
        out = []
        for row, mask, length in zip(sequences, attention_mask, response_lens, strict=True):
            end = int(prompt_len) + int(length)
            values = forward_143(model, row[None, :end], mask[None, :end], True).values
            if values is None:
                raise RuntimeError("the critic returned no values (no value head)")
            out.append(values[:, -1])
        return torch.cat(out)

    def _value_for_critic_type(
        self,
        model: Any,
        sequences: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_len: int,
        response_lens: Sequence[int] | None,
    ) -> torch.Tensor:
        """``V(h)`` (``critic_type="v"``) or ``Q(h, a)`` (``"q"``) of each row."""
        kind = getattr(self, "critic_type", None) or getattr(self.args, "critic_type", "v")
        if str(kind) == "q":
            lengths = response_lens or [sequences.shape[1] - int(prompt_len)] * len(sequences)
            return self._value_on_full_sequence(
                model, sequences, attention_mask, prompt_len, lengths
            )
        return self._value_on_prompt_only(model, sequences, attention_mask, prompt_len)  # type: ignore[attr-defined]

    def _critic_device(self, agent_idx: int) -> torch.device:
        """Where agent ``agent_idx``'s critic sits (its agent's device for a value head)."""
        if not self.args.use_separate_critic:
            return _device(self.agents[agent_idx])  # type: ignore[attr-defined]
        return _device(self.critics[agent_idx])  # type: ignore[attr-defined]

    # --- the update ---------------------------------------------------------------
    def _ac_step(self, agent_idx: int, batch: Sequence[Any]) -> None:
        """1.4.3's update of agent ``agent_idx`` (and its critic) on ``batch``'s samples
        (see the module docstring).

        Raises:
            RuntimeError: a sample without ``metadata["value_target"]``.
            FloatingPointError: a non-finite log-prob, advantage, target or loss.
        """
        actor = self.agents[agent_idx]  # type: ignore[attr-defined]
        centralised = self.method == "maac"
        separate = centralised or bool(self.args.use_separate_critic)
        critic = self.critics[0 if centralised else agent_idx] if separate else actor  # type: ignore[attr-defined]
        clip = None if separate else self.args.value_clip_range
        actor_losses, value_losses = [], []
        for s in batch:
            ids = s.full_input_ids.to(_device(actor))[None]
            mask = s.attention_mask.to(ids.device)[None]
            logp, _ = self._policy_eval(  # type: ignore[attr-defined]
                actor, ids, mask, s.prompt_len, s.response_len, output_values=False,
                completion_loss_mask=s.metadata.get("completion_loss_mask"),
            )  # fmt: skip
            if centralised:
                meta, where = s.metadata, _device(critic)
                value = self._value_on_prompt_only(  # type: ignore[attr-defined]
                    critic, meta["joint_input_ids"].to(where),
                    meta["joint_attention_mask"].to(where), int(meta["joint_prompt_len"]),
                )  # fmt: skip
            else:
                where = _device(critic)
                value = self._value_for_critic_type(
                    critic, ids.to(where), mask.to(where), s.prompt_len, [s.response_len]
                )
            target = s.metadata.get("value_target")
            if target is None:
                raise RuntimeError(
                    f"sample of agent {s.agent_idx} has no metadata['value_target'] (the "
                    "critic's regression target)"
                )
            target = target.to(value.device, value.dtype)
            advantage = s.normalized_advantage.to(logp.device, logp.dtype)
            _finite("log-prob, advantage or value target", logp, advantage, target)
            actor_losses.append(-(logp * advantage))
            error = (target - value) ** 2
            if clip is not None:
                old = s.old_value.to(value.device, value.dtype)
                clipped = old + torch.clamp(value - old, -clip, clip)
                error = torch.maximum(error, (target - clipped) ** 2)
            value_losses.append(error)
        actor_loss = torch.stack(actor_losses).mean()
        value_loss = float(self.args.value_loss_coef) * torch.stack(value_losses).mean()
        _finite("policy or value loss", actor_loss, value_loss)
        actor_opt = self.agent_optimizers[agent_idx]  # type: ignore[attr-defined]
        if not separate:
            actor_opt.zero_grad()
            (actor_loss + value_loss).backward()
            actor_opt.step()
            return
        critic_opt = (
            self.critic_optimizer  # type: ignore[attr-defined]
            if centralised
            else self.critic_optimizers[agent_idx]  # type: ignore[attr-defined]
        )
        for loss, opt in ((actor_loss, actor_opt), (value_loss, critic_opt)):
            opt.zero_grad()
            loss.backward()
            opt.step()

    def _prepare_advantages(self, rollouts: Sequence[Any]) -> None:
        """Set each sample's ``advantage`` (``adv_target``, else ``value_target``, else
        ``returns``, minus ``old_value``) and ``normalized_advantage`` (whitened over the
        samples, population std floored at 1e-6, with ``advantage_normalization`` and more
        than one sample; else a copy)."""
        if not rollouts:
            return
        for s in rollouts:
            target = s.metadata.get("adv_target")
            target = s.metadata.get("value_target") if target is None else target
            target = s.returns if target is None else target
            adv = target.float() - s.old_value.float()
            s.advantage = adv.to(s.returns.dtype)
        flat = torch.stack([s.advantage.float().reshape(-1)[0] for s in rollouts])
        whiten = bool(getattr(self.args, "advantage_normalization", False)) and len(flat) > 1
        mean, std = flat.mean(), flat.std(unbiased=False).clamp(min=1e-6)
        for s in rollouts:
            s.normalized_advantage = (
                (s.advantage.float() - mean) / std if whiten else s.advantage.clone()
            )

    def _summarize_rollout_metrics(self, rollouts: Sequence[Any]) -> dict[str, float]:
        """``reward_mean`` and ``expected_return`` (and ``reference_kl_mean``,
        ``reference_kl_penalty_mean`` when the samples carry them) over finite values."""
        out: dict[str, float] = {}
        fields = {
            "reward_mean": [float(s.reward.reshape(-1)[0]) for s in rollouts],
            "expected_return": [float(s.returns.reshape(-1)[0]) for s in rollouts],
        }
        for key in ("reference_kl", "reference_kl_penalty"):
            fields[f"{key}_mean"] = [float(s.metadata[key]) for s in rollouts if key in s.metadata]
        for key, values in fields.items():
            tensor = torch.tensor(values, dtype=torch.float32)
            if values and bool(torch.isfinite(tensor).all()):
                out[key] = float(tensor.mean())
        return out

    def _update(self, agent_idx: int, rollouts: list[Any]) -> dict[str, float]:
        """Agent ``agent_idx``'s metrics, then :meth:`_ac_step` on shuffled batches of
        ``train_batch_size`` samples (Python's ``random``, as 1.4.3)."""
        if not rollouts:
            return {}
        metrics = self._summarize_rollout_metrics(rollouts)
        self._prepare_advantages(rollouts)
        random.shuffle(rollouts)
        size = max(1, int(self.args.train_batch_size or len(rollouts)))
        for start in range(0, len(rollouts), size):
            self._ac_step(agent_idx, rollouts[start : start + size])
        return metrics

    # --- buffers ------------------------------------------------------------------
    @property
    def rollout_buffers(self) -> list[list[Any]]:
        """Each agent's buffered samples (created on first use)."""
        count = int(self.args.num_agents)
        return self.__dict__.setdefault("_rollout_buffers", [[] for _ in range(count)])

    @rollout_buffers.setter
    def rollout_buffers(self, buffers: list[list[Any]]) -> None:
        self.__dict__["_rollout_buffers"] = buffers

    def _tag_metrics(
        self, metrics: dict[str, float], agent_idx: int, turn_idx: int = 0
    ) -> dict[str, float]:
        """``turn_<t+1>/<key>`` names (1.4.3 does not put the agent in them)."""
        return {f"turn_{turn_idx + 1}/{key}": value for key, value in metrics.items()}

    def _process_buffer(self, agent_idx: int, buffer: list[Any]) -> dict[str, Any]:
        """Empty ``buffer`` into one :meth:`_update` per turn (``metadata["turn_idx"]``);
        returns ``metric_values`` (lists) and ``log_metrics`` (tagged by turn)."""
        turns: dict[int, list[Any]] = {}
        for s in buffer:
            turns.setdefault(int(s.metadata.get("turn_idx", 0)), []).append(s)
        buffer.clear()
        log: dict[str, float] = {}
        values: dict[str, list[float]] = {}
        for t in sorted(turns):
            tagged = self._tag_metrics(self._update(agent_idx, turns[t]), agent_idx, turn_idx=t)
            log.update(tagged)
            for key, value in tagged.items():
                values.setdefault(key, []).append(value)
        return {"metric_values": values, "log_metrics": log}

    def _drain_ready_agent_buffers(
        self, ready_agents: Sequence[int], epoch_metrics: dict[str, list[float]]
    ) -> None:
        """Update every ready agent (in index order, each once) on its buffer; in
        parallel where ``parallel_training="mp"`` allows, except MAAC (its critic is
        shared by the agents' updates). Metrics go to ``epoch_metrics`` and W&B."""
        indices = sorted({int(i) for i in ready_agents})
        if not indices:
            return
        parallel = self.__dict__.get("_parallel_update_enabled")
        if parallel is None:
            parallel = self.method != "maac" and self._parallel_agent_mode_enabled()  # type: ignore[attr-defined]
        results = self._run_agent_tasks(  # type: ignore[attr-defined]
            lambda i: self._process_buffer(i, self.rollout_buffers[i]),
            agent_indices=indices,
            parallel=bool(parallel),
        )
        log: dict[str, float] = {}
        for result in results:
            for key, values in result.get("metric_values", {}).items():
                epoch_metrics.setdefault(key, []).extend(values)
            log.update(result.get("log_metrics", {}))
        if log and self._should_log_train():
            self._log_metrics(log)

    # --- logging --------------------------------------------------------------------
    @property
    def wandb_initialized(self) -> bool:
        """Whether a W&B run is started (1.4.3's flag; assignable, as its tests do)."""
        given = self.__dict__.get("_wandb_initialized")
        return bool(given) if given is not None else self.__dict__.get("_wandb_run") is not None

    @wandb_initialized.setter
    def wandb_initialized(self, value: bool) -> None:
        self.__dict__["_wandb_initialized"] = bool(value)

    def _should_log_train(self) -> bool:
        """1.4.3's ``logging_steps``: log when at least that many environment steps passed
        since the last logged row (always with ``logging_steps <= 1``)."""
        every = int(getattr(self.args, "logging_steps", 1) or 1)
        last = int(self.__dict__.get("_last_train_log_step", -1))
        if every <= 1 or last < 0 or self.env_step - last >= every:
            self._last_train_log_step = self.env_step
            return True
        return False

    def _log_metrics(self, metrics: dict[str, float]) -> None:
        """``wandb.log(metrics, step=env_step)`` once a run is started (1.4.3)."""
        if metrics and self.wandb_initialized:
            from comlrl.trainers._wandb import _import_wandb

            _import_wandb().log(dict(metrics), step=int(self.env_step))

    def _evaluate_rollouts143(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """1.4.3's ``evaluate()`` through a subclass's ``_collect_rollouts(item)``: the
        first ``eval_num_samples`` examples, no gradients, ``_in_eval`` set meanwhile;
        returns ``eval/turn_<t>/<metric>`` (:meth:`_summarize_rollout_metrics`)."""
        data = getattr(self, "eval_dataset", None)
        if data is None:
            return {}
        limit = int(self.args.eval_num_samples if num_eval_samples is None else num_eval_samples)
        turns: dict[int, list[Any]] = {}
        self._in_eval = True
        try:
            with torch.no_grad():
                for n, item in enumerate(data):
                    if n >= limit:
                        break
                    for s in self._collect_rollouts(item):  # type: ignore[attr-defined]
                        turns.setdefault(int(s.metadata.get("turn_idx", 0)), []).append(s)
        finally:
            self._in_eval = False
        out = {
            f"eval/turn_{t + 1}/{key}": value
            for t in sorted(turns)
            for key, value in self._summarize_rollout_metrics(turns[t]).items()
        }
        self._log_metrics(out)
        return out
