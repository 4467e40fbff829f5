"""Plain-torch references for the fused kernels: what tests and benchmarks compare against.

Shape legend: T tokens, D hidden size, V vocabulary size.

Memory: these materialise the full logits. `linear_logprob_ref` holds logits_TV and
logprobs_TV (fp32, 2 x T*V*4 bytes) for autograd, plus a T x V gradient in backward. At
T=4096, V=49,152 that is ~0.8 GB per T x V tensor. Use them only as ground truth.
"""

from __future__ import annotations

import torch

__all__ = ["linear_logprob_ref", "logprob_entropy_from_logits_ref"]


def logprob_entropy_from_logits_ref(
    logits_TV: torch.Tensor, target_T: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(logits / temperature)[target] and the entropy of that distribution (fp32)."""
    logits_TV = logits_TV.to(torch.promote_types(logits_TV.dtype, torch.float32))
    if temperature != 1.0:
        logits_TV = logits_TV / temperature
    logprobs_TV = torch.log_softmax(logits_TV, dim=-1)
    logprob_T = logprobs_TV.gather(-1, target_T.long().unsqueeze(-1)).squeeze(-1)
    entropy_T = -(logprobs_TV.exp() * logprobs_TV).sum(-1)
    return logprob_T, entropy_T


def linear_logprob_ref(
    hidden_TD: torch.Tensor,
    weight_VD: torch.Tensor,
    target_T: torch.Tensor,
    *,
    temperature: float = 1.0,
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Full logits = hidden @ weight.T, then log_softmax(logits / temperature) at target.

    Returns fp32 logprob_T (and fp32 entropy_T when `return_entropy`); both differentiable
    through torch autograd.
    """
    logits_TV = hidden_TD @ weight_VD.T  # T x V in the input dtype
    logits_TV = logits_TV.to(torch.promote_types(logits_TV.dtype, torch.float32))
    if temperature != 1.0:
        logits_TV = logits_TV / temperature
    logprobs_TV = torch.log_softmax(logits_TV, dim=-1)
    logprob_T = logprobs_TV.gather(-1, target_T.long().unsqueeze(-1)).squeeze(-1)
    if not return_entropy:
        return logprob_T
    entropy_T = -(logprobs_TV.exp() * logprobs_TV).sum(-1)
    return logprob_T, entropy_T
