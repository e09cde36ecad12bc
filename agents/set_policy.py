"""The tenant-set policy: one network for any tenant count, as an SB3 ``ActorCriticPolicy`` (PPO, A2C).

It reads the tenant-set vector (admit.agents.set_codec: globals, limit bounds, ``M`` padded tenant slots, a
mask) and is built DeepSets-style, so it is the same function of every tenant and indifferent to their order:

    z        = log1p(x)                                  every feature is >= 0; tokens reach 1e6, SLOs 1e4
    e_i      = φ([z_tenant_i, z_global])                 shared per-tenant encoder, 2 layers of ``hidden``
    c        = [masked mean_i e_i, masked max_i e_i]     the pooled context of all real tenants
    logits_i = ψ([e_i, c])                               shared head: one categorical per tenant slot
    V        = ρ([c, z_global])                          the critic sees the pool, never a slot index

Every hidden layer uses ``activation`` (tanh, SB3's default, or ReLU: this CPU build of torch takes ~4 ns per
element for tanh and ~0.15 for ReLU, a sixth of a PPO update at 64 units). ψ's first layer is computed as
``W_e e_i + (W_c c + b)``: the context's share once per row instead of once per slot, the same function
with the same parameters (a third of ψ's multiply-adds; sums in another order, so equal to float rounding);
φ's first layer likewise takes the globals' share once per row instead of concatenating them to every slot.

Anchored (admit.agents.set_codec: the input carries each slot's anchor cap after the mask, found from the
observation space's size), ``log1p(anchor)`` is one more per-tenant feature of φ; ``hold_bias`` starts the
head's "hold" logit above the others, so an untrained anchored policy's mode is its anchors. With contract
features (after the anchors, if any), ``log1p`` of each slot's ``set_codec.CONTRACT_FEATURES`` are three more.

A padding slot's logits are pinned to "hold" (a near-certain choice), so it adds nothing to the log-probability
or the entropy PPO optimises. Zaheer et al., "Deep Sets" (NeurIPS 2017) for the sum/max-pooled form.

The action distribution (``SlotCategorical``) is SB3's MultiCategoricalDistribution computed on all slots
at once: the same values and random draws, a few tensor operations instead of a few per slot.
"""

from __future__ import annotations

from typing import Any

import torch
from admit.agents.set_codec import HOLD, MAX_TENANTS, N_CONTRACT, N_GLOBAL, N_TENANT, factor_set, set_layout_of
from stable_baselines3.common.distributions import MultiCategoricalDistribution
from stable_baselines3.common.policies import ActorCriticPolicy
from torch import nn
from torch.nn import functional as F

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}

PIN = 30.0  # a padding slot's logit margin for "hold": probability 1 − 6·e^−30 of choosing it


