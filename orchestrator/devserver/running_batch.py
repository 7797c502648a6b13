"""A batch that requests join and leave between decode steps (continuous batching), for the
reference server.

vLLM and SGLang admit a request at their next step, not when the batch running ends, and its
prompt rides in that step's forward pass with the other rows' next tokens. A server that makes
newcomers wait for the whole batch, or gives each newcomer a forward pass of its own, charges
clients that arrive staggered (the spool's workers, each refilling a slot as its job ends) more
than a burst of the same requests, so comparisons through it measure its scheduling.

Rows are packed into one sequence, as variable-length attention does: each step feeds every
running row's sampled token side by side, with a mask that lets a token see only its own row's
cache columns, at its row's own positions; a newcomer's prompt goes through the model in a causal
pass of its own in the same step, and its columns join the cache. No row is padded. The KV cache
is one sequence of columns, each owned by a row; a finished row's columns are dropped. Only each
row's last token goes through the LM head.
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from orchestrator.devserver.sampling import GenRequest, GenResult, sample
from orchestrator.errors import HpcRolloutError

Tag = TypeVar("Tag")


class UnpackableModelError(HpcRolloutError, ValueError):
    """The model has attention the packing mask would get wrong (a sliding window, say)."""


def check_packable(config: Any) -> None:
    """Refuse a model whose layers do not all attend to the whole sequence: the packed batch's
    mask replaces the model's own, so a sliding window would silently see too much."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    kinds = set(getattr(text, "layer_types", None) or ())
    windowed = bool(getattr(text, "use_sliding_window", False) and getattr(text, "sliding_window", None))
    if kinds - {"full_attention"} or windowed:
        raise UnpackableModelError(
            f"serve-llm batches full-attention models only; this one has {sorted(kinds) or 'a sliding window'} "
            "layers. Serve it with stock vLLM or SGLang (docs/llm.md).")


@dataclass
class _Row(Generic[Tag]):
    request: GenRequest
    abort: threading.Event
    tag: Tag
    rng: Any
    stops: frozenset[int]
    key: int               # owner id of its cache columns
    next_position: int     # position id of the next token fed to the model
    result: GenResult


