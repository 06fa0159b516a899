"""The numbers a step logs about its rollout (:func:`rollout_metrics`; over data parallel
ranks :func:`rollout_summary` + :func:`merge_summaries` + :func:`summary_metrics`) and the
joint actions written to ``samples.jsonl`` (:func:`sample_rows`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from comlrl.algos.records import Rollout
from comlrl.algos.rollout.mixture import task_reward_sums
from comlrl.algos.rollout.tool_metrics import sum_tool_counts, tool_counts, tool_metrics

__all__ = [
    "rollout_metrics",
    "rollout_summary",
    "merge_summaries",
    "summary_metrics",
    "sample_rows",
]


def rollout_metrics(
    rollout: Rollout, advantages: Sequence[Sequence[torch.Tensor]] | None = None
) -> dict[str, float]:
    """Per-step and per-turn numbers of a rollout.

    Keys: ``reward_mean/std/min/max`` and ``return_mean`` over turn-0 joint actions (the
    team's reward on the task as posed), ``num_joint_actions``, ``num_tokens``; per turn
    ``t``: ``turn_<t>/reward_mean``, ``/reward_std``, ``/return_mean``, ``/num_nodes``,
    ``/terminal_fraction``; per turn and agent ``a``: ``turn_<t>/completion_len_mean/agent_<a>``
    and, with ``advantages`` (per turn, per agent ``[B_t]``),
    ``turn_<t>/advantage_mean/agent_<a>`` and ``/advantage_std/agent_<a>``; all-turn
    ``completion_len_mean/agent_<a>``, ``completion_len_max/agent_<a>``,
    ``advantage_mean/agent_<a>``, ``advantage_std/agent_<a>``.

    When agents have tools (:mod:`comlrl.algos.rollout.tool_calls`), also, over all turns
    and per turn ``t`` (``turn_<t>/...``), per agent ``a`` with tools:
    ``tool_calls_mean/agent_<a>`` (calls per completion), ``tool_result_tokens_mean/agent_<a>``
    (observation tokens per completion), ``tool_seconds/agent_<a>`` (seconds its calls ran,
    summed: time overlapped with decoding counts too); and ``tool_errors/<kind>`` (calls
    that ended in each error kind of :data:`comlrl.core.TOOL_ERROR_KINDS`, all agents)
    with ``tool_error_fraction`` (of all calls; 0 without calls).

    On a task mixture (reward infos naming their task, :mod:`comlrl.algos.rollout.mixture`):
    ``reward/<task>``, the mean turn-0 reward of that task's joint actions (absent in a
    step that drew no example of it).

    When the task's reward infos carry ``hack_signals`` (the code suites of
    :mod:`comlrl.envs`: the reward-hacking patterns found in a joint action's program,
    :func:`comlrl.envs.code.hack_signals`), also ``hack_signals/count`` (joint actions of
    all turns with at least one signal), ``hack_signals/fraction`` (of all joint actions)
    and ``hack_signals/<signal>`` (joint actions showing that signal), so a policy drifting
    toward hacks shows before its reward does.

    The same numbers over several rollouts (data parallel ranks):
    ``summary_metrics(merge_summaries([rollout_summary(ro_r, adv_r) for each rank r]))``.
    """
    return summary_metrics(rollout_summary(rollout, advantages))


def rollout_summary(
    rollout: Rollout, advantages: Sequence[Sequence[torch.Tensor]] | None = None
) -> list[dict[str, Any]]:
    """What :func:`rollout_metrics` reads, per turn, as small CPU tensors (picklable).

    Per turn: ``rewards`` and ``returns`` ``[N_t, K]`` float32, ``terminal`` ``[N_t, K]``
    bool, ``lengths`` (per agent, completion lengths ``[B_t]`` float32), ``tasks``
    (:func:`task_reward_sums`),
    ``advantages`` (per agent ``[B_t]`` float32, or None) and ``hacks`` (None when the
    infos carry no ``hack_signals``, else ``{"flagged": n, "<signal>": n, ...}``) and
    ``tools`` (per agent ``None`` without tools, else ``{"completions", "calls",
    "result_tokens", "seconds", "<error kind>": n}``).
    """
    out = []
    for t, turn in enumerate(rollout.turns):
        out.append(
            {
                "tools": [tool_counts(s) for s in turn.agents],
                "hacks": _hack_counts(turn.infos),
                "tasks": task_reward_sums(turn.infos, turn.rewards),
                "rewards": turn.rewards.detach().float().cpu(),
                "returns": turn.returns.detach().float().cpu(),
                "terminal": turn.terminal.detach().cpu(),
                "lengths": [s.batch.completion_mask.sum(dim=1).float().cpu() for s in turn.agents],
                "advantages": (
                    [a.detach().float().cpu() for a in advantages[t]]
                    if advantages is not None
                    else None
                ),
            }
        )
    return out


def _hack_counts(infos: Sequence[Mapping[str, Any]]) -> dict[str, int] | None:
    """``{"flagged": joint actions with a signal, <signal>: joint actions with it}``, or
    None when no info reports ``hack_signals``."""
    if not any(isinstance(i, Mapping) and "hack_signals" in i for i in infos):
        return None
    counts = {"flagged": 0}
    for info in infos:
        signals = set(info.get("hack_signals") or ()) if isinstance(info, Mapping) else set()
        counts["flagged"] += bool(signals)
        for s in signals:
            counts[str(s)] = counts.get(str(s), 0) + 1
    return counts


def _sum_counts(parts: Sequence[Mapping[str, int] | None]) -> dict[str, int] | None:
    """The key-wise sum of the count dicts in ``parts`` (None: no part had one)."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    total: dict[str, int] = {}
    for counts in present:
        for key, n in counts.items():
            total[key] = total.get(key, 0) + n
    return total


