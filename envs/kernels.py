"""The token-engine world compiled: the event loop of ``Simulation.advance`` with the token engine, the
admission core and the telemetry windows, as numba functions over arrays.

This is a transcription, not a second model. Every function here mirrors one in the Python world —
``TokenEngine`` (engine/token_engine.py), ``AdmissionCore`` (core/admission.py), ``TenantWindows``
(core/telemetry.py) and ``Simulation``'s event loop (envs/simulation.py) — and does the same arithmetic in
the same order, so that an episode gives bit-identical observations, counts and latencies
(tests/envs/test_compiled_world.py compares the two worlds value by value). Read the Python version for the
why; the comments here say only where the representation differs:

* A request is a row of two tables, ``ri`` (integers) and ``rf`` (floats), indexed by its position in
  arrival order. The engine's per-admission record (``_Seq``) lives in the same row (``ORDER``, ``SC``,
  ``SBLK``, ``SLOCK``, ``RUN``): a request has at most one live record, and a record is "alive" while
  ``RUN`` is set and its admission order is the one an entry names.
* Lists and deques are arrays with counters: the running requests in admission order (``run``, compacted
  on removal, as a dict keeps order), the partially prefilled ones (``part``), the engine's waiting deque
  (a ring buffer, ``wait``), the lockstep heap (``heap``, entries ``(key, order, request)``; keys and
  orders are unique pairs, so it pops in heapq's order).
* Each tenant's two admission queues (in contract, excess) and its four telemetry windows hold every
  request at most once, so each is a region of a flat array with a head and a tail: a window's region is
  the tenant's requests' count long, its in-contract queue's the count of its in-contract requests, and its
  excess queue's the rest (a request's class, ``ri[r, INC]``, is decided before the run).

The state is two tuples of arrays, ``E`` (engine) and ``S`` (the world around it), built by
``envs.compiled.CompiledSimulation``; the column and scalar names below index them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from admit.core.percentiles import linear_at
from numba import njit
from numba.typed import List

F = TypeVar("F", bound=Callable[..., Any])
_njit: Any = njit  # numba's stubs do not know _nrt


def kernel(fn: F) -> F:
    """A compiled function, cached on disk. ``_nrt=False``: the kernels allocate nothing, so numba's reference
    counting (an atomic add and subtract per array per call, most of the time before it was off) is left out."""
    return _njit(cache=True, _nrt=False)(fn)


def inlined(fn: F) -> F:
    """``kernel``, inlined where it is called: a call that passes the state tuples costs more than these do."""
    return _njit(cache=True, _nrt=False, inline="always")(fn)

# ---- ri: per-request integers
TEN, PROMPT, OUT, COMP, GEN, PRE, ORDER, SC, SBLK, SLOCK, RUN, WDEC, INC = range(13)
NRI = 13  # INC: 1 when the request is in its tenant's contract (every request of a tenant without one)
# ---- rf: per-request floats
ARR, DISP, FSCHED, FTOK, FIN, QDL, QENQ, SFIN, USVC, RDY = range(10)
NRF = 10  # SFIN, USVC: the slot engine's planned finish and the request's service draw; RDY: when it leaves the
# token engine's front end for the waiting queue
# ---- ei: engine integer scalars
(E_BS, E_MNBT, E_MNS, E_NGB, E_G, E_N, E_A, E_SUMQ, E_ORDER, E_BUSY, E_K, E_EXPL, E_NRUN, E_NPART, E_WHEAD,
 E_WLEN, E_HLEN, E_NCH, E_STEPTOK, E_NPRE, E_GENTOT, E_PROMPTTOT, E_PREFILL, E_NSTEPS, E_NFIN, E_WMASK,
 E_KIND, E_SLOTS, E_DET, E_FHEAD, E_FTAIL) = range(31)
NEI = 31  # E_KIND: KIND_TOKEN or KIND_SLOT; E_SLOTS, E_DET: the slot engine's pool and deterministic flag;
# E_FHEAD, E_FTAIL: the token engine's front end, ``front[head:tail]`` (E[14]; each request enters it once)
KIND_TOKEN, KIND_SLOT = 0, 1
# ---- ef: engine float scalars (the step in flight, then the step-time coefficients)
(F_T0, F_END, F_BASE, F_SLOPE, F_OVER, F_FLOOR, F_PT, F_KNEE, F_PERSEQ, F_KV, F_PAIR, F_FLOOR_Q, F_INV_Q,
 F_MEAN, F_FRONT) = range(15)
NEF = 15  # F_FLOOR_Q = floor ** knee and F_INV_Q = 1 / knee, computed once (the same numbers every step);
# F_MEAN: the slot engine's mean service time; F_FRONT: the token engine's front-end delay
# ---- ai: per-tenant admission state
A_LIMIT, A_MAXQ, A_INFL, A_QH, A_QT, A_ADM, A_REJ, A_DROP, A_XH, A_XT = range(10)
NAI = 10  # A_QH, A_QT: the in-contract queue ``qbuf[head:tail]``; A_XH, A_XT: the excess queue
# ---- si / sf: world scalars
S_NEXT, S_QUEUED, S_NLATE, S_NREQ = range(4)
NSI = 6  # and the preemption ring's head and length
S_NOW, S_WIN = range(2)
NSF = 2
# S[17], S[18]: the preemption window's samples (time, counter), a ring of PW_CAP; S[4] holds its head/length
S_PWHEAD, S_PWLEN = 4, 5
PW_CAP = 4096
# ---- wi: per-tenant window heads and tails (absolute positions in the flat arrays), a dirty flag, the
# tenant's base in the completion arrays and how far (W_SHI) its sorted windows hold its completions
W_AH, W_AT, W_DH, W_DT, W_RH, W_RT, W_CH, W_CT, W_DIRTY, W_CB, W_SHI = range(11)
NWI = 11
# ---- wc: per-completion fields
C_T, C_E2E, C_TTFT, C_WAIT, C_TPOT, C_OUT, C_GOOD = range(7)
NWC = 7
# ---- wp: per-tenant objectives: the window's (as observed: NO_SLO for none), then the raw bounds
P_SLO_E2E, P_SLO_TTFT, P_REQ_TTFT, P_REQ_TPOT, P_REQ_E2E, P_B_TTFT, P_B_TPOT, P_B_E2E, P_V_E2E, P_V_TTFT = range(10)
NWP = 10
# ---- tot: per-tenant episode counts (TenantTotals' integer fields)
T_ARRIVED, T_COMPLETED, T_DROPPED, T_REJECTED, T_VIOL, T_GOOD, T_OUT = range(7)
NTOT = 7
# ---- ctot (S[22]): per-tenant episode counts of its in-contract requests (``ri[r, INC]``; every request of a
# tenant without a contract): arrived, good, and missed (rejected, dropped, or completed but not good). Added as
# the 0/1 class, without a branch, so a scenario without contracts pays one add per event and reads nothing back
CT_ARRIVED, CT_GOOD, CT_MISSED = range(3)
NCT = 3
# per-tenant window summary: 4 counts, then the 17 cached percentile-derived values
NSUMMARY = 21
NCACHE = 17
N_GLOBAL = 5
N_TENANT = 27

# ====================================================================================== token engine


@inlined
def step_time(ef, dense_table, tokens, seqs, kv_read, pairs):
    dense = dense_table[tokens]
    if math.isnan(dense):  # StepTimeModel.dense, computed once per token count (it depends on nothing else)
        dense = (ef[F_FLOOR_Q] + (ef[F_PT] * tokens) ** ef[F_KNEE]) ** ef[F_INV_Q]
        dense_table[tokens] = dense
    return ef[F_OVER] + dense + ef[F_PERSEQ] * seqs + ef[F_KV] * kv_read + ef[F_PAIR] * pairs


@inlined
def _heap_less(heap, i, j):
    if heap[i, 0] != heap[j, 0]:
        return heap[i, 0] < heap[j, 0]
    return heap[i, 1] < heap[j, 1]


@inlined
def _heap_swap(heap, i, j):
    for c in range(3):
        tmp = heap[i, c]
        heap[i, c] = heap[j, c]
        heap[j, c] = tmp


@inlined
def heap_push(E, key, order, r):
    ei = E[2]
    heap = E[7]
    n = ei[E_HLEN]
    if n >= heap.shape[0]:
        raise RuntimeError("compiled token engine: lockstep heap overflow (bug)")
    heap[n, 0] = key
    heap[n, 1] = order
    heap[n, 2] = r
    ei[E_HLEN] = n + 1
    i = n
    while i > 0:
        p = (i - 1) // 2
        if _heap_less(heap, i, p):
            _heap_swap(heap, i, p)
            i = p
        else:
            break


@inlined
def heap_pop(E):
    """Remove the smallest entry; returns its request index."""
    ei = E[2]
    heap = E[7]
    r = heap[0, 2]
    n = ei[E_HLEN] - 1
    ei[E_HLEN] = n
    if n > 0:
        for c in range(3):
            heap[0, c] = heap[n, c]
        i = 0
        while True:
            lft = 2 * i + 1
            if lft >= n:
                break
            m = lft
            if lft + 1 < n and _heap_less(heap, lft + 1, lft):
                m = lft + 1
            if _heap_less(heap, m, i):
                _heap_swap(heap, m, i)
                i = m
            else:
                break
    return r


@inlined
def _heap_top_live(E):
    """Whether the heap's smallest entry names a request still in lockstep under that admission."""
    ri = E[0]
    heap = E[7]
    r = heap[0, 2]
    return ri[r, SLOCK] == 1 and ri[r, ORDER] == heap[0, 1]


