"""Pushing a training model's weights into a colocated vLLM engine (vLLM 0.32).

vLLM's weight-transfer API for colocated training: the engine is built with
``WeightTransferConfig(backend="ipc")``; the trainer side is an
``IPCTrainerWeightTransferEngine`` over a ``ModuleSource`` of the training model, talking
to the engine through :class:`EngineSyncClient`. Used by
:class:`~comlrl.algos.rollout.sampling.vllm_backend.VLLMBackend` for full models (a
``peft`` model goes to the engine as a LoRA adapter instead).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["EngineSyncClient", "ipc_weight_sender"]


class EngineSyncClient:
    """vLLM's trainer-side weight-sync client protocol over an in-process ``vllm.LLM``.

    The trainer engine calls these four methods; they forward to the ``LLM`` methods of
    the same names, which take the info wrapped in a request mapping.
    """

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        """Set up the engine side of the transfer (once)."""
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        """Open one weight update."""
        self.llm.start_weight_update()

    def update_weights(self, update_info: Any) -> None:
        """Ship one batch of weights (IPC handles)."""
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        """Close the update; the engine samples from the new weights from now on."""
        self.llm.finish_weight_update(weight_version)


def ipc_weight_sender(llm: Any, model: Any) -> Callable[[], None]:
    """A function that pushes ``model``'s parameters into ``llm`` by CUDA IPC (vLLM 0.32).

    The engine must have been built with ``weight_transfer_config=
    WeightTransferConfig(backend="ipc")``; parameters are sent under their
    ``named_parameters()`` names (the Hugging Face checkpoint names vLLM's
    ``load_weights`` reads).
    """
    from vllm.distributed.weight_transfer.base import ModuleSource
    from vllm.distributed.weight_transfer.ipc_engine import (
        IPCTrainerInitInfo,
        IPCTrainerWeightTransferEngine,
    )

    trainer = IPCTrainerWeightTransferEngine.trainer_init(
        IPCTrainerInitInfo(rank=0), client=EngineSyncClient(llm), source=ModuleSource(model)
    )
    return trainer.send_weights
