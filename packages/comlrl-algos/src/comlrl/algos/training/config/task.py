"""What a run trains on: :class:`TaskConfig` (config key ``task``: the registered task, its
options, splits, task servers, a task mixture) and :class:`MixtureEntry` (one task of
a mixture). One config key holding a mapping (``task.name=...``), validated before any model
loads; the section of :class:`~comlrl.algos.training.config.rl.TrainConfig` that holds it is in
:mod:`comlrl.algos.training.config.sections`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["MixtureEntry", "TaskConfig"]


class MixtureEntry(BaseModel):
    """One task of a task mixture (``task.mixture``).

    Attributes:
        name: registered task name (``comlrl tasks`` lists them).
        weight: its share of the training examples (weights need not sum to 1: each
            prompt of a batch comes from task ``i`` with probability
            ``weight_i / sum(weights)``).
        kwargs: keyword arguments for that task's constructor.
        label: what the entry is called in the metrics (``reward/<label>``), in the run's
            task name and in its checkpoints; default its task's ``name``. One task can be
            listed twice with other options when each entry has its own label, e.g.
            ``[{name: tool_math, label: mul, kwargs: {level: mul}}, {name: tool_math,
            label: expr, kwargs: {level: expr}}]``. No ``+`` or ``/`` (they join and split
            the names of metrics).
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    weight: float = Field(1.0, gt=0)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    label: str | None = None

    @field_validator("label")
    @classmethod
    def _plain_label(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or v != v.strip() or any(c in v for c in "+/")):
            raise ValueError(
                f"task.mixture label {v!r} must be a non-empty name without spaces at its "
                "ends, '+' or '/' (e.g. label: mul)"
            )
        return v

    @property
    def key(self) -> str:
        """The entry's name in the metrics, the run's task name and checkpoints: its
        ``label``, else its task's ``name``."""
        return self.label if self.label is not None else self.name


class TaskConfig(BaseModel):
    """Which task suite to train on.

    Attributes:
        name: registered task name (entry point group ``comlrl.tasks``), e.g.
            ``coop_story`` (the default) or ``coop_humaneval``; ``comlrl tasks`` lists them
            with their options.
        split: dataset split passed to ``Task.load``.
        kwargs: keyword arguments for the task's constructor (e.g. ``path`` for a local
            data file, ``limit``).
        remote: ``"host:port"`` addresses of task servers (``comlrl-serve --task NAME``)
            that host the whole task: its data, prompts, feedback, tools and rewards, a
            batch's scoring spread over them (:class:`comlrl.envs.remote.RemoteTask`);
            empty: the task runs in this process. ``kwargs`` must be the options the
            servers run it with. (``remote_workers``, the reward-only workers' key, is gone:
            it fails naming this one.)
        remote_timeout_s: seconds a task server may stay silent on a request before it is
            retried on another one.
        mixture: train on several tasks at once (:class:`MixtureEntry` each: name, weight,
            kwargs), e.g. ``task.mixture=[{name: coop_humaneval, weight: 0.5}, {name: mbpp,
            weight: 0.5}]``; ``name`` then becomes their names joined by ``+`` and
            ``kwargs`` must stay empty (each entry has its own; an entry's ``label``, when
            given, stands for its name). Every task must be for the
            same number of agents; ``split`` and ``eval_split`` apply to each. Metrics and
            evaluation rows report each task's reward apart as ``reward/<task>``
            (:mod:`comlrl.algos.rollout.mixture`, :mod:`comlrl.algos.training.run.data_mixture`).
    """

    model_config = ConfigDict(extra="forbid")

    name: str = "coop_story"
    split: str = "train"
    kwargs: dict[str, Any] = Field(default_factory=dict)
    remote_timeout_s: float = Field(300.0, gt=0)
    mixture: list[MixtureEntry] = Field(default_factory=list)
    remote: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "remote_workers" in data:
            raise ValueError(
                "task.remote_workers is gone: the reward workers became the task server's "
                "score operation. Serve the task with `comlrl-serve --task NAME` on each "
                "host and set task.remote=[HOST:PORT, ...] instead"
            )
        return data

    @model_validator(mode="after")
    def _mixture_names(self) -> TaskConfig:
        if not self.mixture:
            return self
        if self.remote:
            raise ValueError("task.remote with task.mixture is not supported; use one of them")
        names = [m.key for m in self.mixture]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(
                f"task.mixture has two entries called {twice[0]!r} ({names!r}): give each "
                "entry of one task its own label, e.g. {name: tool_math, label: mul, "
                "kwargs: {level: mul}}, or list the task once"
            )
        if self.kwargs:
            raise ValueError(
                f"task.kwargs={self.kwargs!r} with task.mixture: give each task its options "
                "in its own entry ({name: ..., weight: ..., kwargs: {...}})"
            )
        joined = "+".join(names)
        if self.name != joined:
            object.__setattr__(self, "name", joined)
        return self

    @field_validator("remote")
    @classmethod
    def _host_port(cls, v: list[str]) -> list[str]:
        for spec in v:
            host, _, port = spec.strip().removeprefix("http://").rstrip("/").rpartition(":")
            if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
                raise ValueError(
                    f"task server address {spec!r} is not 'host:port' with a port in "
                    "1..65535, e.g. 'node7:8471'"
                )
        if len(set(v)) != len(v):
            raise ValueError(f"task.remote lists a server twice: {v!r}; list each once")
        return v
