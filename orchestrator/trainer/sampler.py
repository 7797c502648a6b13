"""Asynchronous dynamic sampling (DAPO, as ProRL §3.4 runs it), for any trainer.

    sampler = DynamicSampler(spool, prompts, samples=8, informative_groups=32, max_policy_lag=1)
    for step in range(steps):
        batch = sampler.next_batch(policy_version=step)   # 32 groups whose rewards differ
        loss = grpo_update(model, batch.tensors())

The sampler keeps `in_flight` groups submitted at all times. Every group that completes is
judged at once and replaced at once by a new prompt (no waiting for a whole batch):
  * stale (a sample older than policy_version - max_policy_lag, or cancelled as stale by a
    worker): left out, counted, and its prompt submitted again as a fresh group, as a partial
    rollout (`retry_stale_as`, default "continue"): a slow prompt restarted at every try would
    never be trained on, so hard prompts would leave the batches (benchmarks/staleness.py). A
    `continue` sample (staleness="continue") is judged per turn: the tokens of its turns
    older than the bound leave the loss mask (counted in `stale_turn_tokens`), the rest is
    trained on; it is stale only when no turn is recent enough;
  * failed, when the batcher's policy is drop_group and a sample failed: left out, counted;
  * zero variance (every sample has the same reward: no GRPO signal): left out, counted;
  * otherwise informative: kept.
`next_batch` returns as soon as K informative groups are in (with drop_zero_variance=False:
K complete groups, zero-variance ones included and counted: plain GRPO batches). Leftovers, i.e. groups still
running and complete groups not taken yet, are carried to the next call (`leftovers="carry"`)
or cancelled (`"cancel"`). `batch.stats.filtered_share` is the zero-variance share of the
groups judged.

With `adaptive=AdaptiveBudget(samples=G)` (orchestrator/trainer/adaptive.py), a fresh prompt's
turn may be skipped when the groups judged so far say it has no signal (always or never solved);
skipped prompts are counted (`skipped_prompts`), retries of stale groups are never skipped.

State for a restart: `sampler.state()` (the reader's cursor and the groups in flight, with their
prompts) and `DynamicSampler(..., state=saved)`; persist it with the model.
"""

from __future__ import annotations

import enum
import itertools
import math
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.config import Staleness
from orchestrator.spool.job_ids import group_id
from orchestrator.spool.staleness import row_is_stale, staleness_floor
from orchestrator.trainer.adaptive import AdaptiveBudget, BudgetSettingError
from orchestrator.trainer.turn_tokens import mask_stale_turns
from orchestrator.trainer.tail import TRAINER_COLUMNS
from orchestrator.trainer.batch import Batch, FailedPolicy, GroupBatcher, is_failed, parse_choice

if TYPE_CHECKING:
    from orchestrator.trainer.api import Spool

Row = dict[str, Any]


class Leftovers(str, enum.Enum):
    CARRY = "carry"     # running groups go on; complete ones wait for the next batch
    CANCEL = "cancel"   # running groups are cancelled; complete ones are dropped (counted)


@dataclass
class SamplerStats:
    informative: int = 0
    zero_variance: int = 0
    stale_groups: int = 0
    stale_rows: int = 0
    stale_turn_tokens: int = 0       # sampled tokens of continue rows masked for being too old
    failed_groups: int = 0           # left out by the batcher's drop_group policy
    foreign_groups: int = 0          # complete groups this sampler did not submit (skipped)
    leftovers_cancelled: int = 0
    submitted_groups: int = 0
    skipped_prompts: int = 0         # turns of prompts the adaptive budget passed over
    in_flight: int = 0               # groups submitted and not judged, when the batch returned
    mean_reward: float = float("nan")   # over every sample of every group judged (the policy's reward)
    seconds: float = 0.0
    _reward_sum: float = 0.0
    _reward_count: int = 0

    @property
    def judged(self) -> int:
        return self.informative + self.zero_variance

    @property
    def filtered_share(self) -> float:
        """Share of judged groups dropped for zero reward variance."""
        return self.zero_variance / self.judged if self.judged else 0.0

    def add_rewards(self, rewards: Sequence[float]) -> None:
        self._reward_sum += sum(rewards)
        self._reward_count += len(rewards)
        self.mean_reward = self._reward_sum / self._reward_count

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        data["filtered_share"] = round(self.filtered_share, 4)
        return data


@dataclass
class SampledBatch:
    groups: list[list[Row]]
    batch: Batch
    stats: SamplerStats
    policy_version: int
    prompts: list[dict[str, Any]] = field(default_factory=list)   # the prompt of each group, in order

    def tensors(self, device: Any = None) -> dict[str, Any]:
        return self.batch.tensors(device)


