"""A plain GRPO step in torch on a batch from GroupBatcher (the closed loop's trainer side).

    logprobs = response_logprobs(model, tensors)
    loss, metrics = policy_loss(logprobs, tensors)      # PPO-clipped, token mean over response_mask
    loss.backward(); optimizer.step()

One update per batch keeps it on-policy: the ratio to the sampling logprobs starts at 1 (up to
the server's numerics), and the clip only matters when batches are reused or stale.
"""

from __future__ import annotations

from typing import Any


def response_logprobs(model: Any, tensors: dict[str, Any]) -> Any:
    """Log-probabilities [N, R] the model gives each response token, teacher-forced."""
    import torch

    prompt_width = tensors["prompts"].shape[1]
    out = model(input_ids=tensors["input_ids"], attention_mask=tensors["attention_mask"],
                position_ids=tensors["position_ids"], use_cache=False)
    logits = out.logits[:, prompt_width - 1:-1, :].float()   # position t predicts token t + 1
    logprobs = torch.log_softmax(logits, dim=-1)
    return logprobs.gather(-1, tensors["responses"].unsqueeze(-1)).squeeze(-1)


def policy_loss(logprobs: Any, tensors: dict[str, Any], clip: float = 0.2) -> tuple[Any, dict[str, float]]:
    """PPO-clipped policy gradient with group-relative advantages, averaged over sampled tokens."""
    import torch

    mask = tensors["response_mask"].to(logprobs.dtype)
    advantages = tensors["advantages"].to(logprobs.dtype)
    log_ratio = (logprobs - tensors["old_logprobs"].to(logprobs.dtype)) * mask
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * advantages
    tokens = mask.sum().clamp(min=1.0)
    loss = -(torch.minimum(unclipped, clipped) * mask).sum() / tokens
    with torch.no_grad():
        metrics = {
            "loss": float(loss),
            "clip_share": float(((unclipped != clipped).to(mask.dtype) * mask).sum() / tokens),
            "log_ratio_abs": float(log_ratio.abs().sum() / tokens),
            "tokens": float(tokens),
        }
    return loss, metrics
