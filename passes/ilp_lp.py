"""A few equality rows and capacity rows over many columns → LP optimum and duals: the master problem's relaxation.

The master problem's relaxations (docs/cost-model.md Eq. 12', Eq. 19) have one equality row per layer class
(Σ counts = layers) and one capacity row per memory tier that can bind, over hundreds of configurations: at most
six rows. A dense revised simplex with Bland's rule solves them in microseconds, with no solver process and no
time limit, and gives what the exact level search needs: the duals λ of the capacities and the basic columns.

Nothing downstream trusts this LP for exactness: bounds are recomputed from λ by weak duality
(min over columns of t + λ·m, valid for any λ ≥ 0), so rounding here can only make a bound weaker, never wrong.

    result = solve_lp(cost, equal_rows, equal_rhs, capacity_rows, capacity_rhs)
    result.value, result.capacity_duals, result.basis
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["LpResult", "solve_lp"]

_MAX_PIVOTS = 10_000  # Bland's rule terminates; this only guards against numerical cycling (deterministic)


@dataclass(frozen=True)
class LpResult:
    """The optimum of min c·x, A_eq x = b_eq, A_cap x ≤ b_cap, x ≥ 0."""

    value: float
    x: np.ndarray  # [n] the columns' values
    equal_duals: np.ndarray  # [r_eq] prices of the equality rows (seconds per layer)
    capacity_duals: np.ndarray  # [r_cap] λ ≥ 0: seconds saved per unit of capacity
    basis: tuple[int, ...]  # columns in the final basis (slacks and artificials left out)


def solve_lp(cost: np.ndarray, equal_rows: np.ndarray, equal_rhs: np.ndarray, capacity_rows: np.ndarray,
             capacity_rhs: np.ndarray) -> LpResult | None:
    """The LP optimum, or None when no x ≥ 0 satisfies the rows (capacities must be scaled near 1: GiB, not bytes).

    Two phases with one artificial per equality row (capacity rows start on their slacks; a negative capacity is
    infeasible at once since every coefficient is non-negative), Bland's rule for entering and leaving columns.
    """
    cost = np.asarray(cost, dtype=np.float64)
    n = cost.size
    a_eq = np.asarray(equal_rows, dtype=np.float64).reshape(-1, n)
    a_cap = np.asarray(capacity_rows, dtype=np.float64).reshape(-1, n)
    b = np.r_[np.asarray(equal_rhs, dtype=np.float64), np.asarray(capacity_rhs, dtype=np.float64)]
    r_eq, r_cap = a_eq.shape[0], a_cap.shape[0]
    if (b[r_eq:] < 0).any() or (b[:r_eq] < 0).any():
        return None
    rows = r_eq + r_cap
    # columns: x (n), slacks (r_cap), artificials (r_eq)
    a = np.zeros((rows, n + r_cap + r_eq))
    a[:r_eq, :n] = a_eq
    a[r_eq:, :n] = a_cap
    a[r_eq:, n:n + r_cap] = np.eye(r_cap)
    a[:r_eq, n + r_cap:] = np.eye(r_eq)
    basis = [n + r_cap + i for i in range(r_eq)] + [n + i for i in range(r_cap)]
    scale = max(1.0, float(np.abs(cost).max(initial=0.0)))
    phase1 = np.r_[np.zeros(n + r_cap), np.ones(r_eq)]
    basis, x_b = _simplex(a, b, phase1, basis, n + r_cap + r_eq, 1.0)
    if x_b is None or sum(x_b[i] for i, j in enumerate(basis) if j >= n + r_cap) > 1e-9 * max(1.0, b.max()):
        return None
    # drive artificials left in the basis (at zero) out, where a real column can replace them
    for pos, j in enumerate(list(basis)):
        if j < n + r_cap:
            continue
        row = np.linalg.solve(a[:, basis].T, np.eye(rows)[pos])  # row `pos` of B⁻¹
        pivots = row @ a[:, :n + r_cap]
        candidates = [k for k in np.nonzero(np.abs(pivots) > 1e-9)[0] if k not in basis]
        if candidates:
            basis[pos] = int(candidates[0])
    full = np.r_[cost, np.zeros(r_cap), np.zeros(r_eq)]
    allowed = n + r_cap  # artificials may no longer enter
    basis, x_b = _simplex(a, b, full, basis, allowed, scale)
    if x_b is None:
        return None
    x = np.zeros(n)
    for i, j in enumerate(basis):
        if j < n:
            x[j] = max(0.0, x_b[i])
    y = np.linalg.solve(a[:, basis].T, full[basis])
    return LpResult(value=float(cost @ x), x=x, equal_duals=y[:r_eq], capacity_duals=np.maximum(-y[r_eq:], 0.0),
                    basis=tuple(sorted(j for j in basis if j < n)))


def _simplex(a: np.ndarray, b: np.ndarray, cost: np.ndarray, basis: list[int], allowed: int, scale: float):
    """Revised simplex from a feasible basis; columns ≥ `allowed` never enter. Returns (basis, x_B), x_B None when
    unbounded (cannot happen here: every column has a non-negative equality row)."""
    basis = list(basis)
    tolerance = 1e-11 * scale
    for _ in range(_MAX_PIVOTS):
        matrix = a[:, basis]
        x_b = np.linalg.solve(matrix, b)
        y = np.linalg.solve(matrix.T, cost[basis])
        reduced = cost[:allowed] - y @ a[:, :allowed]
        reduced[_basis_mask(basis, allowed)] = 0.0
        entering = np.nonzero(reduced < -tolerance)[0]
        if entering.size == 0:
            return basis, x_b
        j = int(entering[0])  # Bland: the lowest index
        direction = np.linalg.solve(matrix, a[:, j])
        positive = direction > 1e-12
        if not positive.any():
            return basis, None
        ratios = np.where(positive, np.maximum(x_b, 0.0) / np.where(positive, direction, 1.0), np.inf)
        least = ratios.min()
        ties = np.nonzero(ratios <= least + 1e-15 * max(1.0, least))[0]
        leave = int(min(ties, key=lambda i: basis[i]))  # Bland: the lowest basic index among ties
        basis[leave] = j
    return basis, np.linalg.solve(a[:, basis], b)


def _basis_mask(basis: list[int], allowed: int) -> np.ndarray:
    mask = np.zeros(allowed, dtype=bool)
    for j in basis:
        if j < allowed:
            mask[j] = True
    return mask
