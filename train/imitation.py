"""Imitation of static:best's caps: the tenant-set policy learns, by DAgger, to steer each tenant's limit to
the caps static:best tuned offline for that instance — from what it observes online, without the caps.

``ppo:general`` must find online the per-tenant caps that static:best searched for offline on the
instance's own traffic, and PPO's learning signal for that is weak (docs/why_static_best.md). The tuned
caps of a pool of training instances are a far stronger one: a label at every decision. The **expert** at
a state is the choice (admit.agents.set_codec's multiplicative moves, the deployed policy's own action)
that brings each tenant's limit closest to its tuned cap in one decision, "hold" on a tie. The policy sees
only the plain tenant-set observation (traffic, queues, latencies, tokens, SLOs, its current limits), so
what it learns is a map from observed traffic to caps, which is what has to carry over to unseen instances.

DAgger (Ross, Gordon and Bagnell, "A Reduction of Imitation Learning and Structured Prediction to No-Regret
Online Learning", AISTATS 2011): round 0 follows the expert for ``episodes`` episodes (with a share ``noise``
of random choices, so that states off the expert's path are labelled too); every later round runs the policy
learned so far for ``dagger_episodes`` (deterministic, a share ``dagger_noise`` of random choices), labels
the states it visits with the expert's choice and adds them to the data; after each round the policy is
fitted to all data by cross-entropy on the real tenant slots (padding slots are pinned to "hold" by the
network and add nothing). The value head is not trained here; a PPO run may continue from the result.

Episode seeds are ``3_000_000 + ...``: disjoint from PPO's training seeds (1,000,000 + ...), the validation
seeds (500,000 + ...), the evaluation seeds (0..N-1) and static:best's tuning seeds (900,000..900,004).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from admit.agents import set_codec
from admit.core.spec import Limits
from admit.train.worlds import SetEnv, anchors_for

SEED_BASE = 3_000_000


def expert_choices(current: Sequence[int], caps: Sequence[int], limits: Limits) -> list[int]:
    """Per tenant, the choice whose one-decision result (set_codec.delta_list) is nearest its cap; among equally
    near ones the smallest move (so "hold" once the limit is at its cap, or when nothing gets closer)."""
    if len(current) != len(caps):
        raise ValueError(f"{len(current)} limits and {len(caps)} caps")
    out = []
    for limit, cap in zip(current, caps, strict=True):
        best, gap = set_codec.HOLD, abs(limit - cap)
        for c, f in enumerate(set_codec.FACTORS):
            d = abs(limit + set_codec.delta_list([c], [limit], limits)[0] - cap)
            if d < gap or (d == gap and abs(f - 1.0) < abs(set_codec.FACTORS[best] - 1.0)):
                best, gap = c, d
        out.append(best)
    return out


@dataclass
class Dataset:
    obs: np.ndarray  # (N, set_vector_size) float32
    labels: np.ndarray  # (N, max_tenants) int64: the expert's choice per slot, HOLD in padding

    def __len__(self) -> int:
        return len(self.obs)

    def extend(self, other: Dataset) -> Dataset:
        return Dataset(np.concatenate([self.obs, other.obs]), np.concatenate([self.labels, other.labels]))


def collect(env: SetEnv, act: Callable[[np.ndarray], np.ndarray] | None, episodes: int, noise: float,
            rng: np.random.Generator, first_seed: int, search_seeds: int = 5) -> Dataset:
    """``episodes`` episodes of ``env`` (seeds ``first_seed + j``) driven by ``act`` (None: the expert), a share
    ``noise`` of each tenant's choices replaced by random ones; every state labelled with the expert's choice."""
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    m = env.max_tenants
    for j in range(episodes):
        obs, _ = env.reset(seed=first_seed + j)
        inner = env.inner
        assert inner is not None and inner.sim is not None
        caps = anchors_for(inner.scenario, search_seeds)
        n = len(caps)
        done = False
        while not done:
            assert inner.sim is not None
            label = np.full(m, set_codec.HOLD, dtype=np.int64)
            label[:n] = expert_choices([int(v) for v in inner.sim.limits], caps, env.limits)
            xs.append(obs)
            ys.append(label)
            action = label.copy() if act is None else np.asarray(act(obs), dtype=np.int64).copy()
            flip = rng.random(n) < noise
            action[:n][flip] = rng.integers(0, len(set_codec.FACTORS), int(flip.sum()))
            obs, _, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
    return Dataset(np.asarray(xs, dtype=np.float32), np.asarray(ys, dtype=np.int64))


def fit(policy: Any, data: Dataset, epochs: int, lr: float, batch: int,
        gen: torch.Generator) -> tuple[float, float]:
    """Cross-entropy of the policy's choices against the labels (summed over slots, padding adds ~0);
    returns the last epoch's mean loss and the accuracy of the deterministic choice on the real slots."""
    get = policy.get_distribution
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    x, y = torch.as_tensor(data.obs), torch.as_tensor(data.labels)
    loss_sum = 0.0
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=gen)
        loss_sum = 0.0
        for i in range(0, len(x), batch):
            idx = perm[i : i + batch]
            loss = -get(x[idx]).log_prob(y[idx]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += float(loss.detach()) * len(idx)
    m = y.shape[1]
    mask0 = set_codec.N_GLOBAL + m * set_codec.N_TENANT
    with torch.no_grad():
        hits, real = 0.0, 0.0
        for i in range(0, len(x), 8192):
            mode = get(x[i : i + 8192]).mode()
            mask = x[i : i + 8192, mask0 : mask0 + m]
            hits += float(((mode == y[i : i + 8192]).float() * mask).sum())
            real += float(mask.sum())
    return loss_sum / max(len(x), 1), hits / max(real, 1.0)


def imitate(policy: Any, env: SetEnv, *, rounds: int, episodes: int, noise: float,
            dagger_episodes: int, dagger_noise: float, epochs: int, lr: float, batch: int, seed: int,
            log: Callable[[str], None] | None = None, search_seeds: int = 5) -> list[dict[str, float]]:
    """DAgger on ``env`` (see the module docstring; the expert's caps tuned on the first ``search_seeds`` of
    static:best's seeds); returns each round's samples, loss and accuracy."""
    rng = np.random.default_rng([seed, 0xDA6])
    gen = torch.Generator().manual_seed(seed)
    get = policy.get_distribution

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return get(torch.as_tensor(obs[None])).mode()[0].numpy()

    history = []
    data = collect(env, None, episodes, noise, rng, SEED_BASE + 10_000 * seed, search_seeds)
    for r in range(rounds):
        if r > 0:
            data = data.extend(
                collect(env, act, dagger_episodes, dagger_noise, rng, SEED_BASE + 10_000 * seed + 1_000 * r,
                        search_seeds))
        loss, acc = fit(policy, data, epochs, lr, batch, gen)
        history.append({"round": r, "samples": len(data), "loss": loss, "accuracy": acc})
        if log is not None:
            log(f"imitation round {r}: {len(data)} samples, loss {loss:.3f}, accuracy {acc:.3f}")
    return history
