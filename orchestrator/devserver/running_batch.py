"""A batch that requests join and leave between decode steps (continuous batching), for the
reference server.

vLLM and SGLang admit a request at their next step, not when the batch running ends, and its
prompt rides in that step's forward pass with the other rows' next tokens. A server that makes
newcomers wait for the whole batch, or gives each newcomer a forward pass of its own, charges
clients that arrive staggered (the spool's workers, each refilling a slot as its job ends) more
than a burst of the same requests, so comparisons through it measure its scheduling.

The running rows sit side by side in a left-padded batch, as transformers' `generate` keeps
them: each step feeds every row's sampled token at its own position, with a mask that lets it see
its row's columns only (not the padding), so a step scores each row against its own length, not
the batch's total. A newcomer's prompt goes through the model in that step in a causal pass of its
own (short prompts share one, packed behind a mask, up to PACK_TOKENS), and its columns join the
batch, padded on the left to the longest row. A finished row leaves the batch, and columns that
are padding for every row left are cut.
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
        self.cache: Any = None                 # DynamicCache: [rows, kv heads, width, head dim] per layer
        self.valid: Any = None                 # [rows, width] bool: the row's own columns (False: padding)
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
        tags), then the forward passes: the others' tokens and the newcomers' prompts."""
        finished, self.finished_at_once = self.finished_at_once, []
        tokens: list[int] = []
        if self.rows:
            raw = self.torch.log_softmax(self.logits, dim=-1)
            staying: list[int] = []
            for index, row in enumerate(self.rows):
                token = self._sample(row, index, raw)
                if token is None:
                    finished.append((row.tag, row.result))
                else:
                    staying.append(index)
                    tokens.append(token)
            if len(staying) < len(self.rows):
                self._keep(staying)
        newcomers, self.joining = self.joining, []
        logits = [self._decode(tokens)] if self.rows else []
        for pack in packs([(row, list(row.request.prompt_ids)) for row in newcomers]):
            logits.append(self._prefill(pack))
        self.logits = self.torch.cat(logits) if logits else None
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

    def _decode(self, tokens: list[int]) -> Any:
        """The running rows' sampled tokens through the model, each at its row's next position."""
        torch = self.torch
        positions = [[row.next_position] for row in self.rows]
        for row in self.rows:
            row.next_position += 1
        self.valid = torch.cat([self.valid, torch.ones((len(self.rows), 1), dtype=torch.bool)], dim=1)
        out = self.model(input_ids=torch.tensor([[token] for token in tokens], device=self.device),
                         attention_mask=self.valid[:, None, None, :].to(self.device),
                         position_ids=torch.tensor(positions, device=self.device),
                         use_cache=True, **{self.cache_name: self.cache})
        self.cache = getattr(out, self.cache_name)
        return out.logits[:, -1].float().cpu()

    def _prefill(self, pack: list[tuple[_Row[Tag], list[int]]]) -> Any:
        """Newcomers' prompts in one causal pass (packed behind a mask when several); their
        columns join the batch. The logits of each prompt's last token, in pack order."""
        torch = self.torch
        ids: list[int] = []
        positions: list[int] = []
        owners: list[int] = []
        spans: list[tuple[int, int]] = []
        for row, tokens in pack:
            spans.append((len(ids), len(ids) + len(tokens)))
            ids += tokens
            positions += range(len(tokens))
            owners += [row.key] * len(tokens)
            row.next_position = len(tokens)
        mask = {}
        if len(pack) > 1:   # a token sees its own prompt's earlier tokens only
            owner = torch.tensor(owners, dtype=torch.long)
            seen = (owner[None, :] == owner[:, None]) & torch.ones((len(ids), len(ids)), dtype=torch.bool).tril()
            mask = {"attention_mask": seen[None, None].to(self.device)}
        out = self.model(input_ids=torch.tensor([ids], device=self.device),
                         position_ids=torch.tensor([positions], device=self.device), use_cache=True,
                         logits_to_keep=torch.tensor([end - 1 for _, end in spans], device=self.device), **mask)
        layers = getattr(out, self.cache_name).layers
        self._join([row for row, _ in pack], [[(layer.keys[:, :, a:b], layer.values[:, :, a:b]) for layer in layers]
                                              for a, b in spans])
        return out.logits[0].float().cpu()

    def _join(self, rows: list[_Row[Tag]], columns: list[list[tuple[Any, Any]]]) -> None:
        """Rows (each its [1, kv heads, length, head dim] keys and values per layer) appended to the
        batch, everyone left-padded to the longest."""
        from transformers import DynamicCache

        torch = self.torch
        lengths = [layers[0][0].shape[2] for layers in columns]
        width = max([*lengths, 0 if self.valid is None else self.valid.shape[1]])

        def padded(tensor: Any) -> Any:
            missing = width - tensor.shape[2]
            if not missing:
                return tensor
            pad = torch.zeros((*tensor.shape[:2], missing, tensor.shape[3]), dtype=tensor.dtype, device=tensor.device)
            return torch.cat([pad, tensor], dim=2)

        old = [] if self.cache is None else [(layer.keys, layer.values) for layer in self.cache.layers]
        merged = []
        for index in range(len(columns[0])):
            parts = ([old[index]] if old else []) + [layers[index] for layers in columns]
            merged.append((torch.cat([padded(k) for k, _ in parts]), torch.cat([padded(v) for _, v in parts])))
        self.cache = DynamicCache(ddp_cache_data=merged)
        valid = [] if self.valid is None else [torch.cat([torch.zeros((len(self.rows), width - self.valid.shape[1]),
                                                                       dtype=torch.bool), self.valid], dim=1)]
        valid += [torch.arange(width)[None] >= width - length for length in lengths]
        self.valid = torch.cat(valid)
        self.rows += rows

    def _keep(self, staying: list[int]) -> None:
        """Only these rows (indices) stay; columns that are padding for all of them are cut."""
        from transformers import DynamicCache

        torch = self.torch
        self.rows = [self.rows[index] for index in staying]
        if not staying:
            self.cache = self.valid = None
            return
        chosen = torch.tensor(staying, dtype=torch.long)
        valid = self.valid[chosen]
        first = int(valid.any(dim=0).nonzero()[0])
        self.valid = valid[:, first:]
        on_device = chosen.to(self.device)
        self.cache = DynamicCache(ddp_cache_data=[
            (layer.keys[on_device, :, first:], layer.values[on_device, :, first:]) for layer in self.cache.layers])

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

