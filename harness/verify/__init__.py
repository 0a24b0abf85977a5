"""The verification core, used by the embedded server (`harness.engine`) and the microbenchmark
(`harness.micro`); its API is docs/verify_api.md. One module per job:

- `checks`: the checks at the public functions' entry (a ValueError naming the bad argument; values on a CPU);
- `rows`: the per-row rules every builder applies (greedy rows, top_k, the top-p rule);
- `topk`: torch.topk and the radix top-k (FlashInfer's on CUDA);
- `builders`: the verify-probability builders (`full_vocab`, `topk_first`, `topk_first_torch`, `topk_fused`);
- `topk_fused`: the Triton kernels behind `topk_fused` (imported only when that builder runs on CUDA);
- `verifiers`: token-wise and block verification, and their sampling helpers;
- `sparse` (imported from its module): the sparse verify path, each row's top-k entries, no dense tensor;
  `sparse_kernel`: its verifiers as one Triton kernel (imported only when the fused step runs on CUDA).

The names below are the public API, re-exported here.
"""

from harness.verify.builders import (
    BUILDERS,
    BuilderFn,
    full_vocab_probs,
    fused_build,
    get_builder,
    topk_first_probs,
    topk_first_torch_probs,
    topk_fused_probs,
)
from harness.verify.rows import GREEDY_TEMPERATURE, top_p_renorm_sorted
from harness.verify.topk import radix_topk, radix_topk_backend, torch_topk
from harness.verify.verifiers import (
    VerifyOutput,
    block_weights,
    draw_uniforms,
    sample_from_probs,
    verify_block,
    verify_tokenwise,
)

__all__ = [
    "BUILDERS",
    "GREEDY_TEMPERATURE",
    "BuilderFn",
    "VerifyOutput",
    "block_weights",
    "draw_uniforms",
    "full_vocab_probs",
    "fused_build",
    "get_builder",
    "radix_topk",
    "radix_topk_backend",
    "sample_from_probs",
    "top_p_renorm_sorted",
    "topk_first_probs",
    "topk_first_torch_probs",
    "topk_fused_probs",
    "torch_topk",
    "verify_block",
    "verify_tokenwise",
]
