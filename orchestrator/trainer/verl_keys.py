"""verl's names for the batch a rollout engine hands back (verl 0.9.1), in one place.

Used by GroupBatcher (our padded batches carry verl's names beside ours) and by the DataProto
assembly of the verl loop manager. No verl import: these are plain strings. Here, beside
batch.py, not in trainer/verl/: a trainer without verl uses them, and verl/ is a leaf that
nothing outside it imports (tests/core/test_layers.py).

`old_log_probs` is deliberately absent from what we produce: verl recomputes it with the
trainer's weights and merges it with `DataProto.union`, which asserts that a key on both sides
holds equal values. What the sampler returned is `rollout_log_probs`.
"""

from __future__ import annotations

# tensors, [N, prompt_length] / [N, response_length] / [N, prompt_length + response_length]
PROMPTS = "prompts"                    # left-padded to rollout.prompt_length
RESPONSES = "responses"                # right-padded to rollout.response_length
RESPONSE_MASK = "response_mask"        # 1 = sampled by the model; 0 = tool/observation token or pad
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
ROLLOUT_LOG_PROBS = "rollout_log_probs"   # the sampler's logprobs, aligned with responses
RM_SCORES = "rm_scores"                # the reward on the last response token (verl's reward path skips scoring)
TOKEN_LEVEL_SCORES = "token_level_scores"
# verl's own, never produced here (see the module doc)
OLD_LOG_PROBS = "old_log_probs"

# non-tensors, one entry per sample
UID = "uid"                            # the group key of GRPO (compute_advantage's `index`)
NUM_TURNS = "__num_turns__"

# meta_info
TIMING = "timing"                      # merged into the trainer's timing_raw
REWARD_EXTRA_KEYS = "reward_extra_keys"