def _sum_task_rewards(
    parts: Sequence[Mapping[str, Sequence[float]] | None],
) -> dict[str, list[float]] | None:
    present = [p for p in parts if p is not None]
    if not present:
        return None
    total: dict[str, list[float]] = {}
    for sums in present:
        for name, (value, count) in sums.items():
            entry = total.setdefault(name, [0.0, 0.0])
            entry[0] += value
            entry[1] += count
    return total


def merge_summaries(summaries: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Concatenate :func:`rollout_summary` outputs turn by turn (a rollout may have fewer turns)."""
    turns = max(len(s) for s in summaries)
    merged = []
    for t in range(turns):
        parts = [s[t] for s in summaries if len(s) > t]
        entry: dict[str, Any] = {
            key: torch.cat([p[key] for p in parts]) for key in ("rewards", "returns", "terminal")
        }
        entry["lengths"] = [
            torch.cat(xs) for xs in zip(*(p["lengths"] for p in parts), strict=True)
        ]
        advs = [p["advantages"] for p in parts]
        entry["advantages"] = (
            None
            if any(a is None for a in advs)
            else [torch.cat(xs) for xs in zip(*advs, strict=True)]
        )
        entry["hacks"] = _sum_counts([p.get("hacks") for p in parts])
        entry["tools"] = [
            sum_tool_counts(xs) for xs in zip(*(p.get("tools") or [] for p in parts), strict=False)
        ]
        entry["tasks"] = _sum_task_rewards([p.get("tasks") for p in parts])
        merged.append(entry)
    return merged


def summary_metrics(summary: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The :func:`rollout_metrics` row of a :func:`rollout_summary` (or merged summaries)."""
    out: dict[str, float] = {}
    first = summary[0]["rewards"].reshape(-1)
    out["reward_mean"] = float(first.mean())
    out["reward_std"] = float(first.std(unbiased=False))
    out["reward_min"] = float(first.min())
    out["reward_max"] = float(first.max())
    out["return_mean"] = float(summary[0]["returns"].mean())
    out["num_joint_actions"] = float(sum(t["rewards"].numel() for t in summary))
    for name, (total, count) in sorted((summary[0].get("tasks") or {}).items()):
        out[f"reward/{name}"] = total / count
    lengths: dict[int, list[torch.Tensor]] = {}
    advs: dict[int, list[torch.Tensor]] = {}
    for t, turn in enumerate(summary):
        key = f"turn_{t}"
        r = turn["rewards"].reshape(-1)
        out[f"{key}/reward_mean"] = float(r.mean())
        out[f"{key}/reward_std"] = float(r.std(unbiased=False))
        out[f"{key}/return_mean"] = float(turn["returns"].mean())
        out[f"{key}/num_nodes"] = float(turn["rewards"].shape[0])
        out[f"{key}/terminal_fraction"] = float(turn["terminal"].float().mean())
        for a, n in enumerate(turn["lengths"]):
            lengths.setdefault(a, []).append(n)
            out[f"{key}/completion_len_mean/agent_{a}"] = float(n.mean())
            if turn["advantages"] is not None:
                adv = turn["advantages"][a]
                advs.setdefault(a, []).append(adv)
                out[f"{key}/advantage_mean/agent_{a}"] = float(adv.mean())
                out[f"{key}/advantage_std/agent_{a}"] = float(adv.std(unbiased=False))
        out.update(tool_metrics(turn.get("tools") or [], f"{key}/"))
    tools_all = [
        sum_tool_counts(xs) for xs in zip(*(t.get("tools") or [] for t in summary), strict=False)
    ]
    out.update(tool_metrics(tools_all, ""))
    out["num_tokens"] = float(sum(float(x.sum()) for xs in lengths.values() for x in xs))
    total = _sum_counts([turn.get("hacks") for turn in summary])
    if total is not None:
        flagged = total.pop("flagged", 0)
        out["hack_signals/count"] = float(flagged)
        out["hack_signals/fraction"] = flagged / max(out["num_joint_actions"], 1.0)
        for key, n in sorted(total.items()):
            out[f"hack_signals/{key}"] = float(n)
    for a, xs in lengths.items():
        n = torch.cat(xs)
        out[f"completion_len_mean/agent_{a}"] = float(n.mean())
        out[f"completion_len_max/agent_{a}"] = float(n.max())
    for a, xs in advs.items():
        adv = torch.cat(xs)
        out[f"advantage_mean/agent_{a}"] = float(adv.mean())
        out[f"advantage_std/agent_{a}"] = float(adv.std(unbiased=False))
    return out


def sample_rows(ro: Rollout, step: int, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` joint actions per turn of the first nodes, as JSON-ready rows."""
    rows = []
    for turn in ro.turns:
        k = turn.joint_index.shape[0]
        for i in range(min(limit, turn.num_nodes * k)):
            n, j = divmod(i, k)
            idx = turn.joint_index[j].tolist()
            ex = ro.examples[int(turn.example_index[n])]
            fb = turn.feedback[i] if turn.feedback else None
            rows.append(
                {
                    "step": step,
                    "turn": turn.turn,
                    "example_id": ex.get("task_id", ex.get("id")),
                    "node": n,
                    "parent": int(turn.parent[n]),
                    "prompts": [s.prompts[n] for s in turn.agents],
                    "joint_action": idx,
                    "completions": [
                        s.completions[n][g].text for s, g in zip(turn.agents, idx, strict=True)
                    ],
                    "reward": float(turn.rewards[n, j]),
                    "return": float(turn.returns[n, j]),
                    "terminal": bool(turn.terminal[n, j]),
                    "feedback": list(fb.texts) if fb is not None else None,
                    "info": turn.infos[i] if turn.infos else {},
                }
            )
            picked = [s.completions[n][g] for s, g in zip(turn.agents, idx, strict=True)]
            if any(s.with_tools for s in turn.agents):
                # what each agent read: its text with each tool result in place
                rows[-1]["transcripts"] = [c.transcript or c.text for c in picked]
                rows[-1]["tool_calls"] = [[r.as_dict() for r in c.tool_results] for c in picked]
    return rows
