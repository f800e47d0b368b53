"""Balanced label propagation over a projection spread across ranks (`--method temporal-lp` and
`metis-lp`), in the manner of Spinner and XtraPuLP: what partitions a graph whose projection no
one rank's memory holds.

Each rank holds a portion of the projection's weighted node pairs (each pair on one rank) and
every node's vertex weights (the balance constraints: time windows of owned events, or nodes,
edges and training nodes). It starts from the hash partition (`random_membership`). Each round,
every pair tells both its nodes how much weight points to the other's part; the sums of a node
meet at the rank that `node % W` names, which proposes the node's move to the part most of its
weight points to (or, out of a part over its capacity, to the best part with room). The
proposals (one per node at most) are gathered by every rank, which all accept the same ones:
by gain, largest first, each while its target stays within the capacity of every constraint
(`imbalance_tol` times the mean). Sums of integer weights and a fixed order of acceptance make
the result depend on the seed only, not on the number of ranks or on which rank holds a pair.
"""
from __future__ import annotations

from typing import Any, Sequence

import numba
import numpy as np
import torch

from gnndist.graph import TemporalGraph
from gnndist.partition import methods
from gnndist.runtime import dist

ROUNDS = 60  # at most; propagation stops sooner where a round moves no node
ALTERNATIVES = 3  # the parts a node of an overfull part proposes


