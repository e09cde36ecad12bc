"""LLM-prompted admission policy: asks a chat model for per-tenant limit deltas (``--policy llm:URL``).

Any OpenAI-compatible chat endpoint works (llama.cpp's server, vLLM, OpenAI itself); it is reached with
the official ``openai`` client. Settings come from admit.agents.llm_config (URL, model, key, K, rate
budget, timeout, log file, prompt file); the prompt from admit.agents.llm_prompt; the reply contract from
admit.agents.llm_reply.

Each ``act(obs)``:
1. remembers a snapshot of the observation (the trend and burst context of later prompts);
2. holds (all zeros) unless this interval is a decision point (every K intervals, starting with the first);
3. builds the prompt; an identical prompt seen before is answered from an LRU cache without a call;
4. spends one token of the rate budget, or holds (``rate_limited``) when the bucket is empty;
5. calls the model with ``response_format`` = the JSON schema of valid deltas, no retries, a timeout;
6. validates the reply; any failure holds and is counted by reason: ``timeout``, ``http_error``,
   ``connection_error``, ``bad_response``, the reply reasons of llm_reply (``length``, ``not_json``,
   ``wrong_length``, ``out_of_range`` ...), or ``error`` for anything unforeseen. act() never raises.
Every decision point lands in the decision log with the rationale or the reason for holding.

Because act() never raises, a failure is reported in ``last_failure`` (core/controller.py): the reason
after a failed decision point, None after a decision, a cache hit, an interval between decision points or
a ``rate_limited`` hold (the policy's own budget: deliberate, not a failure). The live control loop
counts it as ``policy:<reason>`` and falls back after ``max_failures`` in a row.

Swapping in a capable model: ``ADMIT_LLM_URL=https://api.openai.com/v1 ADMIT_LLM_MODEL=<model>
OPENAI_API_KEY=...``, or a YAML settings file passed as ``--policy llm:settings.yaml``; a richer prompt
goes in a YAML prompt file (``prompt_file``) with the fields documented in admit.agents.llm_prompt.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections import deque
from collections.abc import Callable

import openai
from admit.agents.decision_log import Decision, DecisionLog
from admit.agents.llm_config import LLMConfig, load_config
from admit.agents.llm_prompt import PromptTemplate, TenantSnapshot, build_messages, snapshot
from admit.agents.llm_reply import Reply, parse_reply, response_format
from admit.agents.llm_stats import LLMStats
from admit.agents.prompt_cache import LRUCache
from admit.agents.rate_budget import TokenBucket
from admit.core.observation import Observation
from admit.core.spec import ControlSpec


class LLMPolicy:
    name = "llm"

    def __init__(self, config: LLMConfig | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config if config is not None else load_config()
        cfg = self.config
        self.template = PromptTemplate.from_file(cfg.prompt_file) if cfg.prompt_file else PromptTemplate()
        self.client = openai.OpenAI(
            base_url=cfg.base_url, api_key=cfg.resolved_api_key(), timeout=cfg.timeout_s, max_retries=0
        )
        self.budget = TokenBucket(cfg.calls_per_min, cfg.burst, clock)
        self.cache: LRUCache[Reply] = LRUCache(cfg.cache_size)
        self.log = DecisionLog(cfg.log_path or None, cfg.log_keep)
        self.stats = LLMStats()
        self._spec: ControlSpec | None = None
        self._history: deque[tuple[TenantSnapshot, ...]] = deque(maxlen=cfg.history)
        self._step = 0
        self.last_failure: str | None = None  # why the last act() could not decide (core/controller.py)

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        """Start an episode: forget the trend; keep the cache, the rate budget and the counters."""
        self._spec = spec
        self._history.clear()
        self._step = 0
        self.last_failure = None

    def act(self, obs: Observation) -> list[int]:
        self.last_failure = None
        try:
            return self._act(obs)
        except Exception as e:  # the control loop must keep running whatever happens here
            self.last_failure = "error"
            self.stats.hold("error")
            hold = [0] * obs.n_tenants
            with contextlib.suppress(Exception):
                self._record(obs, "hold", "error", hold, f"{type(e).__name__}: {e}"[:200], None, "")
            return hold

    def _act(self, obs: Observation) -> list[int]:
        spec = self._spec
        if spec is None:
            raise RuntimeError("LLMPolicy.act() before reset(spec)")
        n, k = spec.n_tenants, spec.limits.max_step
        hold = [0] * n
        self.stats.acts += 1
        self._history.append(snapshot(obs))
        step = self._step
        self._step += 1
        if step % self.config.every != 0:
            return hold
        self.stats.decisions += 1

        messages = build_messages(self.template, spec, obs, self._history)
        key = json.dumps(messages, sort_keys=True)
        prompt_id = hashlib.sha1(key.encode()).hexdigest()[:12]
        cached = self.cache.get(key)
        if cached is not None and cached.deltas is not None:
            self.stats.cache_hits += 1
            self._record(obs, "cache", "ok", cached.deltas, cached.rationale, None, prompt_id)
            return list(cached.deltas)
        if not self.budget.try_take():
            return self._hold(obs, "rate_limited", None, prompt_id)

        reply, latency = self._call(messages, n, k)
        if reply.deltas is None:
            return self._hold(obs, reply.reason, latency, prompt_id, reply.rationale)
        self.stats.valid += 1
        self.cache.put(key, reply)
        self._record(obs, "model", "ok", reply.deltas, reply.rationale, latency, prompt_id)
        return list(reply.deltas)

    def _call(self, messages: list[dict[str, str]], n: int, k: int) -> tuple[Reply, float]:
        """One request to the model; every failure comes back as a Reply without deltas."""
        cfg = self.config
        self.stats.calls += 1
        t0 = time.perf_counter()
        try:
            # the messages and the response format are plain dicts, not the client's TypedDicts
            resp = self.client.chat.completions.create(  # type: ignore[call-overload]
                model=cfg.model,
                messages=messages,
                response_format=response_format(n, k),
                max_tokens=cfg.max_tokens,
                temperature=cfg.temperature,
            )
            choice = resp.choices[0] if resp.choices else None
            reply = (
                parse_reply(choice.message.content, choice.finish_reason, n, k)
                if choice is not None
                else Reply(None, "", "empty")
            )
        except openai.APITimeoutError:  # a subclass of APIConnectionError: check it first
            reply = Reply(None, "", "timeout")
        except openai.APIConnectionError:
            reply = Reply(None, "", "connection_error")
        except openai.APIStatusError as e:
            reply = Reply(None, f"HTTP {e.status_code}", "http_error")
        except (openai.OpenAIError, ValueError, TypeError, AttributeError):
            reply = Reply(None, "", "bad_response")  # a 200 whose body is not a chat completion
        latency = time.perf_counter() - t0
        self.stats.latencies_s.append(latency)
        return reply, latency

    def _hold(
        self, obs: Observation, reason: str, latency: float | None, prompt_id: str, rationale: str = ""
    ) -> list[int]:
        self.stats.hold(reason)
        if reason != "rate_limited":  # the policy's own budget is a deliberate hold, not a failure
            self.last_failure = reason
        hold = [0] * obs.n_tenants
        self._record(obs, "hold", reason, hold, rationale, latency, prompt_id)
        return hold

    def _record(
        self,
        obs: Observation,
        source: str,
        reason: str,
        deltas: list[int],
        rationale: str,
        latency: float | None,
        prompt_id: str,
    ) -> None:
        self.log.add(Decision(self._step - 1, obs.time_s, source, reason, list(deltas), rationale, latency, prompt_id))

    def close(self) -> None:
        self.client.close()


def make_llm_policy(arg: str | None) -> LLMPolicy:
    """Registry factory: ``llm:URL``, ``llm:settings.yaml`` or plain ``llm`` (settings from the environment)."""
    return LLMPolicy(load_config(arg))
