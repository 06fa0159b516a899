"""Stubs for the compiled CPU module (csrc/cpu_module.cpp). Addresses are ints from
``Tensor.data_ptr()``; 0 marks an optional buffer as absent."""

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
    num_threads: int,
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
    num_threads: int,
) -> None: ...
def group_advantages(
    rewards: int,
    dtype: int,
    m: int,
    group_index: int,
    num_groups: int,
    group_size: int,
    baseline: int,
    scale: int,
    eps: float,
    out: int,
) -> int:
    """Return the first index of a non-finite reward, or -1."""

def linear_rows(
    x: int,
    rows: int,
    k: int,
    x_stride: int,
    weight: int,
    n: int,
    w_stride: int,
    bias: int,
    y: int,
    num_threads: int,
) -> None:
    """y [rows, n] = x [rows, k] @ weight[n, k].T (+ bias [n]), float32."""

def isa() -> str:
    """'avx2' or 'base': the instruction set the row kernels run with now."""