class DynamicSampler:
    def __init__(
        self,
        spool: "Spool",
        prompts: Iterable[dict[str, Any]],
        *,
        samples: int,
        informative_groups: int,
        handler: str | None = None,
        sampling: dict[str, Any] | None = None,
        max_policy_lag: int | None = None,
        in_flight: int | None = None,
        leftovers: Leftovers | str = Leftovers.CARRY,
        batcher: GroupBatcher | None = None,
        source_handlers: Mapping[str, str] | None = None,
        state: Mapping[str, Any] | None = None,
        poll_s: float = 0.05,
        drop_zero_variance: bool = True,
        staleness: str | None = None,
        retry_stale_as: str | None = Staleness.CONTINUE.value,
        adaptive: AdaptiveBudget | None = None,
    ) -> None:
        if samples < 1 or informative_groups < 1:
            raise ValueError("samples and informative_groups must be >= 1")
        self.spool = spool
        self.samples = samples
        self.informative_groups = informative_groups
        self.handler = handler
        self.sampling = dict(sampling or {})
        self.max_policy_lag = spool.config.trainer.max_policy_lag if max_policy_lag is None else max_policy_lag
        self.in_flight = in_flight
        self.leftovers = parse_choice(Leftovers, leftovers, "leftovers")
        self.batcher = batcher or GroupBatcher()
        self.source_handlers = dict(source_handlers or {})
        self.drop_zero_variance = drop_zero_variance   # False: plain GRPO batches, still counted
        self.staleness = staleness                     # restart | continue (None: run.toml's)
        # The staleness of a stale group's second try (None: as the first): continue, so that a
        # prompt is restarted at most once.
        self.retry_stale_as = None if retry_stale_as is None else Staleness.parse(retry_stale_as).value
        self._prompts: Iterator[dict[str, Any]] = iter(itertools.cycle(prompts) if isinstance(prompts, Sequence) else prompts)
        self._retry: deque[dict[str, Any]] = deque()           # prompts of stale groups, first in line
        self._outstanding: dict[str, dict[str, Any]] = dict((state or {}).get("outstanding", {}))
        self._abandoned: set[str] = set((state or {}).get("abandoned", ()))
        self.reader = spool.reader((state or {}).get("cursor"), columns=TRAINER_COLUMNS, poll_s=poll_s)
        self.totals = SamplerStats()
        self.policy_version = 0
        self.adaptive = adaptive
        if adaptive is not None:
            if adaptive.samples != samples:
                raise BudgetSettingError(f"adaptive budget judges groups of {adaptive.samples} samples, the sampler "
                                         f"submits {samples}: build it with AdaptiveBudget(samples={samples})")
            adaptive.restore((state or {}).get("adaptive", {}))

    # -- the loop ---------------------------------------------------------------------------
    def next_batch(self, policy_version: int, timeout_s: float | None = None) -> SampledBatch:
        """K informative groups (K = informative_groups), as soon as they are in.

        With drop_zero_variance=False, K groups whatever their rewards.
        """
        started = time.monotonic()
        self.policy_version = policy_version
        stats = SamplerStats()
        kept: list[list[Row]] = []
        kept_prompts: list[dict[str, Any]] = []
        self._refill(stats)
        while len(kept) < self.informative_groups:
            group = self.reader.next_group(self.reader.poll_s)
            if group is None:
                if not self._outstanding and self._exhausted():
                    break   # nothing left to wait for: a short batch
                if timeout_s is not None and time.monotonic() - started > timeout_s:
                    raise TimeoutError(
                        f"{len(kept)} of {self.informative_groups} informative groups after {timeout_s:.0f} s "
                        f"({len(self._outstanding)} in flight): are workers running? `hpc-rollout status`"
                    )
                continue
            prompt = self._judge(group, stats)
            if prompt is not None:
                kept.append(group)
                kept_prompts.append(prompt)
            self._refill(stats)
        if self.leftovers is Leftovers.CANCEL:
            self._cancel_leftovers(stats)
        stats.in_flight = len(self._outstanding)
        stats.seconds = time.monotonic() - started
        self._add_to_totals(stats)
        return SampledBatch(kept, self.batcher.build(kept), stats, policy_version, kept_prompts)

    def state(self) -> dict[str, Any]:
        """What a restarted trainer passes back as `state=` (JSON-serialisable)."""
        saved = {"cursor": str(self.reader.cursor), "outstanding": dict(self._outstanding),
                 "abandoned": sorted(self._abandoned)}
        if self.adaptive is not None:
            saved["adaptive"] = self.adaptive.state()
        return saved

    def close(self, cancel: bool = True) -> None:
        """Stop: with `cancel`, every group still in flight is cancelled."""
        if cancel and self._outstanding:
            self.spool.cancel(groups=list(self._outstanding))
            self._abandoned.update(self._outstanding)
            self._outstanding.clear()
        self.reader.close()   # its read-ahead thread; the cursor in state() stays valid

    # -- judging ------------------------------------------------------------------------------
    def _judge(self, group: list[Row], stats: SamplerStats) -> dict[str, Any] | None:
        """The group's prompt when the group is kept for the batch, else None (counted in `stats`)."""
        group_id = group[0].get("group_id", "")
        if group_id in self._abandoned:
            self._abandoned.discard(group_id)
            return None
        prompt = self._outstanding.pop(group_id, None)
        if prompt is None:
            stats.foreign_groups += 1
            return None
        stale = [r for r in group if row_is_stale(r, self.policy_version, self.max_policy_lag)]
        if not stale and self.max_policy_lag >= 0:
            stale = self._mask_stale_turns(group, stats)
        if stale:
            stats.stale_groups += 1
            stats.stale_rows += len(stale)
            self._retry.append(prompt)
            return None
        failed = [r for r in group if is_failed(r)]
        rewards = [0.0 if is_failed(r) else float(r["reward"]) for r in group]
        if self.adaptive is not None:   # a failure says nothing of the prompt's difficulty
            self.adaptive.record(prompt, [float(r["reward"]) for r in group if not is_failed(r)], self.policy_version)
        stats.add_rewards(rewards)
        if failed and self.batcher.failed is FailedPolicy.DROP_GROUP:
            stats.failed_groups += 1
            return None
        if self.batcher.failed is FailedPolicy.DROP_SAMPLE:
            rewards = [float(r["reward"]) for r in group if not is_failed(r)]
        if len(set(rewards)) <= 1:
            stats.zero_variance += 1
            return None if self.drop_zero_variance else prompt
        stats.informative += 1
        return prompt

    def _mask_stale_turns(self, group: list[Row], stats: SamplerStats) -> list[Row]:
        """Mask, in place, the too-old turns of the group's continue rows; the rows that could not
        be judged per turn (no turn spans) and are too old by their oldest token."""
        floor = staleness_floor(self.policy_version, self.max_policy_lag)
        if floor is None:
            return []
        stale: list[Row] = []
        for index, row in enumerate(group):
            oldest = row.get("policy_version_min")
            if row.get("staleness") != Staleness.CONTINUE.value or oldest is None or oldest >= floor:
                continue
            masked = mask_stale_turns(row, floor)
            if masked is None:
                stale.append(row)
                continue
            group[index], tokens = masked
            stats.stale_turn_tokens += tokens
        return stale

    # -- submitting ---------------------------------------------------------------------------
    def target_in_flight(self) -> int:
        """Groups to keep submitted: `in_flight`, or enough for K informative at the filter rate seen."""
        if self.in_flight is not None:
            return self.in_flight
        keep_share = max(0.1, 1.0 - self.totals.filtered_share) if self.drop_zero_variance else 1.0
        return min(8 * self.informative_groups, math.ceil(1.5 * self.informative_groups / keep_share))

    def _refill(self, stats: SamplerStats) -> None:
        missing = self.target_in_flight() - len(self._outstanding)
        retries = [self._retry.popleft() for _ in range(min(missing, len(self._retry)))]
        fresh: list[dict[str, Any]] = []
        while len(retries) + len(fresh) < missing:
            prompt = next(self._prompts, None)
            if prompt is None:
                break
            if self.adaptive is not None and not self.adaptive.admit(prompt, self.policy_version):
                stats.skipped_prompts += 1
                continue
            fresh.append(prompt)
        self._submit(retries, self.retry_stale_as or self.staleness, stats)
        self._submit(fresh, self.staleness, stats)

    def _submit(self, prompts: list[dict[str, Any]], staleness: str | None, stats: SamplerStats) -> None:
        if not prompts:
            return
        report = self.spool.submit(prompts, handler=self.handler, samples=self.samples, sampling=self.sampling,
                                   source_handlers=self.source_handlers, staleness=staleness)
        if report.rejected:
            problems = "; ".join(f"prompt {p.line}: {p.reason}" for p in report.rejected[:3])
            raise ValueError(f"{len(report.rejected)} prompt(s) refused by submit: {problems}")
        for index, prompt in enumerate(prompts):
            self._outstanding[group_id(report.submission_id, index)] = prompt
        stats.submitted_groups += len(prompts)

    def _exhausted(self) -> bool:
        if self._retry:
            return False
        upcoming = next(self._prompts, None)
        if upcoming is None:
            return True
        self._retry.appendleft(upcoming)
        return False

    def _cancel_leftovers(self, stats: SamplerStats) -> None:
        while (group := self.reader.take_group()) is not None:
            if self._outstanding.pop(group[0].get("group_id", ""), None) is not None:
                stats.leftovers_cancelled += 1
        if self._outstanding:
            self.spool.cancel(groups=list(self._outstanding))
            stats.leftovers_cancelled += len(self._outstanding)
            self._abandoned.update(self._outstanding)
            self._outstanding.clear()

    def _add_to_totals(self, stats: SamplerStats) -> None:
        totals = self.totals
        for name in ("informative", "zero_variance", "stale_groups", "stale_rows", "stale_turn_tokens", "failed_groups",
                     "foreign_groups", "leftovers_cancelled", "submitted_groups", "skipped_prompts"):
            setattr(totals, name, getattr(totals, name) + getattr(stats, name))
        totals._reward_sum += stats._reward_sum
        totals._reward_count += stats._reward_count
        if totals._reward_count:
            totals.mean_reward = totals._reward_sum / totals._reward_count
        totals.in_flight = stats.in_flight
        totals.seconds += stats.seconds