@inlined
def lock_blocks(E, x):
    ei = E[2]
    cnt = E[8]
    if ei[E_N] == 0:
        return 0
    bs = ei[E_BS]
    q = x // bs
    rem = x % bs
    s = 0
    if rem:
        for j in range(bs - rem, bs):
            s += cnt[j]
    return ei[E_SUMQ] + ei[E_N] * q + s


@inlined
def lock_add(E, r, tokens):
    ri = E[0]
    ei = E[2]
    cnt = E[8]
    bs = ei[E_BS]
    c = tokens - ei[E_G]
    ri[r, SC] = c
    ri[r, SLOCK] = 1
    u = c + bs - 1
    ei[E_SUMQ] += u // bs
    cnt[u % bs] += 1
    ei[E_N] += 1
    ei[E_A] += c
    ei[E_EXPL] -= ri[r, SBLK]
    heap_push(E, ri[r, OUT] + ri[r, PROMPT] - c, ri[r, ORDER], r)


@inlined
def lock_remove(E, r):
    ri = E[0]
    ei = E[2]
    cnt = E[8]
    bs = ei[E_BS]
    u = ri[r, SC] + bs - 1
    ei[E_SUMQ] -= u // bs
    cnt[u % bs] -= 1
    ei[E_N] -= 1
    ei[E_A] -= ri[r, SC]
    ri[r, SLOCK] = 0


@inlined
def materialize(E, r, g):
    ri = E[0]
    tokens = ri[r, SC] + g
    ri[r, COMP] = tokens - 1
    ri[r, GEN] = tokens - ri[r, PROMPT]


@inlined
def _part_remove(E, r):
    ei = E[2]
    part = E[5]
    n = ei[E_NPART]
    for i in range(n):
        if part[i] == r:
            for j in range(i, n - 1):
                part[j] = part[j + 1]
            ei[E_NPART] = n - 1
            return
    raise RuntimeError("compiled token engine: request not among the partial prefills (bug)")


@inlined
def _run_remove(E, r):
    ri = E[0]
    ei = E[2]
    run = E[4]
    n = ei[E_NRUN]
    for i in range(n):
        if run[i] == r:
            for j in range(i, n - 1):
                run[j] = run[j + 1]
            ei[E_NRUN] = n - 1
            ri[r, RUN] = 0
            return
    raise RuntimeError("compiled token engine: request not running (bug)")


@inlined
def release(E, r):
    """``TokenEngine._release``; the caller has removed ``r`` from the running list."""
    ri = E[0]
    ei = E[2]
    if ri[r, SLOCK] == 1:
        materialize(E, r, ei[E_G])
        lock_remove(E, r)
    else:
        ei[E_EXPL] -= ri[r, SBLK]
        _part_remove(E, r)
    ri[r, SBLK] = 0


@inlined
def _wait_append(E, r):
    ei = E[2]
    wait = E[6]
    ei[E_WLEN] += 1
    wait[(ei[E_WHEAD] + ei[E_WLEN] - 1) & ei[E_WMASK]] = r


@inlined
def _wait_appendleft(E, r):
    ei = E[2]
    wait = E[6]
    ei[E_WHEAD] = (ei[E_WHEAD] - 1) & ei[E_WMASK]
    ei[E_WLEN] += 1
    wait[ei[E_WHEAD]] = r


@inlined
def _wait_popleft(E):
    ei = E[2]
    wait = E[6]
    r = wait[ei[E_WHEAD]]
    ei[E_WHEAD] = (ei[E_WHEAD] + 1) & ei[E_WMASK]
    ei[E_WLEN] -= 1
    return r


@inlined
def submit(E, r, now):
    """``TokenEngine.submit`` (the request was checked when the world was built)."""
    rf = E[1]
    ei = E[2]
    ef = E[3]
    if math.isnan(rf[r, DISP]):
        rf[r, DISP] = now
    if ef[F_FRONT] > 0:
        rf[r, RDY] = now + ef[F_FRONT]
        E[14][ei[E_FTAIL]] = r
        ei[E_FTAIL] += 1
    else:
        _enter(E, r, now)


@inlined
def _enter(E, r, now):
    """``TokenEngine._enter``."""
    ei = E[2]
    ef = E[3]
    _wait_append(E, r)
    if ei[E_BUSY]:
        advance_to(E, now)
        truncate(E)
    else:
        ei[E_BUSY] = 1
        ei[E_K] = 0
        ef[F_T0] = now
        ef[F_END] = now


@inlined
def kv_blocks_used(E):
    ei = E[2]
    in_flight = 1 if (ei[E_BUSY] and ei[E_K] > 0) else 0
    return ei[E_EXPL] + lock_blocks(E, ei[E_G] - 1 + in_flight)


