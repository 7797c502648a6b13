"""`sleep`: stages that take a given time and fail with a given probability.

Its instance keys are declared in SCHEMA below (`hpc-rollout handlers sleep` lists them). A
duration is seconds, or a distribution:
    {"uniform": [low, high]}
    {"lognormal": {"mean": m, "sigma": s}}   (mean of the distribution itself)
    {"exponential": mean}
any of them may add "tail_p" and "tail_factor": with probability tail_p the duration is
multiplied by tail_factor (heavy tails). `reward` {"bernoulli": p} is drawn per job (seeded:
groups of a prompt with p = 0 or 1 have no reward variance, the others usually do);
`policy_version` "current" is the registry's policy version when RUN ends, as an LLM turn would
record it (a stand-in for an LLM handler in tests of the staleness bound).
"""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

from orchestrator.handler_api.context import JobContext
from orchestrator.handler_api.contract import AgentHandler
from orchestrator.handler_api.schema import InstanceSchema, Kind, instance_key
from orchestrator.llm.registry import BackendRegistry

DISTRIBUTIONS = ("uniform", "lognormal", "exponential")
STAGES = ("init", "run", "eval")
DURATION = (Kind.NUMBER, Kind.OBJECT)
SCHEMA = InstanceSchema((
    *(instance_key(stage, DURATION, f"seconds of {stage.upper()}: a number or a distribution "
      f"({', '.join(DISTRIBUTIONS)}; + tail_p, tail_factor)", default=0.0) for stage in STAGES),
    instance_key("scale", Kind.NUMBER, "multiplies every duration (run a profile faster)", default=1.0),
    instance_key("seed", (Kind.STRING, Kind.INTEGER), "makes the draws reproducible (per job and stage)"),
    instance_key("fail", Kind.OBJECT, "probability that a stage raises, per stage", default={},
        keys=InstanceSchema(tuple(instance_key(stage, Kind.NUMBER, f"probability that {stage.upper()} raises, in [0, 1]")
                                  for stage in STAGES))),
    instance_key("reward", (Kind.NUMBER, Kind.BOOLEAN, Kind.OBJECT), 'the reward EVAL returns: a number, or {"bernoulli": p}',
        default=1.0),
    instance_key("policy_version", (Kind.INTEGER, Kind.STRING), 'reported by RUN as the policy sampled with: a number, or "current"'),
), accepts_verl_rows=True)   # a verl dataset may mix sleep rows in (tests, benchmarks): its keys are ignored


class SleepFailure(RuntimeError):
    """The failure the instance asked for."""


def draw_seconds(spec: Any, rng: random.Random) -> float:
    """Seconds for one stage from a number or a distribution spec; ValueError when malformed."""
    if spec is None:
        return 0.0
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        if spec < 0:
            raise ValueError(f"duration {spec} is negative")
        return float(spec)
    if not isinstance(spec, dict):
        raise ValueError(f"duration {spec!r}: expected seconds or one of {', '.join(DISTRIBUTIONS)}")
    kinds = [k for k in DISTRIBUTIONS if k in spec]
    if len(kinds) != 1:
        raise ValueError(f"duration {spec!r}: give exactly one of {', '.join(DISTRIBUTIONS)}")
    kind, args = kinds[0], spec[kinds[0]]
    if kind == "uniform":
        low, high = float(args[0]), float(args[1])
        value = rng.uniform(low, high)
    elif kind == "lognormal":
        mean, sigma = float(args["mean"]), float(args.get("sigma", 0.5))
        value = rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)
    else:
        value = rng.expovariate(1.0 / float(args))
    if rng.random() < float(spec.get("tail_p", 0.0)):
        value *= float(spec.get("tail_factor", 10.0))
    return max(value, 0.0)


class SleepHandler(AgentHandler):
    name = "sleep"
    instance_schema = SCHEMA

    def validate_instance(self, instance: dict[str, Any]) -> None:
        rng = random.Random(0)
        for stage in STAGES:
            draw_seconds(instance.get(stage), rng)
        fail = SCHEMA.value(instance, "fail")
        if not isinstance(fail, dict) or not all(0 <= float(p) <= 1 for p in fail.values()):
            raise ValueError(f"fail {fail!r}: expected {{stage: probability in [0, 1]}}")
        draw_reward(SCHEMA.value(instance, "reward"), rng)

    async def _stage(self, ctx: JobContext, stage: str) -> dict[str, Any]:
        instance = ctx.job.instance
        rng = random.Random(f"{instance.get('seed', '')}/{ctx.job.job_id}/{stage}/{ctx.attempt}")
        seconds = draw_seconds(instance.get(stage), rng) * float(SCHEMA.value(instance, "scale"))
        await asyncio.sleep(seconds)
        if rng.random() < float(SCHEMA.value(instance, "fail").get(stage, 0.0)):
            raise SleepFailure(f"{stage} failed on purpose (fail probability {instance['fail'][stage]})")
        return {f"{stage}_slept_s": round(seconds, 6), "node": ctx.node}

    async def init(self, ctx: JobContext) -> dict[str, Any]:
        return await self._stage(ctx, "init")

    async def run(self, ctx: JobContext, prepared: dict[str, Any]) -> dict[str, Any]:
        out = await self._stage(ctx, "run")
        version = ctx.job.instance.get("policy_version")
        if version == "current":
            version = BackendRegistry(ctx.paths).read().policy_version
        if isinstance(version, int):
            out["policy_version_min"] = out["policy_version_max"] = version
        return out

    async def eval(self, ctx: JobContext, result: dict[str, Any]) -> dict[str, Any]:
        out = await self._stage(ctx, "eval")
        instance = ctx.job.instance
        rng = random.Random(f"{instance.get('seed', '')}/{ctx.job.job_id}/reward")
        out["reward"] = draw_reward(SCHEMA.value(instance, "reward"), rng)
        return out


def draw_reward(spec: Any, rng: random.Random) -> float:
    """A number as it is, or {"bernoulli": p} -> 1.0 with probability p; ValueError otherwise."""
    if isinstance(spec, (int, float)):   # booleans too: True pays 1.0
        return float(spec)
    if isinstance(spec, dict) and set(spec) == {"bernoulli"} and 0 <= float(spec["bernoulli"]) <= 1:
        return 1.0 if rng.random() < float(spec["bernoulli"]) else 0.0
    raise ValueError(f"reward {spec!r}: expected a number or {{\"bernoulli\": p}} with p in [0, 1]")
