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
    """'avx512', 'avx2' or 'base': the instruction set the row kernels run with now
    (COMLRL_KERNELS_CPU_ISA forces one; ValueError for an unknown name, RuntimeError for
    one this build or CPU cannot run)."""

def isas() -> list[str]:
    """The instruction sets this build and CPU run (cpuid + xgetbv), baseline first."""

class DecodeSession:
    """One Llama-family decode step over borrowed float32 weights and KV cache."""

    num_layers: int
    def __init__(
        self,
        hidden: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        vocab: int,
        scaling: float,
        embed: int,
        embed_stride: int,
        final_norm: int,
        final_eps: float,
        head: tuple[int, int, int, int, int],
    ) -> None: ...
    def add_layer(
        self,
        norm1: int,
        eps1: float,
        norm2: int,
        eps2: float,
        linears: list[tuple[int, int, int, int, int]],
    ) -> None:
        """linears: (weight, row stride, bias or 0, n, k) for q, k, v, o, gate, up, down."""
    def start(
        self,
        prompts: int,
        group: int,
        prefix: int,
        steps: int,
        prefix_bias: int,
        cos: int,
        sin: int,
        rope_steps: int,
        caches: list[list[int]],
    ) -> None: ...
    def step(
        self, tokens: int, rows: int, slot: int, logits: int, logits_stride: int, num_threads: int
    ) -> None: ...

def sample_rows(
    logits: int,
    rows: int,
    vocab: int,
    row_stride: int,
    uniforms: int,
    temperature: float,
    top_k: int,
    top_p: float,
    eos: int,
    n_eos: int,
    pad: int,
    done: int,
    tokens: int,
    logp: int,
) -> bool: ...