@inlined
def _admit(E, now, budget, free, tokens, pairs):
    ri = E[0]
    rf = E[1]
    ei = E[2]
    run = E[4]
    part = E[5]
    wait = E[6]
    chunks = E[9]
    bs = ei[E_BS]
    while ei[E_WLEN] > 0 and budget > 0 and ei[E_NRUN] < ei[E_MNS]:
        r = wait[ei[E_WHEAD]]
        chunk = min(ri[r, PROMPT] + ri[r, GEN], budget)
        nb = -(-chunk // bs)
        if nb > free:
            break
        _wait_popleft(E)
        ei[E_ORDER] += 1
        ri[r, ORDER] = ei[E_ORDER]
        ri[r, SC] = 0
        ri[r, SLOCK] = 0
        ri[r, SBLK] = nb
        ri[r, RUN] = 1
        run[ei[E_NRUN]] = r
        ei[E_NRUN] += 1
        part[ei[E_NPART]] = r
        ei[E_NPART] += 1
        ei[E_EXPL] += nb
        free -= nb
        budget -= chunk
        nc = ei[E_NCH]
        chunks[nc, 0] = r
        chunks[nc, 1] = ri[r, ORDER]
        chunks[nc, 2] = chunk
        ei[E_NCH] = nc + 1
        tokens += chunk
        pairs += chunk * (chunk + 1) / 2.0
        if math.isnan(rf[r, FSCHED]):
            rf[r, FSCHED] = now
    return tokens, pairs


@inlined
def _macro_length(E):
    ei = E[2]
    heap = E[7]
    while not _heap_top_live(E):
        heap_pop(E)
    G = ei[E_G]
    k = heap[0, 0] - G
    cap = ei[E_NGB] - ei[E_EXPL]
    if lock_blocks(E, G) + ei[E_N] * ((k - 1) // ei[E_BS] + 1) <= cap:
        return k
    lo = 1
    hi = k
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if lock_blocks(E, G + mid - 1) <= cap:
            lo = mid
        else:
            hi = mid - 1
    return lo


@inlined
def _start(E, now, dt, k, tokens):
    ei = E[2]
    ef = E[3]
    ef[F_T0] = now
    ef[F_BASE] = dt
    ef[F_SLOPE] = ef[F_KV] * ei[E_N] if k > 1 else 0.0
    ei[E_K] = k
    ef[F_END] = now + k * dt + ef[F_SLOPE] * (k * (k - 1) / 2.0)
    ei[E_STEPTOK] = tokens


@inlined
def schedule(E, now):
    ri = E[0]
    ei = E[2]
    ef = E[3]
    part = E[5]
    chunks = E[9]
    plan = E[10]
    bs = ei[E_BS]
    G = ei[E_G]
    n = ei[E_N]
    budget = ei[E_MNBT] - n
    held = lock_blocks(E, G - 1)
    free = ei[E_NGB] - ei[E_EXPL] - held
    need = lock_blocks(E, G) - held
    nplan = 0
    for i in range(ei[E_NPART]):
        r = part[i]
        chunk = min(ri[r, PROMPT] + ri[r, GEN] - ri[r, COMP], budget)
        if chunk <= 0:
            break
        nb = -(-(ri[r, COMP] + chunk) // bs) - ri[r, SBLK]
        plan[nplan, 0] = r
        plan[nplan, 1] = chunk
        plan[nplan, 2] = nb
        nplan += 1
        need += nb
        budget -= chunk
    if need > free:
        _schedule_exact(E, now)
        return
    free -= need
    tokens = n
    pairs = 0.0
    ei[E_NCH] = 0
    for i in range(nplan):
        r = plan[i, 0]
        chunk = plan[i, 1]
        nb = plan[i, 2]
        ri[r, SBLK] += nb
        ei[E_EXPL] += nb
        nc = ei[E_NCH]
        chunks[nc, 0] = r
        chunks[nc, 1] = ri[r, ORDER]
        chunks[nc, 2] = chunk
        ei[E_NCH] = nc + 1
        tokens += chunk
        pairs += chunk * (ri[r, COMP] + (chunk + 1) / 2.0)
    tokens, pairs = _admit(E, now, budget, free, tokens, pairs)
    kv = ei[E_A] + n * G
    dt = step_time(ef, E[13], tokens, n + ei[E_NCH], kv, pairs)
    if tokens == 0:
        raise RuntimeError("token engine scheduled an empty step (bug)")
    k = 1
    if ei[E_NCH] == 0:
        k = _macro_length(E)
    _start(E, now, dt, k, tokens)


@inlined
def _preempt(E, r):
    ri = E[0]
    ei = E[2]
    part = E[5]
    _run_remove(E, r)
    ei[E_EXPL] -= ri[r, SBLK]
    ri[r, SBLK] = 0
    for i in range(ei[E_NPART]):
        if part[i] == r:
            _part_remove(E, r)
            break
    ri[r, COMP] = 0
    ri[r, PRE] += 1
    ei[E_NPRE] += 1
    _wait_appendleft(E, r)


@kernel
def _schedule_exact(E, now):
    ri = E[0]
    ei = E[2]
    ef = E[3]
    run = E[4]
    part = E[5]
    cnt = E[8]
    chunks = E[9]
    plan = E[10]
    scratch = E[12]
    bs = ei[E_BS]
    G = ei[E_G]
    nrun = ei[E_NRUN]
    for i in range(nrun):
        r = run[i]
        if ri[r, SLOCK] == 1:
            ri[r, WDEC] = 1
            materialize(E, r, G)
            ri[r, SBLK] = -(-ri[r, COMP] // bs)
            ri[r, SLOCK] = 0
            ei[E_EXPL] += ri[r, SBLK]
        else:
            ri[r, WDEC] = 0
    ei[E_N] = 0
    ei[E_A] = 0
    ei[E_SUMQ] = 0
    cnt[:] = 0
    ei[E_HLEN] = 0
    # run = list(self._running.values()): a copy that preemption pops from the end
    for i in range(nrun):
        scratch[i] = run[i]
    nlist = nrun
    free = ei[E_NGB] - ei[E_EXPL]
    budget = ei[E_MNBT]
    preempted = False
    nsched = 0  # sched[j] = (request, tokens) in plan
    i = 0
    while i < nlist and budget > 0:
        r = scratch[i]
        ntok = min(ri[r, PROMPT] + ri[r, GEN] - ri[r, COMP], budget)
        nb = -(-(ri[r, COMP] + ntok) // bs) - ri[r, SBLK]
        gone = False
        while nb > free:
            nlist -= 1
            victim = scratch[nlist]
            free += ri[victim, SBLK]
            _preempt(E, victim)
            preempted = True
            if victim == r:
                gone = True
                break
        if gone:
            break
        ri[r, SBLK] += nb
        ei[E_EXPL] += nb
        free -= nb
        budget -= ntok
        plan[nsched, 0] = r
        plan[nsched, 1] = ntok
        nsched += 1
        i += 1
    tokens = 0
    pairs = 0.0
    kv = 0
    ei[E_NCH] = 0
    for j in range(nsched):
        r = plan[j, 0]
        ntok = plan[j, 1]
        tokens += ntok
        if ri[r, WDEC] == 1:
            kv += ri[r, COMP] + 1
            lock_add(E, r, ri[r, COMP] + 1)
        else:
            pairs += ntok * (ri[r, COMP] + (ntok + 1) / 2.0)
            nc = ei[E_NCH]
            chunks[nc, 0] = r
            chunks[nc, 1] = ri[r, ORDER]
            chunks[nc, 2] = ntok
            ei[E_NCH] = nc + 1
    npart = 0
    for j in range(ei[E_NRUN]):
        r = run[j]
        if ri[r, SLOCK] == 0:
            part[npart] = r
            npart += 1
    ei[E_NPART] = npart
    if not preempted:
        tokens, pairs = _admit(E, now, budget, free, tokens, pairs)
    dt = step_time(ef, E[13], tokens, ei[E_N] + ei[E_NCH], kv, pairs)
    _start(E, now, dt, 1, tokens)


@inlined
def _cum(ef, j):
    return j * ef[F_BASE] + ef[F_SLOPE] * (j * (j - 1) / 2.0)


@inlined
def commit_decodes(E, j):
    ei = E[2]
    ei[E_G] += j
    ei[E_GENTOT] += ei[E_N] * j
    ei[E_NSTEPS] += j


@inlined
def advance_to(E, t):
    ei = E[2]
    ef = E[3]
    k = ei[E_K]
    if k <= 1:
        return
    d = t - ef[F_T0]
    if d < ef[F_BASE]:
        return
    slope = ef[F_SLOPE]
    if slope > 0:
        b = ef[F_BASE] - slope / 2.0
        j = int((-b + math.sqrt(b * b + 2.0 * slope * d)) / slope)
    else:
        j = int(d / ef[F_BASE])
    j = min(max(j, 0), k - 1)
    while j < k - 1 and _cum(ef, j + 1) <= d:
        j += 1
    while j > 0 and _cum(ef, j) > d:
        j -= 1
    if j == 0:
        return
    commit_decodes(E, j)
    ef[F_T0] += _cum(ef, j)
    ef[F_BASE] += slope * j
    ei[E_K] = k - j


@inlined
def truncate(E):
    ei = E[2]
    ef = E[3]
    if ei[E_K] > 1:
        ei[E_K] = 1
        ef[F_END] = ef[F_T0] + ef[F_BASE]
        ef[F_SLOPE] = 0.0


@inlined
def _end_step(E, now):
    """Writes the finished requests to ``fin``; returns how many."""
    ri = E[0]
    rf = E[1]
    ei = E[2]
    heap = E[7]
    chunks = E[9]
    fin = E[11]
    commit_decodes(E, ei[E_K])
    ei[E_K] = 0
    nfin = 0
    G = ei[E_G]
    while ei[E_HLEN] > 0 and heap[0, 0] <= G:
        live = _heap_top_live(E)
        r = heap_pop(E)
        if not live:
            continue
        _run_remove(E, r)
        release(E, r)
        rf[r, FIN] = now
        fin[nfin] = r
        nfin += 1
    for i in range(ei[E_NCH]):
        r = chunks[i, 0]
        if ri[r, RUN] == 0 or ri[r, ORDER] != chunks[i, 1]:
            continue
        chunk = chunks[i, 2]
        ri[r, COMP] += chunk
        ei[E_PREFILL] += chunk
        tokens = ri[r, PROMPT] + ri[r, GEN]
        if ri[r, COMP] < tokens:
            continue
        ri[r, GEN] += 1
        ei[E_GENTOT] += 1
        if math.isnan(rf[r, FTOK]):
            rf[r, FTOK] = now
            ei[E_PROMPTTOT] += ri[r, PROMPT]
        if ri[r, GEN] >= ri[r, OUT]:
            _run_remove(E, r)
            release(E, r)
            rf[r, FIN] = now
            fin[nfin] = r
            nfin += 1
        else:
            _part_remove(E, r)
            lock_add(E, r, tokens + 1)
    ei[E_NCH] = 0
    return nfin


@inlined
def process_event(E, now):
    """``TokenEngine.process_event``."""
    ei = E[2]
    if ei[E_FTAIL] == ei[E_FHEAD]:
        return _step_event(E, now)
    nfin = _step_event(E, now) if E[3][F_END] <= now else 0
    front = E[14]
    rf = E[1]
    while ei[E_FTAIL] > ei[E_FHEAD] and rf[front[ei[E_FHEAD]], RDY] <= now:
        _enter(E, front[ei[E_FHEAD]], now)
        ei[E_FHEAD] += 1
    return nfin


@inlined
def _step_event(E, now):
    ei = E[2]
    ef = E[3]
    if not ei[E_BUSY]:
        return 0
    nfin = _end_step(E, now) if ei[E_K] > 0 else 0
    if ei[E_NRUN] > 0 or ei[E_WLEN] > 0:
        schedule(E, now)
    else:
        ei[E_BUSY] = 0
        ei[E_K] = 0
        ef[F_END] = math.inf
    return nfin


@inlined
def sync(E, now):
    if E[2][E_BUSY]:
        advance_to(E, now)


# ====================================================================================== slot engine
# SlotEngine (engine/slot_engine.py): a pool of E_SLOTS identical slots. Busy slots are a heap of requests
# (in ``heap[:, 0]``) ordered by (planned finish, request index), heapq's order on (finish time, rid); the
# requests waiting for a slot are the engine's waiting ring. ``ef[F_END]`` is the next finish (or inf), so the
# event loop reads both engines alike.


@inlined
def _slot_less(rf, heap, i, j):
    a = heap[i, 0]
    b = heap[j, 0]
    if rf[a, SFIN] != rf[b, SFIN]:
        return rf[a, SFIN] < rf[b, SFIN]
    return a < b


@inlined
def _slot_swap(heap, i, j):
    tmp = heap[i, 0]
    heap[i, 0] = heap[j, 0]
    heap[j, 0] = tmp


@inlined
def _slot_next(E):
    E[3][F_END] = E[1][E[7][0, 0], SFIN] if E[2][E_HLEN] > 0 else math.inf


@inlined
def _slot_start(E, r, now):
    """``SlotEngine._start``: the request takes a slot; its first token is now, its finish ``now + service``."""
    rf = E[1]
    ei = E[2]
    ef = E[3]
    heap = E[7]
    rf[r, FTOK] = now
    service = ef[F_MEAN] if ei[E_DET] else -ef[F_MEAN] * math.log(1.0 - rf[r, USVC])  # inverse transform
    rf[r, SFIN] = now + service
    n = ei[E_HLEN]
    heap[n, 0] = r
    ei[E_HLEN] = n + 1
    i = n
    while i > 0:
        p = (i - 1) // 2
        if _slot_less(rf, heap, i, p):
            _slot_swap(heap, i, p)
            i = p
        else:
            break
    _slot_next(E)


@inlined
def slot_submit(E, r, now):
    E[1][r, DISP] = now
    if E[2][E_HLEN] < E[2][E_SLOTS]:
        _slot_start(E, r, now)
    else:
        _wait_append(E, r)


@inlined
def slot_process_event(E, now):
    """``SlotEngine.process_event``: the request with the earliest finish leaves its slot (``fin[0]``) and
    the longest-waiting request, if any, takes it."""
    ri = E[0]
    rf = E[1]
    ei = E[2]
    heap = E[7]
    r = heap[0, 0]
    n = ei[E_HLEN] - 1
    ei[E_HLEN] = n
    if n > 0:
        heap[0, 0] = heap[n, 0]
        i = 0
        while True:
            c = 2 * i + 1
            if c >= n:
                break
            if c + 1 < n and _slot_less(rf, heap, c + 1, c):
                c += 1
            if _slot_less(rf, heap, c, i):
                _slot_swap(heap, c, i)
                i = c
            else:
                break
    rf[r, FIN] = now
    ri[r, GEN] = ri[r, OUT]
    E[11][0] = r
    if ei[E_WLEN] > 0:
        _slot_start(E, _wait_popleft(E), now)
    else:
        _slot_next(E)
    return 1


@inlined
def engine_submit(E, r, now):
    if E[2][E_KIND] == KIND_SLOT:
        slot_submit(E, r, now)
    else:
        submit(E, r, now)


@inlined
def engine_next(E):
    """``next_event_time``: the step's end, or sooner a request leaving the token engine's front end."""
    ei = E[2]
    te = E[3][F_END]
    if ei[E_FTAIL] > ei[E_FHEAD]:
        t = E[1][E[14][ei[E_FHEAD]], RDY]
        if t < te:
            return t
    return te


@inlined
def engine_event(E, now):
    if E[2][E_KIND] == KIND_SLOT:
        return slot_process_event(E, now)
    return process_event(E, now)


# ====================================================================================== admission core


@inlined
def next_deadline(S, ri, rf):
    ai = S[0]
    qbuf = S[2]
    si = S[4]
    if si[S_NLATE] > 0:
        return -math.inf
    best = math.inf
    if si[S_QUEUED] == 0:
        return best
    for k in range(ai.shape[0]):
        if ai[k, A_QT] > ai[k, A_QH]:
            d = rf[qbuf[ai[k, A_QH]], QDL]
            if d < best:
                best = d
        if ai[k, A_XT] > ai[k, A_XH]:
            d = rf[qbuf[ai[k, A_XH]], QDL]
            if d < best:
                best = d
    return best


@inlined
def _dispatch_one(S, rf, k, now):
    """``AdmissionCore._dispatch_one``: the request index dispatched, or -1."""
    ai = S[0]
    qbuf = S[2]
    late = S[3]
    si = S[4]
    for head, tail in ((A_QH, A_QT), (A_XH, A_XT)):
        while ai[k, tail] > ai[k, head]:
            r = qbuf[ai[k, head]]
            ai[k, head] += 1
            si[S_QUEUED] -= 1
            if rf[r, QDL] < now:
                ai[k, A_DROP] += 1
                late[si[S_NLATE]] = r
                si[S_NLATE] += 1
                continue
            ai[k, A_INFL] += 1
            ai[k, A_ADM] += 1
            return r
    return -1


@inlined
def _queued(ai, k):
    """Items in tenant ``k``'s two queues together."""
    return ai[k, A_QT] - ai[k, A_QH] + ai[k, A_XT] - ai[k, A_XH]


@inlined
def _dispatch(E, S, r):
    """``Simulation._dispatch``: a request leaves the admission queue for the engine."""
    ri = E[0]
    rf = E[1]
    now = S[5][S_NOW]
    S[14][ri[r, TEN]] -= ri[r, PROMPT]
    rf[r, DISP] = now
    engine_submit(E, r, now)


@kernel
def set_limit(E, S, k, limit):
    """``AdmissionCore.set_limit`` and the dispatches it causes (``Simulation.apply_deltas``)."""
    ai = S[0]
    ai[k, A_LIMIT] = limit
    if _queued(ai, k) > 0 and ai[k, A_INFL] < limit:
        now = S[5][S_NOW]
        while ai[k, A_INFL] < limit:
            r = _dispatch_one(S, E[1], k, now)
            if r < 0:
                break
            _dispatch(E, S, r)


# ====================================================================================== the event loop


@inlined
def _window_push(times, wi, k, tail, t):
    """Append timestamp ``t`` to tenant ``k``'s event window whose tail is column ``tail`` of ``wi``."""
    times[wi[k, tail]] = t
    wi[k, tail] += 1


@inlined
def _window_prune(times, wi, k, head, tail, cutoff):
    """Drop tenant ``k``'s events at or before ``cutoff`` from the window with columns ``head``, ``tail``."""
    while wi[k, tail] > wi[k, head] and times[wi[k, head]] <= cutoff:
        wi[k, head] += 1


@inlined
def _drop(S, ri, r, t):
    wi = S[6]
    wd = S[8]
    tot = S[13]
    qtok = S[14]
    k = ri[r, TEN]
    qtok[k] -= ri[r, PROMPT]
    tot[k, T_DROPPED] += 1
    S[22][k, CT_MISSED] += ri[r, INC]
    _window_push(wd, wi, k, W_DT, t)


@kernel
def _expire(S, ri, rf):
    ai = S[0]
    qbuf = S[2]
    late = S[3]
    si = S[4]
    sf = S[5]
    now = sf[S_NOW]
    for j in range(si[S_NLATE]):
        _drop(S, ri, late[j], now)
    si[S_NLATE] = 0
    for k in range(ai.shape[0]):
        for head, tail in ((A_QH, A_QT), (A_XH, A_XT)):
            while ai[k, tail] > ai[k, head] and rf[qbuf[ai[k, head]], QDL] <= now:
                r = qbuf[ai[k, head]]
                ai[k, head] += 1
                si[S_QUEUED] -= 1
                ai[k, A_DROP] += 1
                _drop(S, ri, r, now)


@inlined
def _arrive(E, S, r, t):
    ri = E[0]
    rf = E[1]
    ai = S[0]
    af = S[1]
    qbuf = S[2]
    si = S[4]
    sf = S[5]
    wi = S[6]
    wa = S[7]
    wr = S[9]
    tot = S[13]
    qtok = S[14]
    k = ri[r, TEN]
    tot[k, T_ARRIVED] += 1
    S[22][k, CT_ARRIVED] += ri[r, INC]
    _window_push(wa, wi, k, W_AT, t)
    # AdmissionCore.offer
    depth = _queued(ai, k)
    if ai[k, A_INFL] < ai[k, A_LIMIT] and depth == 0:
        ai[k, A_INFL] += 1
        ai[k, A_ADM] += 1
        rf[r, DISP] = t
        engine_submit(E, r, t)
    elif depth >= ai[k, A_MAXQ]:
        ai[k, A_REJ] += 1
        tot[k, T_REJECTED] += 1
        S[22][k, CT_MISSED] += ri[r, INC]
        _window_push(wr, wi, k, W_RT, t)
    else:
        now = sf[S_NOW]
        rf[r, QDL] = now + af[k]
        rf[r, QENQ] = now
        tail = A_QT if ri[r, INC] else A_XT
        qbuf[ai[k, tail]] = r
        ai[k, tail] += 1
        si[S_QUEUED] += 1
        qtok[k] += ri[r, PROMPT]


@inlined
def _finish(E, S, r, t):
    ri = E[0]
    rf = E[1]
    ai = S[0]
    sf = S[5]
    wi = S[6]
    wc = S[10]
    wp = S[11]
    tot = S[13]
    k = ri[r, TEN]
    arrival = rf[r, ARR]
    e2e = t - arrival
    ttft = rf[r, FTOK] - arrival
    out = ri[r, OUT]
    per_token = (e2e - ttft) / (out - 1) if out > 1 else 0.0
    tot[k, T_COMPLETED] += 1
    tot[k, T_OUT] += out
    good = ttft <= wp[k, P_B_TTFT] and per_token <= wp[k, P_B_TPOT] and e2e <= wp[k, P_B_E2E]
    if good:
        tot[k, T_GOOD] += 1
        S[22][k, CT_GOOD] += ri[r, INC]
    else:
        S[22][k, CT_MISSED] += ri[r, INC]
    if e2e > wp[k, P_V_E2E] or ttft > wp[k, P_V_TTFT]:
        tot[k, T_VIOL] += 1
    c = wi[k, W_CT]
    wc[c, C_T] = t
    wc[c, C_E2E] = e2e
    wc[c, C_TTFT] = ttft
    wc[c, C_WAIT] = rf[r, DISP] - arrival
    wc[c, C_TPOT] = per_token
    wc[c, C_OUT] = out
    wc[c, C_GOOD] = 1.0 if good else 0.0
    wi[k, W_CT] = c + 1  # the sorted windows take it in at the next summary (_sync_window)
    # AdmissionCore.release
    if ai[k, A_INFL] <= 0:
        raise RuntimeError("release() with nothing in flight (bug)")
    ai[k, A_INFL] -= 1
    if _queued(ai, k) > 0 and ai[k, A_INFL] < ai[k, A_LIMIT]:
        nxt = _dispatch_one(S, rf, k, sf[S_NOW])
        if nxt >= 0:
            _dispatch(E, S, nxt)


@kernel
def advance(E, S, arrivals, until):
    """``Simulation.advance``: run the world to ``until``."""
    ri = E[0]
    rf = E[1]
    fin = E[11]
    si = S[4]
    sf = S[5]
    n = si[S_NREQ]
    i = si[S_NEXT]
    inf = math.inf
    ta = arrivals[i] if i < n else inf
    while True:
        te = engine_next(E)
        td = next_deadline(S, ri, rf)
        t = ta if ta < te else te
        if td < t:
            t = td
        if t > until:
            break
        if t < sf[S_NOW]:
            t = sf[S_NOW]
        sf[S_NOW] = t
        if te <= ta and te <= td:
            nfin = engine_event(E, t)
            for j in range(nfin):
                _finish(E, S, fin[j], t)
        elif td <= ta:
            _expire(S, ri, rf)
        else:
            r = i
            i += 1
            si[S_NEXT] = i
            ta = arrivals[i] if i < n else inf
            _arrive(E, S, r, t)
    sf[S_NOW] = until


# ====================================================================================== observation


_linear_at = inlined(linear_at)  # core/percentiles.py's, compiled: the Python windows' arithmetic


@inlined
def _p3(v, lo, n, out, at):
    """``p50_p95_p99`` of the sorted ``v[lo:lo + n]`` (two or more) into ``out[at:at + 3]``."""
    out[at] = _linear_at(v, lo, n, 0.5)
    out[at + 1] = _linear_at(v, lo, n, 0.95)
    out[at + 2] = _linear_at(v, lo, n, 0.99)


@inlined
def _sort_pairs(v, ids, lo, n):
    """Sort ``v[lo:lo + n]`` in place, ascending, moving ``ids[lo:lo + n]`` along: insertion sort for a few
    values, heapsort beyond (numba's own sort allocates, and these kernels run without its allocator)."""
    if n <= 24:
        for i in range(lo + 1, lo + n):
            x = v[i]
            y = ids[i]
            j = i - 1
            while j >= lo and v[j] > x:
                v[j + 1] = v[j]
                ids[j + 1] = ids[j]
                j -= 1
            v[j + 1] = x
            ids[j + 1] = y
        return
    for start in range(n // 2 - 1, -1, -1):
        _sift_down(v, ids, lo, start, n)
    for end in range(n - 1, 0, -1):
        _swap_pair(v, ids, lo, lo + end)
        _sift_down(v, ids, lo, 0, end)


@inlined
def _swap_pair(v, ids, i, j):
    x = v[i]
    v[i] = v[j]
    v[j] = x
    y = ids[i]
    ids[i] = ids[j]
    ids[j] = y


@inlined
def _sift_down(v, ids, lo, i, n):
    while True:
        c = 2 * i + 1
        if c >= n:
            return
        if c + 1 < n and v[lo + c + 1] > v[lo + c]:
            c += 1
        if v[lo + c] > v[lo + i]:
            _swap_pair(v, ids, lo + i, lo + c)
            i = c
        else:
            return


@kernel
def _sync_window(wi, wc, ws, wid, sv, sid, wsum, k, cutoff):
    """Bring tenant ``k``'s completion window up to ``cutoff``: drop the completions at or before it and take
    the ones finished since the last summary into the sorted windows.

    The sorted windows hold the completions ``[W_CH, W_SHI)``: ``ws[f, base:base + W_SHI - W_CH]`` their e2e,
    TTFT, wait and TPOT values in value order, ``wid`` beside them the completion each value is from. A
    summary reads percentiles off them instead of sorting (``TenantWindows.summary`` sorts the same values:
    the same multiset, the same order statistics). Once per summary, per field: one pass keeps the values
    of completions still in the window (their ids are the ones at or past the new head), the newcomers'
    values are sorted (a decision's worth: a few) and merged in from the back. Returns whether the window
    changed."""
    head = wi[k, W_CH]
    tail = wi[k, W_CT]
    shi = wi[k, W_SHI]
    lo = head
    while lo < tail and wc[lo, C_T] <= cutoff:
        lo += 1
    if lo == head and shi == tail:
        return False
    base = wi[k, W_CB]
    if lo >= shi:  # every completion in the sorted windows leaves: the window is the newcomers still in it
        start = lo
        n_kept = 0
        wsum[k, 0] = 0
        wsum[k, 1] = 0
    else:
        start = shi
        n_kept = shi - lo
        for c in range(head, lo):
            wsum[k, 0] -= int(wc[c, C_OUT])
            wsum[k, 1] -= int(wc[c, C_GOOD])
    n_in = tail - start
    for c in range(start, tail):
        wsum[k, 0] += int(wc[c, C_OUT])
        wsum[k, 1] += int(wc[c, C_GOOD])
    for f in range(4):
        col = (C_E2E, C_TTFT, C_WAIT, C_TPOT)[f]
        v = ws[f]
        ids = wid[f]
        if n_kept and lo > head:  # keep the values of completions still in the window, in order
            w = base
            for i in range(base, base + shi - head):
                v[w] = v[i]
                ids[w] = ids[i]
                w += 1 if ids[i] >= lo else 0
        for j in range(n_in):
            sv[j] = wc[start + j, col]
            sid[j] = start + j
        _sort_pairs(sv, sid, 0, n_in)
        i = base + n_kept - 1  # merge the sorted newcomers in from the back
        j = n_in - 1
        w = base + n_kept + n_in - 1
        while j >= 0:
            if i >= base and v[i] > sv[j]:
                v[w] = v[i]
                ids[w] = ids[i]
                i -= 1
            else:
                v[w] = sv[j]
                ids[w] = sid[j]
                j -= 1
            w -= 1
    wi[k, W_CH] = lo
    wi[k, W_SHI] = tail
    return True


@kernel
def _window_summary(S, k, now, out, at):
    """``TenantWindows.summary`` of tenant ``k`` into ``out[at:at + 21]``."""
    sf = S[5]
    wi = S[6]
    wa = S[7]
    wd = S[8]
    wr = S[9]
    wc = S[10]
    wp = S[11]
    wcache = S[12]
    ws = S[15]
    wsum = S[16]
    w_s = sf[S_WIN]
    cutoff = now - w_s
    if _sync_window(wi, wc, ws, S[19], S[20], S[21], wsum, k, cutoff):
        wi[k, W_DIRTY] = 1
    _window_prune(wa, wi, k, W_AH, W_AT, cutoff)
    _window_prune(wd, wi, k, W_DH, W_DT, cutoff)
    _window_prune(wr, wi, k, W_RH, W_RT, cutoff)
    pct = wcache[k]
    if wi[k, W_DIRTY]:
        lo = wi[k, W_CH]
        n = wi[k, W_CT] - lo
        base = wi[k, W_CB]
        if n > 1:
            _p3(ws[0], base, n, pct, 0)
            _p3(ws[1], base, n, pct, 3)
            pct[6] = float(n)
            pct[7] = _linear_at(ws[2], base, n, 0.99)
            pct[8] = wp[k, P_SLO_E2E]
            pct[9] = wp[k, P_SLO_TTFT]
            pct[10] = wsum[k, 0] / w_s
            _p3(ws[3], base, n, pct, 11)  # tpot p50, p95 (overwritten next), p99
            pct[12] = pct[13]
            pct[13] = wsum[k, 1] / w_s
        elif n == 1:
            e = wc[lo, C_E2E]
            f = wc[lo, C_TTFT]
            p = wc[lo, C_TPOT]
            pct[0] = e
            pct[1] = e
            pct[2] = e
            pct[3] = f
            pct[4] = f
            pct[5] = f
            pct[6] = 1.0
            pct[7] = wc[lo, C_WAIT]
            pct[8] = wp[k, P_SLO_E2E]
            pct[9] = wp[k, P_SLO_TTFT]
            pct[10] = int(wc[lo, C_OUT]) / w_s
            pct[11] = p
            pct[12] = p
            pct[13] = wc[lo, C_GOOD] / w_s
        else:
            for j in range(8):
                pct[j] = 0.0
            pct[8] = wp[k, P_SLO_E2E]
            pct[9] = wp[k, P_SLO_TTFT]
            for j in range(10, 14):
                pct[j] = 0.0
        pct[14] = wp[k, P_REQ_TTFT]
        pct[15] = wp[k, P_REQ_TPOT]
        pct[16] = wp[k, P_REQ_E2E]
        wi[k, W_DIRTY] = 0
    out[at] = float(wi[k, W_AT] - wi[k, W_AH])
    out[at + 1] = float(wi[k, W_CT] - wi[k, W_CH])
    out[at + 2] = float(wi[k, W_DT] - wi[k, W_DH])
    out[at + 3] = float(wi[k, W_RT] - wi[k, W_RH])
    for j in range(NCACHE):
        out[at + 4 + j] = pct[j]


@kernel
def observe(E, S, out):
    """``Simulation.observe_values`` into ``out`` (5 + 27·tenants values), all but the preemption count
    (index 4, from the caller's window over ``ei[E_NPRE]``)."""
    ri = E[0]
    rf = E[1]
    ei = E[2]
    run = E[4]
    wait = E[6]
    ai = S[0]
    now = S[5][S_NOW]
    qtok = S[14]
    slot = ei[E_KIND] == KIND_SLOT
    if not slot:
        sync(E, now)
    nt = ai.shape[0]
    # TokenEngine.tenant_tokens: prefill and held per tenant, written straight into the tenant blocks
    base = N_GLOBAL
    for k in range(nt):
        out[base + k * N_TENANT + 25] = 0.0
        out[base + k * N_TENANT + 26] = 0.0
    g = ei[E_G]
    for j in range(0 if slot else ei[E_NRUN]):
        r = run[j]
        at = base + ri[r, TEN] * N_TENANT
        if ri[r, SLOCK] == 1:
            out[at + 26] += ri[r, SC] + g
        else:
            out[at + 26] += ri[r, PROMPT] + ri[r, GEN]
        if math.isnan(rf[r, FTOK]):
            out[at + 25] += ri[r, PROMPT]
    for j in range(ei[E_HLEN] if slot else 0):  # SlotEngine.tenant_tokens: a request in service holds its prompt
        out[base + ri[E[7][j, 0], TEN] * N_TENANT + 26] += ri[E[7][j, 0], PROMPT]
    for j in range(ei[E_WLEN]):
        r = wait[(ei[E_WHEAD] + j) & ei[E_WMASK]]
        at = base + ri[r, TEN] * N_TENANT
        out[at + 26] += ri[r, PROMPT] + ri[r, GEN]
        if math.isnan(rf[r, FTOK]):
            out[at + 25] += ri[r, PROMPT]
    for j in range(ei[E_FHEAD], ei[E_FTAIL]):  # in the front end: the whole prompt is still to be computed
        r = E[14][j]
        at = base + ri[r, TEN] * N_TENANT
        out[at + 26] += ri[r, PROMPT]
        out[at + 25] += ri[r, PROMPT]
    if slot:
        out[0] = ei[E_HLEN] / ei[E_SLOTS]
        out[1] = float(ei[E_HLEN])
    else:
        out[0] = kv_blocks_used(E) / ei[E_NGB]
        out[1] = float(ei[E_NRUN])
    out[2] = float(ei[E_WLEN])
    s = 0.0
    for k in range(nt):
        s += out[base + k * N_TENANT + 25]
    out[3] = s
    for k in range(nt):
        at = base + k * N_TENANT
        out[at] = float(_queued(ai, k))
        out[at + 1] = float(ai[k, A_INFL])
        out[at + 2] = float(ai[k, A_LIMIT])
        _window_summary(S, k, now, out, at + 3)
        out[at + 24] = qtok[k]


@kernel
def preemptions_in_window(S, now, total):
    """``PreemptionWindow.add(now, total)`` then ``.count(now)`` (core/telemetry.py), on a ring of samples."""
    si = S[4]
    pt = S[17]
    pv = S[18]
    w_s = S[5][S_WIN]
    mask = PW_CAP - 1
    if si[S_PWLEN] >= PW_CAP:
        raise RuntimeError("compiled world: more than 4096 observations inside one telemetry window")
    j = (si[S_PWHEAD] + si[S_PWLEN]) & mask
    pt[j] = now
    pv[j] = total
    si[S_PWLEN] += 1
    cutoff = now - w_s
    while si[S_PWLEN] > 1 and pt[(si[S_PWHEAD] + 1) & mask] <= cutoff:
        si[S_PWHEAD] = (si[S_PWHEAD] + 1) & mask
        si[S_PWLEN] -= 1
    if si[S_PWLEN] < 2:
        return 0.0
    base = pv[si[S_PWHEAD]]
    for i in range(si[S_PWLEN]):
        j = (si[S_PWHEAD] + i) & mask
        if pt[j] > cutoff:
            break
        base = pv[j]
    return max(0.0, pv[(si[S_PWHEAD] + si[S_PWLEN] - 1) & mask] - base)


@kernel
def observe_all(E, S, out):
    """``observe`` with the preemption count filled in: the whole observation vector."""
    observe(E, S, out)
    out[4] = preemptions_in_window(S, S[5][S_NOW], float(E[2][E_NPRE]))


# ---- agg: what one env step sums for the reward and the info dict (TenantAdmissionEnv.step)
(G_COMPLETED, G_GOOD, G_VIOL, G_LOST, G_W_COMPLETED, G_W_GOOD, G_W_VIOL, G_W_LOST, G_LIMIT_SUM, G_CHANGE, G_P99,
 G_NOW, G_CMISS, G_W_CMISS) = range(14)
NAGG = 14  # G_CMISS, G_W_CMISS: the interval's in-contract misses, plain and times the contract weights
OBS_E2E_P99 = 9  # a tenant's e2e p99 in its block of the observation (core/observation.TENANT_FEATURES)
FEATURE_MAX = 1.0e6  # core/observation.FEATURE_MAX


@kernel
def env_step(E, S, arrivals, action, offset, lo, hi, interval, horizon, weights, out, vec, taken, counts, limits,
             agg, cweights, ctaken):
    """One decision interval of ``TenantAdmissionEnv.step`` in one call.

    Each tenant's limit becomes ``clamp(limit + action[k] - offset, lo, hi)`` (``Limits.apply``; set where it
    changed, in tenant order, as ``Simulation.apply_deltas``); the world runs to ``min(now + interval,
    horizon)``; the observation values go to ``out`` and, as ``vector_from_values`` makes them (float32,
    clipped to [0, FEATURE_MAX], NaN kept), to ``vec``; the interval's counts (the episode totals minus
    ``taken``, which becomes the totals) to ``counts``; the new limits to ``limits``; and ``agg`` gets the sums
    the env's reward and info take (the ``G_`` names): the counts over tenants, plain and times ``weights``
    (summed in tenant order from 0, as Python's ``sum``), the limits' sum, the sum of their absolute changes,
    the largest tenant e2e p99 (the first of equals, as ``max``) and the time reached; and the interval's
    in-contract misses (``ctot``'s less ``ctaken``'s, which becomes them), plain and times ``cweights`` (each
    tenant's contract weight, 0 for a tenant without a contract)."""
    ai = S[0]
    tot = S[13]
    nt = ai.shape[0]
    lsum = 0
    change = 0
    for k in range(nt):
        cur = ai[k, A_LIMIT]
        new = cur + action[k] - offset
        new = lo if new < lo else hi if new > hi else new
        lsum += new
        change += abs(new - cur)
        limits[k] = new
        if new != cur:
            set_limit(E, S, k, new)
    until = min(S[5][S_NOW] + interval, horizon)
    advance(E, S, arrivals, until)
    observe_all(E, S, out)
    for j in range(out.shape[0]):
        x = np.float32(out[j])
        if not (x >= 0.0 or math.isnan(x)):  # np.maximum(x, 0), then np.minimum(x, FEATURE_MAX)
            x = np.float32(0.0)
        if not (x <= FEATURE_MAX or math.isnan(x)):
            x = np.float32(FEATURE_MAX)
        vec[j] = x
    for j in range(NAGG):
        agg[j] = 0.0
    p99 = out[N_GLOBAL + OBS_E2E_P99]
    for k in range(nt):
        for j in range(NTOT):
            counts[k, j] = tot[k, j] - taken[k, j]
            taken[k, j] = tot[k, j]
        w = weights[k]
        lost = counts[k, T_DROPPED] + counts[k, T_REJECTED]
        agg[G_COMPLETED] += counts[k, T_COMPLETED]
        agg[G_GOOD] += counts[k, T_GOOD]
        agg[G_VIOL] += counts[k, T_VIOL]
        agg[G_LOST] += lost
        agg[G_W_COMPLETED] += w * counts[k, T_COMPLETED]
        agg[G_W_GOOD] += w * counts[k, T_GOOD]
        agg[G_W_VIOL] += w * counts[k, T_VIOL]
        agg[G_W_LOST] += w * lost
        v = out[N_GLOBAL + k * N_TENANT + OBS_E2E_P99]
        if v > p99:
            p99 = v
    ctot = S[22]
    for k in range(nt):
        miss = ctot[k, CT_MISSED] - ctaken[k, CT_MISSED]
        for j in range(NCT):
            ctaken[k, j] = ctot[k, j]
        if cweights[k] != 0.0:
            agg[G_CMISS] += miss
            agg[G_W_CMISS] += cweights[k] * miss
    agg[G_LIMIT_SUM] = lsum
    agg[G_CHANGE] = change
    agg[G_P99] = p99
    agg[G_NOW] = S[5][S_NOW]


# ====================================================================================== rule policies
# The published study's rules and static caps as kernels (controllers/naive.py, differentiated.py, static.py):
# the same decisions from the same observation values, so that a whole episode of one of them runs in one call.
RULE_STATIC, RULE_NAIVE, RULE_DIFFERENTIATED = 0, 1, 2
END_EPS_S = 1e-9  # envs/simulation.END_EPS_S


@inlined
def _rule_deltas(rule, params, targets, k, out, deltas):
    """One decision of ``rule`` on the observation values ``out`` into ``deltas``.

    static: ``targets`` (one cap per tenant, or none: ``targets[0] < 0``) approached by at most ``k`` per
    decision; naive: ``params`` = (p99 threshold, memory high, memory low); differentiated: ``params`` =
    (p99 threshold, backlog high)."""
    nt = deltas.shape[0]
    if rule == RULE_STATIC:
        for i in range(nt):
            d = 0
            if targets[0] >= 0:
                d = int(targets[i] - out[N_GLOBAL + i * N_TENANT + 2])
                d = -k if d < -k else k if d > k else d
            deltas[i] = d
    elif rule == RULE_NAIVE:
        p99 = out[N_GLOBAL + OBS_E2E_P99]
        granted = 0.0
        busy = 0.0
        for i in range(nt):
            at = N_GLOBAL + i * N_TENANT
            if out[at + OBS_E2E_P99] > p99:
                p99 = out[at + OBS_E2E_P99]
            granted += out[at + 2]
            busy += out[at + 1]
        memory = busy / granted if granted > 0 else 1.0
        d = 0
        if p99 > params[0] or memory >= params[1]:
            d = -1
        elif memory < params[2]:
            d = 1
        for i in range(nt):
            deltas[i] = d
    else:
        for i in range(nt):
            at = N_GLOBAL + i * N_TENANT
            lim = out[at + 2]
            backlog = out[at] / (lim if lim > 1.0 else 1.0)
            if backlog > params[1]:
                deltas[i] = 1
            elif out[at + OBS_E2E_P99] > params[0] or backlog == 0:
                deltas[i] = -1
            else:
                deltas[i] = 0


@kernel
def run_rule(E, S, arrivals, rule, params, targets, k, lo, hi, interval, end, out, deltas, record, limits):
    """core/loop.py's ``run_loop`` on the compiled world's ``SimulatedWorld``, with ``rule`` as the controller: until
    ``end``, observe, decide, set the limits (clamped to [lo, hi]) and run one interval on. Returns (decisions,
    Σ limits). ``record`` (decisions × tenants × NTOT, or empty) receives every tenant's running totals after
    each decision's interval, ``limits`` (decisions × tenants, or empty) the limits each decision set, while
    they have rows."""
    ai = S[0]
    sf = S[5]
    tot = S[13]
    nt = ai.shape[0]
    decisions = 0
    limit_sum = 0.0
    while sf[S_NOW] < end - END_EPS_S:
        observe_all(E, S, out)
        _rule_deltas(rule, params, targets, k, out, deltas)
        total = 0
        for i in range(nt):
            cur = ai[i, A_LIMIT]
            new = cur + deltas[i]
            new = lo if new < lo else hi if new > hi else new
            total += new
            if decisions < limits.shape[0]:
                limits[decisions, i] = new
            if new != cur:
                set_limit(E, S, i, new)
        advance(E, S, arrivals, min(sf[S_NOW] + interval, end))
        if decisions < record.shape[0]:
            for i in range(nt):
                for c in range(NTOT):
                    record[decisions, i, c] = tot[i, c]
        limit_sum += total
        decisions += 1
    return decisions, limit_sum


# --------------------------------------------------------------------------- contracts
@kernel
def contract_classify_all(t: np.ndarray, tenant: np.ndarray, cost: np.ndarray, rate: np.ndarray,
                          burst: np.ndarray, tat: np.ndarray, out: np.ndarray) -> None:
    """core/contract.py's ``ContractMeter`` for every tenant in one pass over an episode's requests in arrival
    order, with core/gcra.py's arithmetic in its order (the bucket full at a tenant's first request; only an
    in-contract request spends): ``out[i]`` is whether request i is in contract. Tenant k has a contract where
    ``rate[k] > 0`` (its envelope's TAT in ``tat[k]``, NaN until its first request); a request of a tenant
    without one is in contract."""
    for i in range(t.shape[0]):
        k = tenant[i]
        r = rate[k]
        if r <= 0:
            out[i] = True
            continue
        now = t[i]
        if tat[k] != tat[k]:  # NaN: the tenant's first request finds its envelope full
            tat[k] = now
        per = 1.0 / r
        qty = cost[i]
        tau = max(per * burst[k], qty * per)
        wait = max(tat[k] - now, 0.0) + qty * per - tau
        if wait <= 0:
            out[i] = True
            tat[k] = max(tat[k], now) + qty / r
        else:
            out[i] = False


# ====================================================================================== many worlds
# envs/vector.py's N worlds in one call. A world is the tuple ``CompiledSimulation.vector_state`` builds:
# (E, S, arrivals, out, vec, taken, counts, limits, weights, cweights, ctaken, agg, params), params =
# (lo, hi, interval, horizon, offset). The worlds sit in a numba typed List, which crosses into a compiled
# call as one pointer: passing each world's two state tuples costs more than stepping a small world does.
# Typed Lists are reference-counted, so this one kernel keeps numba's NRT on (``kernel`` turns it off).
V_LO, V_HI, V_INTERVAL, V_HORIZON, V_OFFSET = range(5)
NV = 5


@_njit(cache=True)
def vector_env_step(worlds, actions, obs, aggs, limits, active):
    """``env_step`` for every world in ``worlds`` where ``active[w]`` (the others are not touched): world w takes
    the row ``actions[w]`` (its first n entries, n its tenants); its observation vector goes to ``obs[w, :m]``
    (m its length; the rest of the row is set to 0), its ``agg`` sums to ``aggs[w]`` and its new limits to
    ``limits[w, :n]`` (the rest 0)."""
    for w in range(len(worlds)):
        if not active[w]:
            continue
        E, S, arrivals, out, vec, taken, counts, lim, weights, cweights, ctaken, agg, p = worlds[w]
        env_step(E, S, arrivals, actions[w], int(p[V_OFFSET]), int(p[V_LO]), int(p[V_HI]), p[V_INTERVAL],
                 p[V_HORIZON], weights, out, vec, taken, counts, lim, agg, cweights, ctaken)
        m = vec.shape[0]
        for j in range(obs.shape[1]):
            obs[w, j] = vec[j] if j < m else np.float32(0.0)
        for j in range(NAGG):
            aggs[w, j] = agg[j]
        n = lim.shape[0]
        for j in range(limits.shape[1]):
            limits[w, j] = lim[j] if j < n else 0


@_njit(cache=True)
def vector_worlds(first):
    """A typed List of worlds holding ``first``: built by a cached kernel, not from Python, so a process pays
    no compile for it (numba compiles the List's methods called from Python in every new process)."""
    worlds = List()
    worlds.append(first)
    return worlds


@_njit(cache=True)
def vector_append(worlds, world):
    worlds.append(world)


@_njit(cache=True)
def vector_set(worlds, i, world):
    """World ``i`` of the list becomes ``world`` (a reset), by a cached kernel, as ``vector_worlds``."""
    worlds[i] = world
