"""Stubs for the compiled CUDA module (csrc/cuda_module.cpp). Addresses are device
pointers as ints; ``stream`` is a cudaStream_t as an int; ``device`` a CUDA index."""

def token_logprobs_forward(
    logits: int,
    dtype: int,
    n_rows: int,
    vocab: int,
    row_stride: int,
    targets: int,
    ignore_index: int,
    temperature: float,
    logp: int,
    lse: int,
    entropy: int,
    device: int,
    stream: int,
) -> None: ...
def token_logprobs_backward(
    logits: int,
    dtype: int,
    n_rows: int,
    vocab: int,
    row_stride: int,
    targets: int,
    ignore_index: int,
    temperature: float,
    lse: int,
    g_logp: int,
    g_entropy: int,
    entropy: int,
    grad: int,
    grad_row_stride: int,
    device: int,
    stream: int,
) -> None: ...
def group_advantages(
    rewards: int,
    dtype: int,
    m: int,
    perm: int,
    offsets: int,
    num_groups: int,
    group_size: int,
    baseline: int,
    scale: int,
    eps: float,
    out: int,
    bad_index: int,
    device: int,
    stream: int,
) -> None: ...
def device_count() -> tuple[int, str]: ...
