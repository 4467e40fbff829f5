"""The one definition of the log-probs a rollout engine reports and the trainer recomputes.

Legend: T tokens, V vocabulary.

Convention (shared by the CPU engine, and to be used by the trainer's log-prob kernels):

    logprob(token) = log_softmax(logits / temperature)[token]      if temperature > 0
    logprob(token) = log_softmax(logits)[token]                    if temperature == 0

i.e. the distribution the token was *sampled from before top-k/top-p/min-p truncation*,
temperature-scaled; greedy decoding (temperature 0) reports the raw-logit distribution.
Top-k/top-p/min-p only restrict which token is drawn; they never change the reported
log-prob. This is SGLang's default (its sampler takes log-probs of the temperature-scaled
softmax, and ``log_softmax(logits)`` when greedy); the environment variable
``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` would switch SGLang to raw logits, so the launcher in
``sglang.py`` forces it off.

Shapes: ``logits_TV`` -> ``logprobs_TV`` (any leading dims work; the last is the vocab).
Computed in float32 whatever the input dtype.
"""

from __future__ import annotations

import torch

__all__ = ["sampling_logprobs", "token_logprobs"]


def sampling_logprobs(logits: torch.Tensor, temperature: float | torch.Tensor) -> torch.Tensor:
    """Log-probs over the vocab (last dim) under the convention above, in float32.

    ``temperature`` is a float, or a tensor broadcastable to ``logits[..., :1]`` (one per row).
    """
    logits = logits.float()
    if isinstance(temperature, torch.Tensor):
        t = temperature.float().to(logits.device)
        if bool((t == 1).all()):  # x / 1 is x: skip a pass over the vocab
            return torch.log_softmax(logits, dim=-1)
        t = torch.where(t > 0, t, torch.ones_like(t))
        return torch.log_softmax(logits / t, dim=-1)
    if temperature > 0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)


def token_logprobs(
    logits_TV: torch.Tensor, tokens_T: torch.Tensor, temperature: float | torch.Tensor
) -> torch.Tensor:
    """Log-prob of each chosen token: ``sampling_logprobs(logits_TV, t)[t, tokens_T[t]]``."""
    logprobs_TV = sampling_logprobs(logits_TV, temperature)
    return logprobs_TV.gather(-1, tokens_T.long().unsqueeze(-1)).squeeze(-1)