def propagate(a: np.ndarray, b: np.ndarray, w: np.ndarray, vwgt: np.ndarray, num_parts: int,
              imbalance_tol: float, seed: int, group: Any = None, rounds: int = ROUNDS) -> np.ndarray:
    """The membership (int64 [N]) balanced label propagation finds (see the module docstring);
    a collective. `a`, `b`, `w`: this rank's pairs (a < b) and their integer weights; `vwgt`:
    [N, ncon] vertex weights, the same on every rank."""
    n = vwgt.shape[0]
    vwgt = vwgt.reshape(n, -1).astype(np.float64)
    part = methods.random_membership(n, num_parts, seed)
    mean = vwgt.sum(axis=0) / num_parts
    start = np.maximum(_loads(part, vwgt, num_parts).max(axis=0) / np.where(mean > 0, mean, 1), imbalance_tol)
    world, me = dist.world_size(), dist.rank()
    mine = np.arange(me, n, world, dtype=np.int64)  # the nodes whose sums meet here
    for r in range(rounds):
        # the caps tighten from the hash partition's imbalance to `imbalance_tol` over the first
        # half of the rounds: early moves have room, and overfull parts shed by degrees
        frac = min(1.0, r / max(rounds // 2, 1))
        caps = mean * (start + (imbalance_tol - start) * frac)
        nodes, parts, weights = _pointing(a, b, w, part, num_parts, world, group)
        cand = _proposals(mine, nodes, parts, weights, part, vwgt, caps, num_parts)
        got = dist.gather_objects(cand, group)
        v, q, gain, over = (np.concatenate([g[i] for g in got]) for i in range(4))
        mix = _mix(v, seed, r)
        # half the nodes, drawn anew each round, may move: neighbours that all move at once
        # would swap parts back and forth for ever
        awake = over | (mix % np.uint64(2) == 0)
        v, q, gain, over, mix = v[awake], q[awake], gain[awake], over[awake], mix[awake]
        order = np.lexsort((mix, -gain, ~over))  # out of overfull parts first, then by gain
        if _accept(v[order], q[order], over[order], part, vwgt, caps, num_parts) == 0 and frac == 1.0:
            break
    return part


def _pointing(a: np.ndarray, b: np.ndarray, w: np.ndarray, part: np.ndarray, num_parts: int, world: int,
              group: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The weight each node's pairs point to each part, summed over all ranks' pairs at the rank
    `node % world`: (nodes, parts, weights) of the (node, part) sums that meet here."""
    nodes = np.concatenate([a, b])
    towards = np.concatenate([part[b], part[a]])
    weight = np.concatenate([w, w]).astype(np.int64)
    dest = nodes % world
    order = np.argsort(dest, kind="stable")
    rows = torch.from_numpy(np.stack([nodes, towards, weight], 1)[order])
    got = dist.joined(dist.exchange(list(rows.split(np.bincount(dest, minlength=world).tolist())), group)).numpy()
    key = got[:, 0] * num_parts + got[:, 1]
    keys, inv = np.unique(key, return_inverse=True)
    sums = np.bincount(inv, weights=got[:, 2]).astype(np.int64) if keys.size else np.zeros(0, np.int64)
    return keys // num_parts, keys % num_parts, sums


def _proposals(mine: np.ndarray, nodes: np.ndarray, parts: np.ndarray, weights: np.ndarray, part: np.ndarray,
               vwgt: np.ndarray, caps: np.ndarray, num_parts: int) -> tuple[np.ndarray, ...]:
    """This rank's proposed moves: (nodes, target parts, gains, whether out of an overfull part).
    A node proposes the part most of its weight points to where that gains; a node of an
    overfull part with no such move proposes ALTERNATIVES parts, those it fits in first, each
    group by the weight that points to it (a part it does not fit in may trade it for one of its
    own nodes: `_accept`'s swaps)."""
    load = _loads(part, vwgt, num_parts)
    over_part = np.any(load > caps + 1e-9, axis=1)
    conn = np.zeros((mine.size, num_parts), np.int64)
    np.add.at(conn, (nodes // max(dist.world_size(), 1), parts), weights)
    rows = np.arange(mine.size)
    here = part[mine]
    own = conn[rows, here]
    best = np.argmax(conn, axis=1)
    gain = conn[rows, best] - own
    move = (best != here) & (gain > 0)
    out = [(mine[move], best[move], gain[move], np.zeros(int(move.sum()), bool))]
    shed = np.flatnonzero(over_part[here] & ~move)
    if shed.size:  # parts the node fits in first, as the loads stand; then others, to trade with
        fits = np.all(load[None, :, :] + vwgt[mine[shed], None, :] <= caps + 1e-9, axis=2)
        masked = np.where(np.arange(num_parts)[None, :] == here[shed, None], -1,
                          conn[shed] + fits * (conn.max(initial=0) + 1))
        for alt in np.argsort(-masked, axis=1, kind="stable")[:, :ALTERNATIVES].T:
            ok = masked[np.arange(shed.size), alt] >= 0
            out.append((mine[shed[ok]], alt[ok], conn[shed[ok], alt[ok]] - own[shed[ok]], np.ones(int(ok.sum()), bool)))
    return tuple(np.concatenate([o[i] for o in out]).astype(np.int64 if i < 3 else bool) for i in range(4))


def _loads(part: np.ndarray, vwgt: np.ndarray, num_parts: int) -> np.ndarray:
    """[num_parts, ncon] the weight of each part per constraint."""
    return np.stack([np.bincount(part, weights=vwgt[:, c], minlength=num_parts) for c in range(vwgt.shape[1])], 1)


def _mix(v: np.ndarray, seed: int, r: int) -> np.ndarray:
    """A seeded hash of node ids (splitmix64) for round `r`: the order of equal gains."""
    with np.errstate(over="ignore"):
        z = v.astype(np.uint64) + np.uint64((seed * 1_000_003 + r) & 0xFFFFFFFFFFFFFFFF) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _accept(v: np.ndarray, q: np.ndarray, over: np.ndarray, part: np.ndarray, vwgt: np.ndarray, caps: np.ndarray,
            num_parts: int) -> int:
    """Make the proposed moves, in order, each while its target stays within every cap (a move
    out of an overfull part, `over`, only while that part is still over a cap); then, of the moves
    left, swaps: the i-th best move from p to q with the i-th best from q to p, where both parts
    stay within every cap after both (parts near their caps trade nodes). The count made."""
    load = _loads(part, vwgt, num_parts)
    done = np.zeros(v.size, np.bool_)
    moved = _accept_kernel(v, q, over, part, vwgt, caps, load, done)
    left = np.flatnonzero(~done & (part[v] != q))
    if left.size:
        frm = part[v[left]]
        order = left[np.lexsort((left, q[left], frm))]  # by (from, to), best first within each
        moved += _swap_kernel(v[order], q[order], part[v[order]], part, vwgt, caps, load, num_parts)
    return int(moved)


@numba.njit(cache=True)
def _swap_kernel(v, q, frm, part, vwgt, caps, load, k):  # pragma: no cover - compiled
    """Swaps of the moves (v, from, to) grouped by (from, to), best first within each group."""
    key = frm * k + q
    moved = 0
    start = 0
    while start < v.size:
        end = start
        while end < v.size and key[end] == key[start]:
            end += 1
        p, r = frm[start], q[start]
        if p < r:  # each pair of parts once, from its lower part's group
            back = np.searchsorted(key, r * k + p)
            back_end = back
            while back_end < v.size and key[back_end] == r * k + p:
                back_end += 1
            for i in range(min(end - start, back_end - back)):
                a, b = v[start + i], v[back + i]
                if part[a] != p or part[b] != r:  # moved already (a node may propose several parts)
                    continue
                ok = True
                for c in range(caps.size):
                    if (load[p, c] - vwgt[a, c] + vwgt[b, c] > caps[c] + 1e-9
                            or load[r, c] - vwgt[b, c] + vwgt[a, c] > caps[c] + 1e-9):
                        ok = False
                        break
                if not ok:
                    continue
                for c in range(caps.size):
                    load[p, c] += vwgt[b, c] - vwgt[a, c]
                    load[r, c] += vwgt[a, c] - vwgt[b, c]
                part[a], part[b] = r, p
                moved += 2
        start = end
    return moved


@numba.njit(cache=True)
def _accept_kernel(v, q, over, part, vwgt, caps, load, done):  # pragma: no cover - compiled
    moved = 0
    for i in range(v.size):
        node, to = v[i], q[i]
        frm = part[node]
        if frm == to:
            continue
        if over[i]:
            still = False
            for c in range(caps.size):
                if load[frm, c] > caps[c] + 1e-9:
                    still = True
            if not still:
                continue
        fits = True
        for c in range(caps.size):
            if load[to, c] + vwgt[node, c] > caps[c] + 1e-9:
                fits = False
                break
        if not fits:
            continue
        for c in range(caps.size):
            load[frm, c] -= vwgt[node, c]
            load[to, c] += vwgt[node, c]
        part[node] = to
        done[i] = True
        moved += 1
    return moved


def lp_membership(graph, num_parts: int, method: str, balance: Sequence[str], time_windows: int, recency: float,
                  imbalance_tol: float, seed: int) -> np.ndarray:
    """`propagate` in one process over the projection `temporal-lp` or `metis-lp` builds of a
    whole graph (the pairs and vertex weights the ranks of `partition.scale` build of its shards,
    so its membership is theirs)."""
    n = graph.num_nodes
    if method == "temporal-lp":
        keep = graph.src != graph.dst
        t = graph.t
        w = methods.event_weights(t[keep], float(t[0]), float(t[-1] - t[0]), recency)
        key = np.minimum(graph.src[keep], graph.dst[keep]) * np.int64(n) + np.maximum(graph.src[keep], graph.dst[keep])
        keys, inv = np.unique(key, return_inverse=True)
        weights = np.bincount(inv, weights=w).astype(np.int64)
        vwgt = methods.event_owner_counts(graph, time_windows)
        vwgt = vwgt[:, vwgt.sum(axis=0) > 0]
    else:
        if isinstance(graph, TemporalGraph):
            keep = graph.src != graph.dst
            key = np.minimum(graph.src[keep], graph.dst[keep]) * np.int64(n) + np.maximum(graph.src[keep], graph.dst[keep])
        else:
            key = methods._csr_pair_keys(graph.indptr, graph.indices)
        keys = np.unique(key)
        weights = np.ones(keys.size, np.int64)
        vwgt = methods._vertex_weights(graph, balance)
        vwgt = np.ones((n, 1), np.int64) if vwgt is None else vwgt
    return propagate(keys // n, keys % n, weights, vwgt, num_parts, imbalance_tol, seed)
