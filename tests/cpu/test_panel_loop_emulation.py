"""The column loop of the warp and rows panels with Panel.loop (templates/cuda/panel_rows.cuh.j2, `column`), step
by step in NumPy float64: registers that rotate by one column per step, dots over every slot (the column's tail
against the later columns, the previous reflector against the finished ones for T's Gram entries), a last step
for the last reflector's entries. Its results must be LAPACK's (dgeqrf: H and tau) and VᵀV's upper triangle; the
first GPU run of this loop failed the gates for want of that last step. Likewise the lanes panels' columns
(templates/cuda/panel_lanes.cuh.j2, `column`), where each lane's own column stays unscaled below its diagonal
until the loop ends."""
import numpy as np
import pytest
from scipy.linalg import lapack


def _reflector(alpha: float, sigma: float) -> tuple[float, float, float]:
    """common.cuh.j2's make_reflector: (tau, beta, scale)."""
    if sigma == 0.0:
        return 0.0, alpha, 1.0
    norm = np.sqrt(alpha * alpha + sigma)
    beta = -norm if alpha >= 0.0 else norm
    return (beta - alpha) / beta, beta, 1.0 / (alpha - beta)


def column_loop(a: np.ndarray):
    """x[r, p] is slot p of the thread holding row r; returns (H, tau, G) as the kernel leaves them."""
    rows, nb = a.shape
    x, r = a.astype(np.float64).copy(), np.arange(rows)
    gram, tau = np.zeros((nb, nb + 1)), np.zeros(nb)
    for j in range(nb + (1 if nb >= 2 else 0)):
        a0 = np.where(r > j, x[:, 0], 0.0)
        vp = np.where(r > j - 1, x[:, nb - 1], np.where(r == j - 1, 1.0, 0.0))
        v = np.array([np.dot(a0 if p < nb - j else vp, x[:, p]) for p in range(nb)])
        for t in range(nb - j, nb - 1):  # the threads that write G[k][j - 1]
            gram[t - (nb - j), j - 1] = v[t]
        if j == nb:
            break
        piv = x[j].copy()
        tau[j], beta, scale = _reflector(piv[0], v[0])
        fk = np.array([tau[j] * (scale * v[p] + piv[p]) if 0 < p < nb - j else 0.0 for p in range(nb)])
        vr, below, at = x[:, 0] * scale, (r > j)[:, None], (r == j)[:, None]
        rest = x[:, 1:]
        shifted = np.where(below, rest - fk[1:] * vr[:, None], np.where(at, rest - fk[1:], rest))
        last = np.where(r > j, vr, np.where(r == j, beta, x[:, 0]))
        x = np.concatenate([shifted, last[:, None]], axis=1)
    return x, tau, gram


@pytest.mark.parametrize("rows,nb", [(100, 32), (32, 32), (33, 16), (64, 8), (5, 5), (2, 1), (300, 32)])
def test_column_loop_matches_lapack_and_gram(rows, nb):
    rng = np.random.default_rng(rows * 100 + nb)
    a = rng.standard_normal((rows, nb))
    if nb > 4:
        a[:, 3] = 0.0  # a zero column: exactly zero below the diagonal after every reflection, so tau 0
    assert_lapack_and_gram(a, *column_loop(a))


def assert_lapack_and_gram(a, h, tau, gram):
    """H and tau are dgeqrf's, G's strictly upper triangle is VᵀV's."""
    nb = a.shape[1]
    href, tauref, _, info = lapack.dgeqrf(a)
    assert info == 0
    scale = np.abs(a).max()
    assert np.abs(h - href).max() <= 1e-12 * scale and np.abs(tau - tauref).max() <= 1e-12
    v = np.tril(href, -1)
    v[np.arange(nb), np.arange(nb)] = 1.0
    g = v.T @ v
    upper = np.triu_indices(nb, 1)
    assert np.abs(gram[:, :nb][upper] - g[upper]).max(initial=0.0) <= 1e-11 * max(1.0, np.abs(g).max())


def test_without_the_last_step_the_last_gram_column_is_missing():
    """What the first GPU run lacked: the entries G[k][NB-1] come only from the extra step."""
    a = np.random.default_rng(0).standard_normal((40, 8))
    _, _, gram = column_loop(a)
    assert np.abs(gram[:7, 7]).min() > 0.0


def lanes_columns(a: np.ndarray):
    """x[r, c] is lane c's entry in row r; returns (H, tau, G) as a lanes panel leaves them: column j broadcast
    (rows below j), every lane's dot of it with its column, the reflector from lane j's, every row of every column
    updated by one FMA (coefficient 0 in lane j and left of it: lane j's column stays unscaled, its scale kept in
    `own` and applied after the loop), the Gram entries of the finished columns times their own scale."""
    rows, nb = a.shape
    x, r = a.astype(np.float64).copy(), np.arange(rows)
    gram, tau, own = np.zeros((nb, nb + 1)), np.zeros(nb), np.ones(nb)
    lane = np.arange(nb)
    for j in range(nb):
        v = np.where(r > j, x[:, j], 0.0)
        tot, pv = v @ x, x[j].copy()
        tau[j], beta, scale = _reflector(pv[j], tot[j])
        d = scale * tot + pv
        gram[:j, j] = d[:j] * own[:j]
        own[j] = scale
        w = np.where(lane > j, tau[j] * d, 0.0)
        at = np.where(lane == j, beta, pv - w)
        x[r > j] -= np.outer(v[r > j], w * scale)
        x[j, j:] = at[j:]
    x = np.where(r[:, None] > lane[None, :], x * own, x)
    return x, tau, gram


@pytest.mark.parametrize("rows,nb", [(100, 32), (32, 32), (33, 16), (64, 8), (5, 5), (2, 1), (300, 32)])
def test_lanes_columns_match_lapack_and_gram(rows, nb):
    rng = np.random.default_rng(rows * 100 + nb + 7)
    a = rng.standard_normal((rows, nb))
    if nb > 4:
        a[:, 3] = 0.0  # a zero column: the identity reflector (tau 0, scale 1)
        a[:, 4] *= 1e-6  # a small one: its scale far from 1, so a missing `own` shows
    assert_lapack_and_gram(a, *lanes_columns(a))
