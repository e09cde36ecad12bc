"""An independent, deliberately plain model of vLLM V1's scheduler: one Python loop per step over every
request. Tests compare TokenEngine (macro-steps and step mode) against it; it shares only the step-time
model. Arrivals that land during a step join at the next step boundary."""

from __future__ import annotations

import math
from collections import deque

from admit.engine.request import Request
from admit.engine.steptime import StepTimeModel


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def simulate(
    reqs: list[Request], model: StepTimeModel, budget: int, max_seqs: int, num_blocks: int, bs: int = 16
) -> int:
    """Run ``reqs`` (sorted by arrival) to completion; sets first_token/finished; returns preemptions."""
    pending = deque(reqs)
    waiting: deque[Request] = deque()
    running: list[Request] = []
    blocks: dict[int, int] = {}
    decoding: set[int] = set()  # rids whose last step sampled a token
    preemptions = 0
    t = 0.0
    while pending or waiting or running:
        if not waiting and not running:
            t = max(t, pending[0].arrival)
            waiting.append(pending.popleft())
        while pending and pending[0].arrival < t:
            waiting.append(pending.popleft())
        free = num_blocks - sum(blocks.values())
        left = budget
        sched: list[tuple[Request, int]] = []
        preempted = False
        i = 0
        while i < len(running) and left > 0:
            r = running[i]
            n = min(r.prompt_tokens + r.generated - r.computed, left)
            nb = _ceil(r.computed + n, bs) - blocks[r.rid]
            ok = True
            while nb > free:
                v = running.pop()
                free += blocks.pop(v.rid)
                v.computed = 0
                decoding.discard(v.rid)
                v.preemptions += 1
                preemptions += 1
                waiting.appendleft(v)
                preempted = True
                if v is r:
                    ok = False
                    break
            if not ok:
                break
            blocks[r.rid] += nb
            free -= nb
            left -= n
            sched.append((r, n))
            i += 1
        if not preempted:
            while waiting and left > 0 and len(running) < max_seqs:
                r = waiting[0]
                n = min(r.prompt_tokens + r.generated, left)
                nb = _ceil(n, bs)
                if nb > free:
                    break
                waiting.popleft()
                running.append(r)
                blocks[r.rid] = nb
                free -= nb
                left -= n
                sched.append((r, n))
        tokens = sum(n for _, n in sched)
        kv = 0
        pairs = 0.0
        for r, n in sched:
            if r.rid in decoding:
                kv += r.computed + 1
            else:
                pairs += n * (r.computed + (n + 1) / 2.0)
        t += model.step_time(tokens, len(sched), kv, pairs)
        for r, n in sched:
            r.computed += n
            if r.computed == r.prompt_tokens + r.generated:
                r.generated += 1
                decoding.add(r.rid)
                if math.isnan(r.first_token):
                    r.first_token = t
                if r.generated >= r.output_tokens:
                    r.finished = t
                    running.remove(r)
                    del blocks[r.rid]
    return preemptions