class SetExtractor(nn.Module):
    """φ, the pooling, ψ's hidden layer and ρ's: ``forward`` gives (actor latent, critic latent)."""

    def __init__(self, hidden: int, max_tenants: int, activation: str = "tanh", anchored: bool = False,
                 contracted: bool = False) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        act = ACTIVATIONS[activation]
        self.m = max_tenants
        self.hidden = hidden
        self.anchored = anchored
        self.contracted = contracted
        self.nt = N_TENANT + (1 if anchored else 0) + (N_CONTRACT if contracted else 0)  # per-tenant features φ reads
        self.phi = nn.Sequential(nn.Linear(self.nt + N_GLOBAL, hidden), act(), nn.Linear(hidden, hidden), act())
        self.psi = nn.Sequential(nn.Linear(3 * hidden, hidden), act())
        self.rho = nn.Sequential(nn.Linear(2 * hidden + N_GLOBAL, hidden), act())
        # what ActorCriticPolicy reads: the actor latent is every slot's hidden vector plus the mask
        self.latent_dim_pi = max_tenants * hidden + max_tenants
        self.latent_dim_vf = hidden

    def _context(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        b, m = x.shape[0], self.m
        z = torch.log1p(x.clamp(min=0.0))  # every feature at once (the mask's share is not read)
        zg = z[:, :N_GLOBAL]
        zt = z[:, N_GLOBAL : N_GLOBAL + m * N_TENANT].reshape(b, m, N_TENANT)
        mask0 = N_GLOBAL + m * N_TENANT
        mask = x[:, mask0 : mask0 + m]
        a0 = mask0 + m
        if self.anchored:
            zt = torch.cat([zt, z[:, a0 : a0 + m].unsqueeze(-1)], dim=-1)
            a0 += m
        if self.contracted:
            zt = torch.cat([zt, z[:, a0 : a0 + m * N_CONTRACT].reshape(b, m, N_CONTRACT)], dim=-1)
        # φ's first layer on [z_tenant_i, z_global], the globals' share once per row (as ψ's context below)
        first = self.phi[0]
        assert isinstance(first, nn.Linear)
        w0 = first.weight
        nt = self.nt
        pre = F.linear(zt, w0[:, :nt]) + F.linear(zg, w0[:, nt:], first.bias).unsqueeze(1)
        e = self.phi[3](self.phi[2](self.phi[1](pre)))  # (B, m, h)
        w = mask.unsqueeze(-1)
        count = w.sum(dim=1)
        mean = (e * w).sum(dim=1) / count.clamp(min=1.0)
        mx = e.masked_fill(w == 0, -torch.finfo(e.dtype).max).amax(dim=1)
        mx = torch.where(count > 0, mx, torch.zeros_like(mx))  # no real tenant (never in an env): a zero pool
        return torch.cat([mean, mx], dim=-1), e, zg, mask

    def _slots(self, e: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """ψ's hidden layer on every slot, (B, m, h): ``act(W [e_i, c] + b)`` with ``W = [W_e | W_c]``."""
        lin, act = self.psi[0], self.psi[1]
        assert isinstance(lin, nn.Linear)
        w, h = lin.weight, self.hidden
        own = F.linear(e, w[:, :h])
        shared = F.linear(ctx, w[:, h:], lin.bias)
        out: torch.Tensor = act(own + shared.unsqueeze(1))
        return out

    def forward_actor(self, x: torch.Tensor) -> torch.Tensor:
        ctx, e, _, mask = self._context(x)
        return torch.cat([self._slots(e, ctx).flatten(1), mask], dim=-1)

    def forward_critic(self, x: torch.Tensor) -> torch.Tensor:
        ctx, _, zg, _ = self._context(x)
        return self.rho(torch.cat([ctx, zg], dim=-1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx, e, zg, mask = self._context(x)
        return torch.cat([self._slots(e, ctx).flatten(1), mask], dim=-1), self.rho(torch.cat([ctx, zg], dim=-1))


class SlotHead(nn.Module):
    """ψ's last layer, shared by every slot: (B, m·h + m) → (B, m·n_choices) logits, tenant-major (the order
    SB3's MultiCategoricalDistribution splits them in); padding slots pinned to HOLD."""

    def __init__(self, hidden: int, max_tenants: int, n_choices: int, hold_bias: float = 0.0) -> None:
        super().__init__()
        self.m, self.h, self.a = max_tenants, hidden, n_choices
        self.out = nn.Linear(hidden, n_choices)
        nn.init.orthogonal_(self.out.weight, gain=0.01)  # SB3's small initial policy gain: near-uniform at start
        nn.init.zeros_(self.out.bias)
        with torch.no_grad():
            self.out.bias[HOLD] = hold_bias  # 0: uniform at start; > 0: "hold" the likeliest choice
        pinned = torch.full((n_choices,), -PIN)
        pinned[HOLD] = 0.0
        self.register_buffer("pinned", pinned)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        b = latent.shape[0]
        h = latent[:, : self.m * self.h].reshape(b, self.m, self.h)
        mask = latent[:, self.m * self.h :].unsqueeze(-1)
        pinned: torch.Tensor = self.pinned  # type: ignore[assignment]  # a registered buffer
        logits = torch.where(mask > 0, self.out(h), pinned.expand(b, self.m, -1))
        return logits.flatten(1)


class SlotCategorical(MultiCategoricalDistribution):
    """``MultiCategoricalDistribution`` over ``m`` slots of ``a`` choices each, as one (B, m, a) tensor.

    SB3's builds one ``torch.distributions.Categorical`` per slot and loops over them for every sample,
    log-probability and entropy: at 8 slots that was most of a rollout step's policy time. This computes what
    those Categoricals compute (logits less their logsumexp, softmax, the per-slot log-probabilities and
    entropies summed over slots, the samples from ``torch.multinomial``) on every slot in one call each, with
    the slots sampled in SB3's order: samples, log-probabilities, entropies and modes are the same
    (tests/agents/test_tenant_set.py compares them exactly). Gradients agree to float rounding only: autograd
    accumulates a few of them in another order (differences of ~1e-13 in a PPO loss's latent gradient,
    ~1e-8 in the parameters after two updates), so a run trained with it is not bit-identical to one trained
    before it; a trained policy's deterministic actions (``mode``) are unchanged."""

    def __init__(self, m: int, a: int) -> None:
        super().__init__([a] * m)
        self.m, self.a = m, a
        self.logp = torch.zeros(0)
        self.probs = torch.zeros(0)

    def proba_distribution(self, action_logits: torch.Tensor) -> SlotCategorical:
        z = action_logits.reshape(action_logits.shape[0], self.m, self.a)
        self.logp = z - z.logsumexp(-1, keepdim=True)  # Categorical(logits=z).logits
        self.probs = torch.softmax(self.logp, -1)  # Categorical(logits=z).probs
        return self

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        return self.logp.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1).sum(dim=1)

    def entropy(self) -> torch.Tensor:
        logp = self.logp.clamp(min=torch.finfo(self.logp.dtype).min)  # as Categorical.entropy
        return (-(logp * self.probs).sum(-1)).sum(dim=1)

    def sample(self) -> torch.Tensor:
        b = self.probs.shape[0]
        # slot-major rows: slot 0's batch, then slot 1's, ... (the order SB3 samples the slots in)
        rows = self.probs.transpose(0, 1).reshape(self.m * b, self.a)
        return torch.multinomial(rows, 1, True).reshape(self.m, b).T

    def mode(self) -> torch.Tensor:
        return torch.argmax(self.probs, dim=-1)


class TenantSetPolicy(ActorCriticPolicy):
    """ActorCriticPolicy with the DeepSets extractor and the shared slot head (see the module docstring)."""

    def __init__(self, *args: Any, hidden: int = 64, max_tenants: int = MAX_TENANTS, activation: str = "tanh",
                 hold_bias: float = 0.0, factors: str = "narrow", **kwargs: Any) -> None:
        self.set_hidden = hidden
        self.set_max_tenants = max_tenants
        self.set_activation = activation
        self.set_hold_bias = float(hold_bias)
        factor_set(factors)  # a bad name fails here, naming the sets
        self.set_factors = factors  # which choice set the anchored action decodes with (set_codec.FACTOR_SETS)
        kwargs.setdefault("ortho_init", False)  # our layers keep torch's default init; the head is set below
        super().__init__(*args, **kwargs)

    def _build_mlp_extractor(self) -> None:
        shape = self.observation_space.shape
        assert shape is not None, "a tenant-set policy's observation space has a shape"
        self.anchored, self.contracted = set_layout_of(int(shape[0]), self.set_max_tenants)
        self.mlp_extractor = SetExtractor(  # type: ignore[assignment]
            self.set_hidden, self.set_max_tenants, self.set_activation, self.anchored, self.contracted)

    def _build(self, lr_schedule: Any) -> None:
        super()._build(lr_schedule)
        nvec = getattr(self.action_space, "nvec", None)
        if nvec is None or len(nvec) != self.set_max_tenants or len(set(nvec.tolist())) != 1:
            raise ValueError(
                f"TenantSetPolicy needs MultiDiscrete([c] * {self.set_max_tenants}), got {self.action_space}"
            )
        self.action_net = SlotHead(self.set_hidden, self.set_max_tenants, int(nvec[0]), self.set_hold_bias)
        self.action_dist = SlotCategorical(self.set_max_tenants, int(nvec[0]))
        self.optimizer = self.optimizer_class(  # type: ignore[call-arg]  # SB3's own call, with the new head
            self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs
        )

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(hidden=self.set_hidden, max_tenants=self.set_max_tenants, activation=self.set_activation,
                    hold_bias=self.set_hold_bias, factors=self.set_factors)
        return data
