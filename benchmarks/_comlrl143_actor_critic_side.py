"""CoMLRL 1.4.3 side of the actor-critic throughput benchmark (runs in their own venv).

Reads a JSON spec, trains the published ``comlrl==1.4.3`` ``IACTrainer`` or ``MAACTrainer``
(two agents, ``num_turns`` turns with ``_story_reward.transition`` as ``external_transition``,
the cooperative ``_story_reward.story_reward``, ``num_generations = 1`` as their actor-critic
requires for several turns) and writes a JSON result::

    <venv-comlrl143>/bin/python benchmarks/_comlrl143_actor_critic_side.py --spec SPEC.json --out OUT.json

Spec (JSON object; * = required):

    method*              str        "iac" or "maac"
    model_dir*           str        local HF model folder (agents and critics all load it)
    examples_path*       str        JSON list of ``story_examples`` dicts, used in order: the
                                    first ``warmup*batch_size`` for the warm-up, the next
                                    ``steps*batch_size`` for the measured run
    batch_size*          int        prompts per step
    steps*               int        measured steps
    warmup               int   1
    num_turns            int   2
    max_new_tokens       int   32
    temperature          float 1.0  (top_p 1.0, top_k None)
    learning_rate        float 1e-3 (actors)
    critic_learning_rate float 1e-3
    value_loss_coef      float 0.6  (their default)
    value_clip_range     float|null null (IAC only; MAAC has none)
    critic_type          str   "v"
    seed                 int   0
    threads              int   1    torch.set_num_threads
    device               str   "cpu" agent_devices and critic_devices (cpu, cuda)

What one step is on their side: ``train()`` takes one example at a time and plays its
``num_turns`` turns (one ``generate`` per agent per turn, G = 1; no early termination);
each turn adds one sample per agent to that agent's buffer. With
``rollout_buffer_size = train_batch_size = batch_size * num_turns`` an agent's buffer is
trained on once per ``batch_size`` examples, one turn at a time: per step each agent takes
``num_turns`` actor optimizer steps and ``num_turns`` critic optimizer steps (MAAC: the one
shared critic takes one step per agent per turn).

Timing: their public ``train()`` over ``steps * batch_size`` examples after a warm-up
``train()`` over ``warmup * batch_size`` other examples. Stage seconds come from wrapping the
instance's own methods (``_collect_rollouts``: generate + behaviour log-probs + critic
values + rewards; the reward function itself; ``_update``: the actor and critic updates);
nothing in their code is changed. The reward curve has one mean per measured step and turn
(the joint rewards of that step's ``batch_size`` examples).
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from _bench_common import dist_version, side_spec


def main() -> int:
    spec, out_path = side_spec(__doc__.splitlines()[0])

    import numpy as np
    import torch
    import transformers

    torch.set_num_threads(int(spec.get("threads", 1)))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _story_reward as story  # noqa: E402  (the shared, dependency-free task)

    method = str(spec["method"])
    if method not in ("iac", "maac"):
        raise SystemExit(f"method must be 'iac' or 'maac', got {method!r}")
    model_dir = str(spec["model_dir"])
    b, steps, warmup = int(spec["batch_size"]), int(spec["steps"]), int(spec.get("warmup", 1))
    num_turns = int(spec.get("num_turns", 2))
    examples = json.loads(Path(spec["examples_path"]).read_text())
    need = (warmup + steps) * b
    if len(examples) < need:
        raise SystemExit(f"{spec['examples_path']} has {len(examples)} examples; {need} needed")
    warm_items, meas_items = examples[: warmup * b], examples[warmup * b : need]

    state: dict[str, Any] = {"turn": 0}
    rewards_turn: dict[int, list[float]] = defaultdict(list)
    stage = defaultdict(float)

    def reward_func(*completions, batch_items=None):
        t0 = time.perf_counter()
        out = story.story_reward(list(completions[0]), list(completions[1]), batch_items[0])
        stage["reward"] += time.perf_counter() - t0
        rewards_turn[state["turn"]].extend(float(r) for r in out)
        state["turn"] = (state["turn"] + 1) % num_turns  # turns of one example come in order
        return out

    buffer = b * num_turns
    common = dict(
        agent_learning_rate=float(spec.get("learning_rate", 1e-3)),
        critic_learning_rate=float(spec.get("critic_learning_rate", 1e-3)),
        rollout_buffer_size=buffer,
        train_batch_size=buffer,
        value_loss_coef=float(spec.get("value_loss_coef", 0.6)),
        advantage_normalization=True,
        max_new_tokens=int(spec.get("max_new_tokens", 32)),
        temperature=float(spec.get("temperature", 1.0)),
        top_p=1.0,
        top_k=None,
        num_train_epochs=1,
        num_agents=2,
        num_generations=1,
        num_turns=num_turns,
        discount=1.0,
        critic_type=str(spec.get("critic_type", "v")),
        early_termination_threshold=None,
        eval_interval=0,
        logging_steps=1,
        agent_devices=str(spec.get("device", "cpu")),
        critic_devices=str(spec.get("device", "cpu")),
    )
    seed = int(spec.get("seed", 0))
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    kwargs = dict(
        agent_model=model_dir,
        reward_func=reward_func,
        formatters=[story.make_formatter(a) for a in range(2)],
        external_transition=story.transition if num_turns > 1 else None,
        train_dataset=warm_items,
        wandb_config=None,
    )
    if method == "iac":
        from comlrl.trainers.actor_critic import IACConfig, IACTrainer

        cfg = IACConfig(
            **common, use_separate_critic=True, value_clip_range=spec.get("value_clip_range")
        )
        trainer = IACTrainer(critic_model=model_dir, args=cfg, **kwargs)
    else:
        from comlrl.trainers.actor_critic import MAACConfig, MAACTrainer

        cfg = MAACConfig(**common)
        trainer = MAACTrainer(critic_model=model_dir, args=cfg, **kwargs)

    orig_collect, orig_update = trainer._collect_rollouts, trainer._update

    def collect(item):
        t0 = time.perf_counter()
        out = orig_collect(item)
        stage["rollout"] += time.perf_counter() - t0
        return out

    def update(agent_idx, samples):
        t0 = time.perf_counter()
        out = orig_update(agent_idx, samples)
        stage["update"] += time.perf_counter() - t0
        stage["update_calls"] += 1
        return out

    trainer._collect_rollouts, trainer._update = collect, update

    t0 = time.perf_counter()
    trainer.train()
    warm_s = time.perf_counter() - t0
    stage.clear()
    rewards_turn.clear()
    trainer.train_dataset = meas_items
    c0 = os.times()
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    c1 = os.times()

    prompts = len(meas_items)
    curve = {
        f"turn_{t}": [float(np.mean(v[i : i + b])) for i in range(0, len(v), b)]
        for t, v in sorted(rewards_turn.items())
    }
    rollout_excl_reward = stage["rollout"] - stage["reward"]
    other = wall - stage["rollout"] - stage["update"]
    result = {
        "side": "comlrl==1.4.3",
        "method": method,
        "prompts": prompts,
        "steps": steps,
        "batch_size": b,
        "wall_s": wall,
        "warmup_wall_s": warm_s,
        "prompts_per_s": prompts / wall,
        "step_s": wall / steps,
        "stage_s_per_step": {
            "rollout_and_critic_values": rollout_excl_reward / steps,
            "reward": stage["reward"] / steps,
            "update": stage["update"] / steps,
            "other": other / steps,
        },
        "update_calls_per_step": stage["update_calls"] / steps,
        "reward_curve_by_turn": curve,
        "reward_mean_by_turn": {k: float(np.mean(v)) for k, v in curve.items()},
        "cpu_s": (c1.user - c0.user) + (c1.system - c0.system),
        "config": {**common, "method": method, "value_clip_range": spec.get("value_clip_range")},
        "versions": {
            "python": platform.python_version(),
            "comlrl": dist_version("comlrl"),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "torch_threads": torch.get_num_threads(),
        "spec": spec,
    }
    out_path.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("method", "prompts_per_s", "stage_s_per_step")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
