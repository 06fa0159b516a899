"""CoMLRL 1.4.3's module path ``comlrl.utils.checkpoint``: resumable checkpoints of the
``comlrl.trainers`` trainers, written in ``comlrl.algos``' step-checkpoint format.

A 1.4.3 script checkpoints and resumes with the same calls here::

    trainer.train(checkpoint_dir="ckpt")                      # ckpt/checkpoint-1, -2, ...
    trainer.train(resume_from_checkpoint="ckpt/checkpoint-2", checkpoint_dir="ckpt")
    trainer.save_checkpoint("snapshot"); trainer.load_checkpoint("snapshot")
    read_checkpoint_metadata("ckpt/checkpoint-2")            # before building a trainer

A checkpoint is committed once per completed pass over ``train_dataset`` (an *epoch*, as
in 1.4.3): after the first optimizer step at or past the pass's end, and always after the
last step (the preference trainers commit at their own boundaries: MADPO's pairs and
epochs, MARLHF's reward fit and RL epochs, the iterative trainers' rounds;
:mod:`comlrl.trainers.preference._checkpoints`). ``checkpoint_interval=k`` writes every
``k``-th commit (and the last);
``checkpoint_total_limit=n`` keeps the newest ``n`` folders this run wrote. The folder
``checkpoint_dir/checkpoint-<sequence>`` (``sequence``: the commit count) is the
format of :mod:`comlrl.algos.training.checkpoint`: ``agent_<i>/`` (Hugging Face weights),
``training_state.pt`` (optimizer moments, the data stream's cursor, every random stream,
the step; ``torch.load(weights_only=True)`` reads it) and ``checkpoint.json``, built under a
temporary name and renamed into place, so a folder that exists is complete. The trainer's
own part (:data:`SECTION`, under the format's recipe-state key) holds the trainer class,
the config, the epoch cursor (``progress``), the commit ``sequence``, the run id, the W&B
run identity, ``env_step``, NumPy's global random state and the ``state_dict()`` of
stateful callbacks (``reward_func``, ``formatters``, ...).

Resuming puts back weights, optimizer moments, data cursor, random streams (Python,
NumPy, torch, each agent's sampling generator) and counters, so the resumed run takes the
steps the uninterrupted run would have taken. 1.4.3's on-disk encoding (its ``_encode``
records, ``checkpoint_owner.json``, preference asset pools) is not written or read
(docs/compat.md lists the 1.4.3 tests that pin it).
"""

from __future__ import annotations

import importlib  # noqa: F401  (1.4.3's tests patch checkpoint.importlib.import_module)

from comlrl.utils._checkpoint_files import (
    CHECKPOINT_VERSION,
    SECTION,
    STATE_FILENAME,
    check_checkpoint_options,
    read_checkpoint_metadata,
)
from comlrl.utils._checkpoint_mixin import TrainingCheckpointMixin
from comlrl.utils._trainer_snapshot import (
    capture_trainer_state,
    decode,
    encode,
    global_rng,
    restore_trainer_state,
    set_global_rng,
)

__all__ = [
    "CHECKPOINT_VERSION",
    "SECTION",
    "STATE_FILENAME",
    "TrainingCheckpointMixin",
    "capture_trainer_state",
    "check_checkpoint_options",
    "read_checkpoint_metadata",
    "restore_trainer_state",
]

#: 1.4.3's private names of the snapshot encoding, which its tests call
_encode, _decode = encode, decode
#: 1.4.3's names of the global random-state helpers (Python, NumPy, torch, CUDA)
capture_rng_state, restore_rng_state = global_rng, set_global_rng
