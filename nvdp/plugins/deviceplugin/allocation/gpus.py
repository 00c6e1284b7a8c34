"""Choosing whole GPUs by topology (pure, over a weight matrix).

Of the sets S of `size` available GPUs holding every required one, the best has, in order:
1. the highest score (the sum of pair scores over S's pairs);
2. the fewest NUMA nodes;
3. the lowest degree sum over S (deg: a GPU's summed weight to the other available GPUs): the
   leftovers stay best connected (of two NVLink pairs with one GPU taken, one more takes its partner);
4. the lowest GPU indices (sorted index tuples, compared lexicographically).
- Up to 16 candidates, or one GPU: exact, a depth-first branch and bound in index order (the first
  of equal keys is the lowest), seeded by the heuristic's answer.
- More: a heuristic (greedy growth within SEED_WORK or shrinking, then single swaps); not
  guaranteed optimal, bench/allocation.py measures how often it is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import combinations

EXACT_MAX_GPUS = 16
SEED_WORK = 4096  # greedy starts: about SEED_WORK / (candidates x GPUs to pick)

# (2 * score, -NUMA nodes, -degree sum): larger is better; the index tuple breaks the last tie.
Key = tuple[int, int, int]
_NEG = -(1 << 60)


def choose_gpus(
    weights: Sequence[Sequence[int]],
    numa: Sequence[int],
    available: Sequence[int],
    must: Sequence[int],
    size: int,
    exact_max_gpus: int = EXACT_MAX_GPUS,
) -> list[int]:
    """The best `size` positions from `available`, including `must` (see the module doc).

    Positions index `weights` (symmetric, zero diagonal) and `numa`, in GPU-index order.
    `available` is sorted and distinct; `must` is a subset; len(must) <= size <= len(available).
    The search is exact up to `exact_max_gpus` candidates (and for one GPU), heuristic beyond.
    """
    return _Search(weights, numa, available, must, size).run(exact_max_gpus)


class _Search:
    """One request: candidates are the available GPUs not required, in local indices 0..n-1."""

    def __init__(
        self,
        weights: Sequence[Sequence[int]],
        numa: Sequence[int],
        available: Sequence[int],
        must: Sequence[int],
        size: int,
    ) -> None:
        required = set(must)
        self.must = sorted(required)
        self.cands = [p for p in available if p not in required]
        self.n = len(self.cands)
        self.need = size - len(self.must)
        cands = self.cands
        self.w = [[weights[a][b] for b in cands] for a in cands]
        self.numa = [numa[c] for c in cands]
        self.base_conn = [sum(weights[c][m] for m in self.must) for c in cands]
        self.base_score2 = 2 * sum(weights[a][b] for a, b in combinations(self.must, 2))
        self.base_numa = Counter(numa[m] for m in self.must)
        self.deg = [sum(weights[c][q] for q in available) for c in cands]

    def run(self, exact_max_gpus: int) -> list[int]:
        if self.need == 0:
            return self.must
        if self.need == self.n:
            local = list(range(self.n))
        elif self.need == 1:
            local = self._exact([0])
        else:
            exact = self.n <= exact_max_gpus
            local = self._heuristic(0 if exact else SEED_WORK)
            if exact:
                local = self._exact(local)
        return sorted(self.must + [self.cands[c] for c in local])

    def key(self, local: Sequence[int]) -> Key:
        score2 = self.base_score2 + 2 * sum(self.base_conn[c] for c in local)
        score2 += 2 * sum(self.w[a][b] for a, b in combinations(local, 2))
        numas = set(self.base_numa) | {self.numa[c] for c in local}
        return (score2, -len(numas), -sum(self.deg[c] for c in local))

    # -- heuristic -------------------------------------------------------------------------------

    def _heuristic(self, seed_work: int) -> list[int]:
        """The best of greedy growths (and a greedy shrink for large requests), improved by swaps."""
        t = self.need - 1
        top = [sum(sorted(row, reverse=True)[:t]) for row in self.w]
        ranked = sorted(range(self.n), key=lambda c: (-top[c], self.deg[c], c))
        seeds = set(ranked[: max(1, seed_work // (self.n * self.need))])
        results = [self._greedy([])] if self.must else []
        if 2 * self.need > self.n:
            results.append(self._shrink())
        else:
            seeds.update({self.numa[c]: c for c in reversed(ranked)}.values())  # each NUMA node's best
        results += [self._greedy([c]) for c in sorted(seeds)]
        best: list[int] = []
        best_key: Key | None = None
        for local in map(sorted, results):
            key = self.key(local)
            if best_key is None or key > best_key or (key == best_key and local < best):
                best, best_key = local, key
        return self._improve(best)

    def _shrink(self) -> list[int]:
        """Start from every candidate and drop, one at a time, the one with the weakest link to the
        rest; ties: the drop that frees a NUMA node, then the highest degree, then the highest index."""
        numa, deg = self.numa, self.deg
        conn = list(self.base_conn)
        for row in self.w:
            conn = [a + b for a, b in zip(conn, row, strict=True)]
        counts = Counter(self.base_numa)
        counts.update(numa)
        dropped = [False] * self.n
        for _ in range(self.n - self.need):
            low = min(c for c, gone in zip(conn, dropped, strict=True) if not gone)
            ties = [c for c in range(self.n) if conn[c] == low and not dropped[c]]
            drop = max(ties, key=lambda c: (counts[numa[c]] == 1, deg[c], c))
            dropped[drop] = True
            counts[numa[drop]] -= 1
            conn = [a - b for a, b in zip(conn, self.w[drop], strict=True)]
        return [c for c in range(self.n) if not dropped[c]]

    def _greedy(self, seed: list[int]) -> list[int]:
        """Grow `seed` one GPU at a time: the strongest link to the set, then no new NUMA node,
        then the lowest degree, then the lowest index."""
        chosen = list(seed)
        numas = set(self.base_numa)
        gain = list(self.base_conn)
        for c in chosen:
            numas.add(self.numa[c])
            gain = [g + x for g, x in zip(gain, self.w[c], strict=True)]
        for c in chosen:
            gain[c] = _NEG
        while len(chosen) < self.need:
            top = max(gain)
            ties = [c for c, g in enumerate(gain) if g == top]
            pick = ties[0]
            if len(ties) > 1:
                pick = min(ties, key=lambda c: (self.numa[c] not in numas, self.deg[c], c))
            chosen.append(pick)
            numas.add(self.numa[pick])
            gain = [g + x for g, x in zip(gain, self.w[pick], strict=True)]
            gain[pick] = _NEG
        return chosen

    def _improve(self, local: list[int]) -> list[int]:
        """Best-improvement swaps (one chosen GPU out, one other in) while the key improves."""
        w, numa, deg = self.w, self.numa, self.deg
        chosen = set(local)
        conn = list(self.base_conn)
        for c in chosen:
            conn = [a + b for a, b in zip(conn, w[c], strict=True)]
        counts = Counter(self.base_numa)
        counts.update(numa[c] for c in chosen)
        degsum = sum(deg[c] for c in chosen)
        for _ in range(4 * self.need):
            outside = [j for j in range(self.n) if j not in chosen]
            current = (0, -len(counts), -degsum)
            best_move: tuple[int, int, int] | None = None
            best_pair = (0, 0)
            for i in sorted(chosen):
                wi, ci, ni = w[i], conn[i], numa[i]
                leaves = counts[ni] == 1
                for j in outside:
                    delta = conn[j] - wi[j] - ci
                    if delta < 0:
                        continue
                    nj = numa[j]
                    nodes = len(counts)
                    if nj != ni:
                        nodes += (counts[nj] == 0) - leaves
                    move = (delta, -nodes, -(degsum - deg[i] + deg[j]))
                    if move > current and (best_move is None or move > best_move):
                        best_move, best_pair = move, (i, j)
            if best_move is None:
                break
            i, j = best_pair
            chosen.remove(i)
            chosen.add(j)
            conn = [a + b - c for a, b, c in zip(conn, w[j], w[i], strict=True)]
            counts[numa[i]] -= 1
            if counts[numa[i]] == 0:
                del counts[numa[i]]
            counts[numa[j]] += 1
            degsum += deg[j] - deg[i]
        return sorted(chosen)

    # -- exact -----------------------------------------------------------------------------------

    def _exact(self, incumbent: list[int]) -> list[int]:
        n, w, numa, deg = self.n, self.w, self.numa, self.deg
        best = incumbent
        best_key = self.key(incumbent)
        # top[i][c - i][t]: the t largest weights from candidate c to candidates i.. (c >= i), summed.
        top: list[list[list[int]]] = []
        # min_deg[i][t]: the t smallest degrees among candidates i.. summed (a lower bound).
        min_deg: list[list[int]] = []
        if self.need > 1:
            for i in range(n):
                top.append(
                    [_prefix_sums(sorted(w[c][i:], reverse=True)[: self.need - 1]) for c in range(i, n)]
                )
                min_deg.append(_prefix_sums(sorted(deg[i:])[: self.need]))

        def visit(
            i: int,
            need: int,
            score2: int,
            conn: list[int],
            numas: frozenset[int],
            degsum: int,
            chosen: list[int],
        ) -> None:
            nonlocal best, best_key
            if need == 1:
                for c in range(i, n):
                    nodes = len(numas) if numa[c] in numas else len(numas) + 1
                    key = (score2 + 2 * conn[c], -nodes, -(degsum + deg[c]))
                    if key > best_key or (key == best_key and chosen + [c] < best):
                        best, best_key = chosen + [c], key
                return
            gains = sorted([2 * conn[c] + t[need - 1] for c, t in enumerate(top[i], i)], reverse=True)
            bound = (score2 + sum(gains[:need]), -max(len(numas), 1), -(degsum + min_deg[i][need]))
            if bound < best_key or (bound == best_key and best <= chosen + list(range(i, i + need))):
                return
            visit(
                i + 1,
                need - 1,
                score2 + 2 * conn[i],
                [a + b for a, b in zip(conn, w[i], strict=True)],
                numas | {numa[i]},
                degsum + deg[i],
                chosen + [i],
            )
            if n - i - 1 >= need:
                visit(i + 1, need, score2, conn, numas, degsum, chosen)

        visit(0, self.need, self.base_score2, list(self.base_conn), frozenset(self.base_numa), 0, [])
        return best


def _prefix_sums(values: list[int]) -> list[int]:
    sums = [0]
    for value in values:
        sums.append(sums[-1] + value)
    return sums
