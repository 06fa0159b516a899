"""Value heads and critics for the actor-critic recipes (IAC, MAAC).

A :class:`ValueHead` maps a causal LM's last hidden state ``[..., H]`` to a scalar value
in reward units. A :class:`Critic` is a trunk (a ``transformers`` causal LM) plus a head:
it reads the text it is given, runs the trunk's base model (no LM head, no logits) and
applies the head to the hidden state of the *last* token. What the text holds decides
what the critic estimates:

- a state critic ``V(s)``: the prompt (IAC: the agent's own prompt; MAAC: every agent's
  prompt, concatenated), read at the last prompt token;
- a joint-action critic ``Q(s, a)``: the prompt followed by the completion (IAC: the
  agent's own; MAAC: every agent's), read at the last response token.

The trunk is either a model of its own (a separate critic) or the actor's own model (a
shared trunk: the value loss also trains the actor's layers). Only the head's weights
are new; :func:`save_value_head` writes them as ``value_head.safetensors`` with a small
``value_head.json`` beside a Hugging Face checkpoint, and :func:`load_value_head` reads
them back.

Named axes: ``M`` texts, ``S`` padded tokens, ``H`` hidden size.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

__all__ = [
    "VALUE_HEAD_WEIGHTS",
    "VALUE_HEAD_CONFIG",
    "ValueHead",
    "Critic",
    "save_value_head",
    "load_value_head",
    "hidden_size_of",
]

#: File names of a saved value head, beside the Hugging Face weights of its trunk.
VALUE_HEAD_WEIGHTS = "value_head.safetensors"
VALUE_HEAD_CONFIG = "value_head.json"

CriticKind = Literal["v", "q"]

#: A length bucket of :meth:`Critic.values` closes before its left padding would exceed
#: this fraction of its ``rows * width`` tokens.
MAX_PADDING_FRACTION = 0.25


def _length_buckets(lengths: Sequence[int], max_rows: int | None) -> list[list[int]]:
    """Split positions ``0..len(lengths)-1`` of ascending ``lengths`` into consecutive
    buckets whose padding ``sum(width - length)`` stays within ``MAX_PADDING_FRACTION`` of
    ``rows * width`` (``width``: the bucket's longest) and that hold at most ``max_rows``."""
    buckets: list[list[int]] = []
    current: list[int] = []
    total = 0
    for k, n in enumerate(lengths):
        rows = len(current) + 1
        padding = rows * n - (total + n)
        full = max_rows is not None and len(current) >= max_rows
        if current and (full or padding > MAX_PADDING_FRACTION * rows * n):
            buckets.append(current)
            current, total = [], 0
        current.append(k)
        total += n
    if current:
        buckets.append(current)
    return buckets


def hidden_size_of(model: Any) -> int:
    """The hidden size ``H`` of a ``transformers`` model (``config.hidden_size`` or ``n_embd``).

    Raises:
        ValueError: the model's config has neither.
    """
    config = getattr(model, "config", None)
    size = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    if not isinstance(size, int) or size < 1:
        raise ValueError(
            f"cannot find the hidden size of {type(model).__name__}: its config has no "
            "hidden_size or n_embd; build the ValueHead with an explicit hidden_size"
        )
    return size


class ValueHead(nn.Module):
    """A scalar value from a hidden state: ``Linear(H, 1)``, or ``Linear(H, D) -> tanh ->
    Linear(D, 1)`` with ``hidden_dim = D``.

    Parameters are float32 whatever the trunk's dtype; the input is cast to float32. The
    last layer starts at zero, so a new critic predicts 0 (advantages start as the
    returns) and its first updates move only the output layer.

    Args:
        hidden_size: ``H``, the trunk's hidden size.
        hidden_dim: ``D`` of the optional hidden layer; None for a linear head.

    Raises:
        ValueError: ``hidden_size`` or ``hidden_dim`` not a positive integer.
    """

    def __init__(self, hidden_size: int, hidden_dim: int | None = None) -> None:
        super().__init__()
        for name, value in (("hidden_size", hidden_size), ("hidden_dim", hidden_dim)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.hidden_size = hidden_size
        self.hidden_dim = hidden_dim
        self.hidden: nn.Module | None = None
        last = hidden_size
        if hidden_dim is not None:
            self.hidden = nn.Sequential(nn.Linear(hidden_size, hidden_dim), nn.Tanh())
            last = hidden_dim
        self.out = nn.Linear(last, 1)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[..., H]`` hidden states (any float dtype) -> ``[...]`` float32 values."""
        x = hidden_states.to(self.out.weight.dtype)
        if self.hidden is not None:
            x = self.hidden(x)
        return self.out(x).squeeze(-1)

    def config(self) -> dict[str, Any]:
        """What :func:`load_value_head` needs to rebuild the head."""
        return {"format": 1, "hidden_size": self.hidden_size, "hidden_dim": self.hidden_dim}


def save_value_head(head: ValueHead, directory: str | Path, *, kind: str | None = None) -> Path:
    """Write ``head`` to ``directory/value_head.safetensors`` and ``value_head.json``.

    Args:
        head: the head to save.
        directory: a folder (created if missing), usually the trunk's checkpoint folder.
        kind: ``"v"`` or ``"q"``, recorded in the JSON for the reader.

    Returns:
        the weights file's path.
    """
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
    path = directory / VALUE_HEAD_WEIGHTS
    save_file(state, str(path))
    meta = {**head.config(), "kind": kind}
    (directory / VALUE_HEAD_CONFIG).write_text(json.dumps(meta, indent=2) + "\n")
    return path


def load_value_head(directory: str | Path, *, hidden_size: int | None = None) -> ValueHead:
    """Read a head written by :func:`save_value_head`.

    Args:
        directory: the folder holding ``value_head.safetensors`` and ``value_head.json``.
        hidden_size: the trunk's hidden size, to check the head fits it.

    Raises:
        FileNotFoundError: either file is missing (the message names the folder).
        ValueError: the saved head's hidden size differs from ``hidden_size``.
    """
    from safetensors.torch import load_file

    directory = Path(directory)
    weights, meta_path = directory / VALUE_HEAD_WEIGHTS, directory / VALUE_HEAD_CONFIG
    for p in (weights, meta_path):
        if not p.is_file():
            raise FileNotFoundError(
                f"no value head in {str(directory)!r}: {p.name} is missing; save one with "
                "save_value_head() (actor-critic checkpoints write it beside the model)"
            )
    meta = json.loads(meta_path.read_text())
    if hidden_size is not None and meta["hidden_size"] != hidden_size:
        raise ValueError(
            f"the value head in {str(directory)!r} was built for hidden size "
            f"{meta['hidden_size']} but the trunk has {hidden_size}; load it on the model it "
            "was trained with"
        )
    head = ValueHead(int(meta["hidden_size"]), meta.get("hidden_dim"))
    head.load_state_dict(load_file(str(weights)))
    return head


class Critic:
    """A trunk causal LM, its tokenizer and a :class:`ValueHead`: texts in, values out.

    Args:
        trunk: a ``transformers`` causal LM; its ``base_model`` gives the hidden states.
            Pass the actor's own model for a shared trunk.
        tokenizer: the trunk's tokenizer (padding side is set to left).
        head: the value head; a new one (linear, zero output) when None.
        kind: ``"v"`` (state value) or ``"q"`` (joint-action value); the caller builds
            the texts accordingly (see the module docstring).
        shared: True when ``trunk`` is an actor's model (the recipe then trains it with
            the actor's optimizer and saves only the head beside the actor).
        max_length: texts are cut to their last ``max_length`` tokens (keeping the token
            the value is read at); None = no cut.

    Raises:
        ValueError: unknown ``kind``, a tokenizer without pad and EOS tokens, or a head
            whose hidden size is not the trunk's.
    """

    def __init__(
        self,
        trunk: Any,
        tokenizer: Any,
        head: ValueHead | None = None,
        *,
        kind: CriticKind = "v",
        shared: bool = False,
        max_length: int | None = None,
    ) -> None:
        if kind not in ("v", "q"):
            raise ValueError(
                f"critic kind must be 'v' (state value) or 'q' (joint action), got {kind!r}"
            )
        size = hidden_size_of(trunk)
        if head is None:
            head = ValueHead(size)
        elif head.hidden_size != size:
            raise ValueError(
                f"the value head takes hidden size {head.hidden_size} but the trunk has {size}"
            )
        if tokenizer.pad_token_id is None:
            if tokenizer.eos_token_id is None:
                raise ValueError(
                    "the critic's tokenizer has neither a pad nor an EOS token; set tokenizer.pad_token"
                )
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"
        self.trunk = trunk
        self.tokenizer = tokenizer
        self.head = head.to(next(trunk.parameters()).device)
        self.kind: CriticKind = kind
        self.shared = shared
        self.max_length = max_length

    @property
    def device(self) -> torch.device:
        """Device of the trunk's parameters."""
        return next(self.trunk.parameters()).device

    def parameters(self) -> Iterator[nn.Parameter]:
        """The trainable parameters: the head's, and the trunk's unless it is shared."""
        yield from self.head.parameters()
        if not self.shared:
            yield from (p for p in self.trunk.parameters() if p.requires_grad)

    def values(self, texts: Sequence[str], *, micro_batch_size: int | None = None) -> torch.Tensor:
        """Values ``[M]`` (float32, reward units) of ``M`` texts, read at each text's last token.

        Runs under the caller's grad mode (wrap in ``torch.no_grad()`` for rollout-time
        values). The texts are tokenized once, sorted by length and run in length buckets
        (a bucket closes when left padding would exceed :data:`MAX_PADDING_FRACTION` of its
        tokens, or at ``micro_batch_size`` texts; None: no count limit), so short turn-1
        prompts are not padded to the length of long later-turn prompts; the values come
        back in the order of ``texts``.

        Raises:
            ValueError: no texts, or ``micro_batch_size`` < 1.
        """
        if not texts:
            raise ValueError("no texts to evaluate; give the critic at least one text")
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or None, got {micro_batch_size}")
        ids = self.tokenizer(list(texts), add_special_tokens=True)["input_ids"]
        if self.max_length is not None:
            ids = [row[-self.max_length :] for row in ids]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out: list[torch.Tensor | None] = [None] * len(ids)
        for bucket in _length_buckets([len(ids[i]) for i in order], micro_batch_size):
            rows = [order[k] for k in bucket]
            values = self._values([ids[i] for i in rows])
            for k, i in enumerate(rows):
                out[i] = values[k]
        return torch.stack([v for v in out if v is not None])

    def _values(self, rows: list[list[int]]) -> torch.Tensor:
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=self.device)
        mask = torch.tensor(
            [[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.device
        )
        base = getattr(self.trunk, "base_model", self.trunk)
        hidden = base(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            use_cache=False,
        ).last_hidden_state  # [m, S, H]
        return self.head(hidden[:, -1])  # left padding: the last position is the last token

    def save(self, directory: str | Path) -> Path:
        """Write the head (and, for a separate critic, the trunk and tokenizer in Hugging
        Face format) to ``directory``; returns it."""
        directory = Path(directory)
        if not self.shared:
            self.trunk.save_pretrained(directory)
            self.tokenizer.save_pretrained(directory)
        save_value_head(self.head, directory, kind=self.kind)
        return directory

    @classmethod
    def load(
        cls,
        directory: str | Path,
        *,
        kind: CriticKind | None = None,
        trunk: Any | None = None,
        tokenizer: Any | None = None,
        dtype: str = "float32",
    ) -> Critic:
        """A critic from :meth:`save`'s folder.

        A separate critic loads its trunk from ``directory``; for a shared one pass the
        (already loaded) actor as ``trunk`` and ``tokenizer``. ``kind`` defaults to the
        one recorded in ``value_head.json``.

        Raises:
            FileNotFoundError: no value head in ``directory``.
            ValueError: the head does not fit the trunk.
        """
        if trunk is None:
            from comlrl.algos.models.loading import load_model_and_tokenizer

            trunk, tokenizer = load_model_and_tokenizer(str(directory), dtype=dtype)
            shared = False
        else:
            if tokenizer is None:
                raise ValueError("pass the tokenizer with the trunk")
            shared = True
        head = load_value_head(directory, hidden_size=hidden_size_of(trunk))
        saved = json.loads((Path(directory) / VALUE_HEAD_CONFIG).read_text()).get("kind")
        return cls(trunk, tokenizer, head, kind=kind or saved or "v", shared=shared)