class RunningBatch(Generic[Tag]):
    """Rows being sampled; `admit` and `step` run in the model's thread, in inference mode.

    The model must run scaled-dot-product attention (the Engine loads it so): the packing mask
    is a prepared 4D boolean mask, which transformers hands to that kernel as it is.
    """

    def __init__(self, model: Any, *, eos_ids: set[int], rng_for: Callable[[GenRequest], Any]) -> None:
        import torch

        self.torch = torch
        self.model = model
        self.device = next(model.parameters()).device
        self.eos_ids = frozenset(eos_ids)
        self.rng_for = rng_for
        # transformers 5 calls the KV cache `cache` (`past_key_values` is deprecated there), 4.x `past_key_values`
        self.cache_name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.rows: list[_Row[Tag]] = []        # rows with logits to sample from, in `logits` order
        self.joining: list[_Row[Tag]] = []     # admitted, prompt not yet through the model
        self.finished_at_once: list[tuple[Tag, GenResult]] = []   # asked for no token at all
        self.cache: Any = None                 # DynamicCache: [1, kv heads, columns, head dim] per layer
        self.owners: Any = None                # [columns]: the key of the row each cache column belongs to
        self.logits: Any = None                # [rows, vocab] on the CPU
        self._keys = 0

    def __len__(self) -> int:
        return len(self.rows) + len(self.joining) + len(self.finished_at_once)

    def admit(self, entries: list[tuple[GenRequest, threading.Event, Tag]]) -> None:
        """Add these requests; their prompts go through the model with the next step's tokens."""
        for request, abort, tag in entries:
            if request.max_tokens <= 0 or not request.prompt_ids:
                self.finished_at_once.append((tag, GenResult()))
                continue
            if abort.is_set():   # aborted while it queued: no prompt pass for it
                self.finished_at_once.append((tag, GenResult(finish_reason="abort")))
                continue
            stops = frozenset(request.stop_token_ids) | (frozenset() if request.ignore_eos else self.eos_ids)
            self._keys += 1
            self.joining.append(_Row(request, abort, tag, self.rng_for(request), stops, self._keys, 0, GenResult()))

    def step(self) -> list[tuple[Tag, GenResult]]:
        """Sample one token for every row that has logits (rows done leave, returned with their
        tags), then one forward pass: the others' tokens and the newcomers' prompts."""
        finished, self.finished_at_once = self.finished_at_once, []
        fed: list[tuple[_Row[Tag], list[int]]] = []
        if self.rows:
            raw = self.torch.log_softmax(self.logits, dim=-1)
            for index, row in enumerate(self.rows):
                token = self._sample(row, index, raw)
                if token is None:
                    finished.append((row.tag, row.result))
                else:
                    fed.append((row, [token]))
            if len(fed) < len(self.rows):
                self._drop({row.key for row, _ in fed})
        fed += [(row, list(row.request.prompt_ids)) for row in self.joining]
        self.rows, self.joining = [row for row, _ in fed], []
        if fed:
            self._forward(fed)
        return finished

    def _sample(self, row: _Row[Tag], index: int, raw: Any) -> int | None:
        """The row's next token, or None when it is done."""
        result = row.result
        if row.abort.is_set():
            result.finish_reason = "abort"
            return None
        token, processed = sample(self.torch, self.logits[index], row.request, row.rng)
        result.output_ids.append(token)
        result.raw_logprobs.append(float(raw[index, token]))
        result.processed_logprobs.append(processed)
        if token in row.stops:
            result.finish_reason, result.matched_stop = "stop", token
            return None
        if len(result.output_ids) >= row.request.max_tokens:
            return None
        return token

    def _forward(self, fed: list[tuple[_Row[Tag], list[int]]]) -> None:
        """The rows' next tokens through the model: the running rows' one token each in one packed
        pass over the cache, the newcomers' prompts in causal passes of their own (short prompts
        packed together up to PACK_TOKENS: eight prompts of P tokens in one pass would score
        (8P)^2 pairs instead of 8 P^2), their columns then appended to the cache. `fed` lists the
        running rows first, as the logits come out."""
        running = [(row, tokens) for row, tokens in fed if row.next_position > 0]
        logits = [self._decode(running)] if running else []
        for pack in packs(fed[len(running):]):
            logits.append(self._prefill(pack))
        self.logits = self.torch.cat(logits)

    def _decode(self, fed: list[tuple[_Row[Tag], list[int]]]) -> Any:
        torch = self.torch
        ids = [tokens[0] for _, tokens in fed]
        positions = [row.next_position for row, _ in fed]
        new_owners = torch.tensor([row.key for row, _ in fed], dtype=torch.long)
        for row, _ in fed:
            row.next_position += 1
        columns = torch.cat([self.owners, new_owners])
        seen = columns[None, :] == new_owners[:, None]           # a token sees only its own row's columns
        out = self.model(input_ids=torch.tensor([ids], device=self.device),
                         attention_mask=seen[None, None].to(self.device),
                         position_ids=torch.tensor([positions], device=self.device),
                         use_cache=True, **{self.cache_name: self.cache})
        self.cache, self.owners = getattr(out, self.cache_name), columns
        return out.logits[0].float().cpu()

    def _prefill(self, pack: list[tuple[_Row[Tag], list[int]]]) -> Any:
        from transformers import DynamicCache

        torch = self.torch
        ids: list[int] = []
        positions: list[int] = []
        owners: list[int] = []
        last: list[int] = []
        for row, tokens in pack:
            ids += tokens
            positions += range(len(tokens))
            owners += [row.key] * len(tokens)
            row.next_position = len(tokens)
            last.append(len(ids) - 1)
        new_owners = torch.tensor(owners, dtype=torch.long)
        mask = {}
        if len(pack) > 1:   # a token sees its own row's earlier tokens only
            seen = (new_owners[None, :] == new_owners[:, None]) & torch.ones((len(ids), len(ids)), dtype=torch.bool).tril()
            mask = {"attention_mask": seen[None, None].to(self.device)}
        out = self.model(input_ids=torch.tensor([ids], device=self.device),
                         position_ids=torch.tensor([positions], device=self.device),
                         use_cache=True, logits_to_keep=torch.tensor(last, device=self.device), **mask)
        mine = getattr(out, self.cache_name)
        if self.cache is None:
            self.cache, self.owners = mine, new_owners
        else:
            self.cache = DynamicCache(ddp_cache_data=[
                (torch.cat([old.keys, new.keys], dim=2), torch.cat([old.values, new.values], dim=2))
                for old, new in zip(self.cache.layers, mine.layers)])
            self.owners = torch.cat([self.owners, new_owners])
        return out.logits[0].float().cpu()

    def _drop(self, staying: set[int]) -> None:
        """Drop the cache columns of every row not in `staying` (keys)."""
        from transformers import DynamicCache

        torch = self.torch
        keep = torch.isin(self.owners, torch.tensor(sorted(staying), dtype=torch.long))
        if not bool(keep.any()):
            self.cache = self.owners = None
            return
        on_device = keep.to(self.device)
        self.cache = DynamicCache(ddp_cache_data=[
            (layer.keys[:, :, on_device], layer.values[:, :, on_device]) for layer in self.cache.layers])
        self.owners = self.owners[keep]


PACK_TOKENS = 1024  # newcomers' prompts share a prefill pass up to this many tokens: a pass's fixed cost
                    # dominates short prompts, the (sum of tokens)^2 mask long ones


def packs(newcomers: list[tuple[_Row[Tag], list[int]]]) -> list[list[tuple[_Row[Tag], list[int]]]]:
    """The newcomers in prefill passes: in order, each pass up to PACK_TOKENS tokens or one prompt."""
    grouped: list[list[tuple[_Row[Tag], list[int]]]] = []
    size = 0
    for entry in newcomers:
        if grouped and size + len(entry[1]) <= PACK_TOKENS:
            grouped[-1].append(entry)
            size += len(entry[1])
        else:
            grouped.append([entry])
            size = len(entry[1])
    return grouped

