"""The identification's numerical core against independent references, no simulation involved:
the bounded Levenberg-Marquardt against SciPy's bounded least squares (``lsq_linear`` for a
linear problem, ``least_squares(method="trf")`` for a nonlinear one, both at tight
tolerances), the order-statistic interval of the median against the binomial distribution,
the cluster-robust (sandwich) covariance against a Monte Carlo of its model, and the consistency check on
recordings of two bodies."""

import math
import subprocess
import sys

import numpy as np
import pytest
from scipy import optimize, stats

from rigidjax.identify import _combine, _derived, _lm
from rigidjax.identify._model import SMALL_LANES, lane_chunks


def _linear_problem(M, y):
    """``evaluate`` of ``1/2 |M x - y|^2`` for a batch (one problem per row)."""

    def evaluate(x, rows):
        r = np.einsum("ij,aj->ai", M, x) - y
        A = np.broadcast_to(M.T @ M, (x.shape[0],) + (M.shape[1],) * 2).copy()
        g = np.einsum("ji,aj->ai", M, r)
        return 0.5 * np.sum(r * r, 1), A, g, np.ones(x.shape[0], bool), np.zeros((x.shape[0], 1))

    return evaluate


def test_bounded_lm_matches_scipy_lsq_linear():
    rng = np.random.default_rng(0)
    M = rng.normal(size=(30, 4))
    y = M @ np.array([1.5, -0.7, 0.3, 2.0]) + 0.1 * rng.normal(size=30)
    lo = np.array([0.0, 0.0, -np.inf, -1.0])  # x1 >= 0 is active at the solution (truth -0.7)
    hi = np.array([1.0, np.inf, np.inf, 1.5])  # x0 <= 1 and x3 <= 1.5 active too
    ref = optimize.lsq_linear(M, y, bounds=(lo, hi), tol=1e-14, method="bvls").x
    x0 = np.array([[0.5, 1.0, 0.0, 0.0], [0.0, 5.0, -3.0, -1.0]])
    st = _lm.solve(
        _linear_problem(M, y), x0, np.arange(2), np.tile(lo, (2, 1)), np.tile(hi, (2, 1)), eps=2.2e-16, max_steps=100
    )
    assert np.all(st["status"] == _lm.LMStatus.CONVERGED)
    # the solution's active bounds are hit exactly (projection), the free part to round-off
    np.testing.assert_allclose(st["x"], np.tile(ref, (2, 1)), atol=1e-10)
    assert np.all(st["x"][:, 0] == 1.0) and np.all(st["x"][:, 1] == 0.0) and np.all(st["x"][:, 3] == 1.5)
    # and the decrement of the projected gradient is what says so
    assert np.all(st["opt"] < 1e-10)


def test_bounded_lm_holds_a_variable_whose_step_points_out_of_the_box():
    # x0 sits at its upper bound 0 and its gradient frees it (g0 > 0), yet through the strong
    # coupling (H01 = 0.95) the Gauss-Newton step still pushes it out of the box. The step must
    # be solved again with x0 held: clipping it instead gives a step with negative predicted
    # decrease (0.5 x1^2 - H01 x1 < 0 at x1 = 1.5), and the damping climbs and falls
    # (7 iterations here before the fix; ~200 near the racquet's thin-plate edge).
    H = np.array([[1.0, 0.95], [0.95, 1.0]])
    M = np.linalg.cholesky(H).T
    y = M @ np.array([1.0, 0.0])
    lo, hi = np.array([[-np.inf, -np.inf]]), np.array([[0.0, np.inf]])
    st = _lm.solve(_linear_problem(M, y), np.array([[0.0, 1.5]]), np.array([0]), lo, hi, eps=2.2e-16, max_steps=50)
    ref = optimize.lsq_linear(M, y, bounds=([-np.inf, -np.inf], [0.0, np.inf]), tol=1e-14)
    assert st["status"][0] == _lm.LMStatus.CONVERGED
    assert st["it"][0] <= 3
    # converged means a relative decrement below 1e-10: x1 within ~1e-6 of the optimum 0.95
    np.testing.assert_allclose(st["x"][0], ref.x, atol=1e-5)
    assert st["x"][0, 0] == 0.0  # exactly at the bound


@pytest.mark.parametrize("n", [1, 3, 4, 5, 8, 9, 31, 32, 33, 40, 100])
def test_lane_chunks_cover_every_lane_once_in_two_call_shapes(n):
    chunks = lane_chunks(n, 32)
    covered = np.concatenate([np.arange(c0, min(c0 + q, n)) for c0, q in chunks])
    np.testing.assert_array_equal(covered, np.arange(n))
    assert {q for _, q in chunks} <= {32, SMALL_LANES}
    assert sum(q for _, q in chunks) - n < 32  # padding below one large call


def test_bounded_lm_matches_scipy_trf_on_a_nonlinear_problem():
    """Exponential decay ``a exp(-k t) + c`` with ``k`` bounded above below its free optimum."""
    t = np.linspace(0, 4, 40)
    rng = np.random.default_rng(1)
    y = 2.0 * np.exp(-1.3 * t) + 0.5 + 0.01 * rng.normal(size=t.size)

    def resid(p):
        return p[0] * np.exp(-p[1] * t) + p[2] - y

    def jac(p):
        e = np.exp(-p[1] * t)
        return np.stack([e, -p[0] * t * e, np.ones_like(t)], 1)

    def evaluate(x, rows):
        out = [(0.5 * resid(p) @ resid(p), jac(p).T @ jac(p), jac(p).T @ resid(p)) for p in x]
        return (
            np.array([o[0] for o in out]),
            np.array([o[1] for o in out]),
            np.array([o[2] for o in out]),
            np.ones(len(x), bool),
            np.zeros((len(x), 1)),
        )

    lo, hi = np.array([0.0, 0.0, -np.inf]), np.array([np.inf, 1.0, np.inf])
    ref = optimize.least_squares(
        resid, [1.0, 0.5, 0.0], jac=jac, bounds=(lo, hi), method="trf", xtol=1e-15, ftol=1e-15, gtol=1e-15
    ).x
    st = _lm.solve(evaluate, np.array([[1.0, 0.5, 0.0]]), np.arange(1), lo[None], hi[None], eps=2.2e-16, max_steps=200)
    assert st["status"][0] == _lm.LMStatus.CONVERGED
    assert st["x"][0, 1] == 1.0  # the rate sits exactly on its bound
    # SciPy's trf approaches a bound from the inside (its iterates stay strictly feasible)
    np.testing.assert_allclose(st["x"][0], ref, rtol=1e-6)
    # a flat direction: x2 duplicated in a redundant column leaves A singular; still converges
    assert _lm.decrement(st["A"], st["g"], st["cost"], st["x"], lo[None], hi[None], st["floor"])[0] < 1e-10


def test_lm_reports_max_steps_honestly():
    M = np.array([[1.0, 0.0], [0.0, 1e-3], [1.0, 1.0]])
    y = np.array([1.0, 2.0, 3.0])
    st = _lm.solve(
        _linear_problem(M, y),
        np.zeros((1, 2)),
        np.arange(1),
        np.full((1, 2), -np.inf),
        np.full((1, 2), np.inf),
        eps=2.2e-16,
        max_steps=1,
    )
    assert st["status"][0] in (_lm.LMStatus.MAX_STEPS, _lm.LMStatus.CONVERGED)
    if st["status"][0] == _lm.LMStatus.MAX_STEPS:
        assert st["opt"][0] > _lm.opt_tol(2.2e-16)


def _large_residual(lams):
    """``evaluate`` of ``1/2 sum_i (x_i + 1)^2 + (lam_i x_i^2 + x_i - 1)^2`` (Nocedal & Wright,
    Numerical Optimization, 2nd ed., sec. 10.3): its minimum is ``x = 0`` at cost ``len(lams)``,
    where Gauss-Newton converges linearly with rate ``lam_i`` in coordinate ``i`` (the
    residual's curvature, which ``J^T J`` leaves out, is ``2 lam_i`` of the Hessian's
    ``2 - 2 lam_i``)."""
    lams = np.asarray(lams, float)

    def evaluate(x, rows):
        r1, r2 = x + 1.0, lams * x * x + x - 1.0
        j2 = 2 * lams * x + 1.0
        A = np.einsum("ai,ij->aij", 1.0 + j2 * j2, np.eye(len(lams)))
        g = r1 + r2 * j2
        cost = 0.5 * np.sum(r1 * r1 + r2 * r2, 1)
        return cost, A, g, np.ones(len(x), bool), np.zeros((len(x), 1))

    return evaluate


def test_lm_extrapolates_a_linear_gauss_newton_tail(monkeypatch):
    """On a large-residual problem Gauss-Newton converges linearly (rates 0.9 and 0.3 here);
    the extrapolated trial (Aitken's sum of the geometric steps) reaches the same minimum,
    x = 0 (exact), in far fewer iterations, and every accepted point lowers the cost."""
    evaluate = _large_residual([0.9, 0.3])
    costs = []

    def recorded(x, rows):
        out = evaluate(x, rows)
        costs.append(out[0])
        return out

    inf = np.full((1, 2), np.inf)
    st = _lm.solve(recorded, np.array([[1.0, 1.0]]), np.arange(1), -inf, inf, eps=2.2e-16, max_steps=500)
    monkeypatch.setattr(_lm, "EXTRAPOLATE_MAX", 1.0)  # factors below 1.5 are never tried
    plain = _lm.solve(evaluate, np.array([[1.0, 1.0]]), np.arange(1), -inf, inf, eps=2.2e-16, max_steps=500)
    assert st["status"][0] == plain["status"][0] == _lm.LMStatus.CONVERGED
    # a relative decrement below 1e-10 at cost 2 with curvature >= 0.2 leaves |x| below ~1e-4
    np.testing.assert_allclose(st["x"][0], 0.0, atol=1e-4)
    np.testing.assert_allclose(st["cost"][0], 2.0, rtol=1e-9)
    assert st["it"][0] <= plain["it"][0] / 2, (st["it"][0], plain["it"][0])
    # every evaluation after the start is of a trial; the kept costs never rise
    kept = np.minimum.accumulate([np.min(c) for c in costs])
    assert st["cost"][0] == kept[-1]


def test_lm_stops_starts_that_cannot_reach_a_converged_start_of_their_problem(monkeypatch):
    """Three starts of one group: one at its minimum (cost 0.25), one descending to the same
    minimum from afar, one crawling linearly (rate 0.95, not extrapolated here) towards a
    minimum at cost 1. The crawl stops as ``OUTRUN`` (it cannot reach 0.25), the descent
    does not; without groups the crawl runs to its own minimum, above the best."""
    monkeypatch.setattr(_lm, "EXTRAPOLATE_MAX", 1.0)
    crawl = _large_residual([0.95])
    near = _linear_problem(np.array([[1.0], [1.0]]), np.array([0.0, 1.0]))  # x = 0.5, cost 0.25

    def evaluate(x, rows):
        parts = [(crawl if r == 1 else near)(x[i : i + 1], rows[i : i + 1]) for i, r in enumerate(rows)]
        return tuple(np.concatenate([p[k] for p in parts]) for k in range(5))

    x0, rows = np.array([[0.5], [2.0], [40.0]]), np.array([0, 1, 2])
    inf = np.full((3, 1), np.inf)
    st = _lm.solve(evaluate, x0, rows, -inf, inf, eps=2.2e-16, max_steps=500, groups=np.zeros(3, int))
    alone = _lm.solve(evaluate, x0, rows, -inf, inf, eps=2.2e-16, max_steps=500)
    assert list(st["status"]) == [_lm.LMStatus.CONVERGED, _lm.LMStatus.OUTRUN, _lm.LMStatus.CONVERGED]
    assert list(alone["status"]) == [_lm.LMStatus.CONVERGED] * 3
    assert st["it"][1] < alone["it"][1] / 4, (st["it"][1], alone["it"][1])
    np.testing.assert_allclose(st["cost"][[0, 2]], 0.25, rtol=1e-12)
    # above the best, so never the best; a crawl at rate 0.95 stops with up to ~1e-10 / (1 -
    # 0.95) of relative cost still to descend
    np.testing.assert_allclose(alone["cost"][1], 1.0, rtol=1e-8)
    np.testing.assert_array_equal(st["x"][[0, 2]], alone["x"][[0, 2]])


@pytest.mark.parametrize("n", [5, 6, 9, 10, 17, 40])
def test_median_interval_coverage_is_the_binomial_one(n):
    x = np.arange(n, dtype=float)
    lo, hi, cov = _combine.median_interval(x)
    j = int(lo) + 1  # lo = x_(j)
    assert hi == x[n - j]
    assert cov == pytest.approx(1 - 2 * stats.binom.cdf(j - 1, n, 0.5))
    if n >= 6:
        assert cov >= 0.95
        # the next narrower interval would fall below 95 %
        assert 1 - 2 * stats.binom.cdf(j, n, 0.5) < 0.95
    # empirical: for iid normal samples the interval covers the median at (at least) its coverage
    rng = np.random.default_rng(n)
    hits = np.mean([(lambda a: a[0] <= 0 <= a[1])(_combine.median_interval(rng.normal(size=n))) for _ in range(3000)])
    assert hits == pytest.approx(cov, abs=0.02)


def test_sandwich_covariance_of_a_clustered_least_squares_fit():
    """A least-squares mean over windows of unequal length whose samples share a per-window
    effect (model error) of spread ``tau``: the estimate's variance over many draws (Monte
    Carlo, the independent truth) against :func:`sandwich` evaluated on each draw (mean over
    draws; 10 % tolerance on the standard error for the Monte Carlo's own noise, 2000 draws)."""
    rng = np.random.default_rng(5)
    sizes = rng.integers(20, 200, size=40)  # windows of unequal length
    tau, sigma = 0.3, 0.05
    g = np.repeat(np.arange(sizes.size), sizes)
    A = np.array([[float(sizes.sum())]])  # Gauss-Newton matrix of r = y - beta
    draws, preds = [], []
    for _ in range(2000):
        y = tau * rng.normal(size=sizes.size)[g] + sigma * rng.normal(size=g.size)
        beta = y.mean()
        scores = -np.bincount(g, weights=y - beta)[:, None]  # per-window gradient J^T r
        draws.append(beta)
        preds.append(_combine.sandwich(A, scores)[0, 0])
    assert math.sqrt(np.mean(preds)) == pytest.approx(np.std(draws), rel=0.1)
    # the noise-only error of the same fit is ~20x smaller: what a joint fit's Gauss-Newton reports
    assert sigma / math.sqrt(sizes.sum()) < np.std(draws) / 20


def test_cluster_dof_counts_the_windows_that_carry_the_fit():
    """Equal influences: ``G - 1`` (the usual cluster-robust degrees of freedom); one window
    carrying the estimate: 1; two equal windows among negligible ones: about 1."""
    assert _combine.cluster_dof(np.ones((1, 10)))[0] == pytest.approx(9.0)
    assert _combine.cluster_dof(np.array([[1.0, 1e-3, -1e-3, 1e-3]]))[0] == pytest.approx(1.0)
    assert _combine.cluster_dof(np.array([[1.0, -1.0, 1e-3, 1e-3, 1e-3]]))[0] == pytest.approx(1.0, abs=1e-3)
    assert np.isnan(_combine.cluster_dof(np.zeros((1, 4)))[0])  # nothing moves it: a fixed scale


def test_lower_bounds_of_reported_quantities():
    """Intervals are cut at what is physically possible: moments, ratios of moments, drag and
    angles >= 0, ratios of principal moments >= 1, products of inertia unbounded."""
    for name in ("Ix/Iy", "Iz/Iy", "Ix", "Iy", "Iz", "drag/Iy", "drag_x/Iy", "drag", "misalignment_deg"):
        assert _derived.lower_bound(name) == 0.0, name
    assert _derived.lower_bound("Imid/Imin") == _derived.lower_bound("Imax/Imin") == 1.0
    for name in ("Ixy/Iy", "Ixz/Iy", "Iyz/Iy", "Ixy", "Iyz"):
        assert _derived.lower_bound(name) == -math.inf, name


def test_consistency_names_the_other_body():
    rng = np.random.default_rng(4)
    racquet = {f"rec{i}": np.exp(np.log([13.5, 14.5]) + 0.08 * rng.normal(size=(12, 2))) for i in range(3)}
    phone = {"phone": np.exp(np.log([3.7, 4.6]) + 0.05 * rng.normal(size=(6, 2)))}
    main, excluded, summaries = _combine.consistency({**racquet, **phone}, ["Ix/Iy", "Iz/Iy"])
    assert sorted(main) == ["rec0", "rec1", "rec2"] and list(excluded) == ["phone"]
    assert "Ix/Iy 3." in excluded["phone"] and summaries["phone"]["Ix/Iy"]["n"] == 6
    # the same body at a 6 % offset (another throw style): agrees, pooled
    shifted = {"rec3": racquet["rec0"] * 1.06}
    main, excluded, _ = _combine.consistency({**racquet, **shifted}, ["Ix/Iy", "Iz/Iy"])
    assert len(main) == 4 and not excluded


def test_the_pooled_recordings_are_the_largest_group_that_agrees_pairwise():
    """``agreement_groups`` against a brute force over every subset (the largest total
    weight among the subsets in which every pair agrees; ties: the earliest first member):
    the QA case (A disagrees with C and D; B, loosely determined, agrees with all three: the
    former greedy growth put B with A and left it out although it agrees with the pooled C
    and D), a tie (two groups of as many windows: the left-out one is told that the listing
    order chose; two single-toss recordings of different ratios through ``consistency``) and
    300 random sets of up to 7 recordings, their ties against the brute force's."""
    import itertools

    def brute(values, spread, weight):
        order = list(values)

        def agree(a, b):
            d = np.abs(values[a] - values[b])
            ok = (d <= _combine.Z_AGREE * np.hypot(spread[a], spread[b])) | (d <= math.log1p(_combine.REL_AGREE))
            return bool(np.all(ok))

        best, groups = None, []
        for r in range(len(order), 0, -1):
            for c in itertools.combinations(order, r):
                if all(agree(a, b) for a, b in itertools.combinations(c, 2)):
                    groups.append(c)
                    k = (sum(weight[x] for x in c), [-order.index(x) for x in c])
                    if best is None or k > best[0]:
                        best = (k, list(c))
        # ties: the other maximal agreeing groups (no recording can join) of the same weight
        maximal = [c for c in groups if not any(set(c) < set(g) for g in groups)]
        ties = {c for c in maximal if list(c) != best[1] and sum(weight[x] for x in c) == best[0][0]}
        return best[1], ties

    values = {s: np.log(np.array([v])) for s, v in dict(A=4.0, B=9.0, C=13.0, D=14.0).items()}
    spread = dict(A=np.array([0.02]), B=np.array([1.0]), C=np.array([0.02]), D=np.array([0.02]))
    weight = dict(A=5, B=1, C=4, D=4)
    main, apart, ties = _combine.agreement_groups(values, spread, weight)
    assert (main, set()) == (["B", "C", "D"], set()) == brute(values, spread, weight) and apart == {"A": ["C", "D"]}
    assert not ties and _combine.tie_note("A", ties) == ""
    # A (5 windows) against C and D (5 between them): a tie; the listing order pools A
    weight["D"] = 1
    main, apart, ties = _combine.agreement_groups(values, spread, weight)
    assert main == ["A", "B"] and ties == [["B", "C", "D"]] and "as the pooled group" in _combine.tie_note("C", ties)
    pooled, excluded, _ = _combine.consistency({"a": [[4.0, 5.0]], "b": [[13.0, 14.0]]}, ["Ix/Iy", "Iz/Iy"])
    assert pooled == ["a"] and "the listing order chose" in excluded["b"]
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 8))
        names = [f"r{i}" for i in range(n)]
        values = {s: rng.normal(0.0, 0.5, 2) for s in names}
        spread = {s: np.exp(rng.normal(-2.5, 1.0, 2)) for s in names}
        weight = {s: int(rng.integers(1, 6)) for s in names}
        main, apart, ties = _combine.agreement_groups(values, spread, weight)
        assert (main, {tuple(t) for t in ties}) == brute(values, spread, weight)
        assert all(them and set(them) <= set(main) for them in apart.values()) and set(apart) == set(names) - set(main)


def test_chart_jacobian_matches_central_differences():
    """The optimiser's chart (second moments, rotation vector about R_ref, drag) to model
    values: its hand-written Jacobian (the SO(3) right Jacobian for the axes) against central
    differences (step 1e-6: error ~1e-10)."""
    from scipy.spatial.transform import Rotation

    from rigidjax.identify._model import Spec, chart_theta

    spec = Spec(True, "diagonal", False)
    x = np.array([[0.7, 12.0, 0.4, -1.1, 0.8, 0.01, 0.02, 0.03]])
    R_ref = Rotation.from_rotvec([0.3, 0.1, -0.2]).as_matrix()[None]
    _, T = chart_theta(x, R_ref, spec)
    fd = np.zeros_like(T)
    for j in range(x.shape[1]):
        h = 1e-6
        a, b = x.copy(), x.copy()
        a[0, j] += h
        b[0, j] -= h
        fd[0, :, j] = (chart_theta(a, R_ref, spec)[0] - chart_theta(b, R_ref, spec)[0])[0] / (2 * h)
    np.testing.assert_allclose(T, fd, atol=1e-8)


def test_median_se_of_a_fixed_value_is_zero():
    """A value fixed in every window (a given scale) has no error, per window as in a joint fit;
    nan only where no window has a finite error."""
    assert _combine.median_se_stat([0.0, 0.0, 0.0]) == 0.0
    assert np.isnan(_combine.median_se_stat([np.nan, np.inf]))
    assert _combine.median_se_stat([0.1, 0.1]) == pytest.approx(1.2533 * 0.1 / math.sqrt(2))


def test_fits_run_numpys_blas_on_one_thread():
    """The fits' host linear algebra runs on one BLAS thread (``_lm.one_blas_thread``: a
    multithreaded OpenBLAS beside XLA's thread pool waits more than it works on small
    matrices); the process's own setting is restored afterwards."""
    from threadpoolctl import threadpool_info

    from rigidjax import identify
    from rigidjax.identify import _lm

    def blas_threads():
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    before = blas_threads()
    assert before, threadpool_info()  # NumPy's OpenBLAS, found
    assert _lm.one_blas_thread(blas_threads)() == [1] * len(before)
    assert blas_threads() == before
    for f in (identify.fit, identify.fit_many, identify.fit_inertia):
        assert f.__wrapped__ is not None and "Fit" in (f.__doc__ or ""), f
    # concurrent fits in two threads (they share the process's BLAS), the first to start
    # ending first: the caller's setting comes back after the last (QA: each call restoring
    # what it had found left one thread for good). In a fresh process: what a thread sees
    # after another set a count depends on OpenBLAS's state (under pytest the old rule
    # passed), only the end state is asserted.
    code = """if True:
        import threading
        from threadpoolctl import threadpool_info, threadpool_limits
        from rigidjax.identify import _lm

        def blas_threads():
            return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

        entered = [threading.Event(), threading.Event()]
        leave = [threading.Event(), threading.Event()]

        def hold(i):
            entered[i].set()
            assert leave[i].wait(30)

        threadpool_limits(limits=2, user_api="blas")
        _lm.one_blas_thread(blas_threads)()  # a fit in the main thread first
        threads = [threading.Thread(target=_lm.one_blas_thread(hold), args=(i,)) for i in range(2)]
        for i in range(2):
            threads[i].start()
            assert entered[i].wait(30)
        for i in range(2):
            leave[i].set()
            threads[i].join(30)
        print(blas_threads())
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-2] == str([2] * len(before)), out.stdout
    # fit_inertia's warnings still name the caller's line, not the wrapper's
    t = np.arange(5) * 0.01
    with pytest.warns(UserWarning, match="unidentifiable") as caught:
        identify.fit_inertia((t, np.ones((5, 3))))
    assert {w.filename for w in caught} == {__file__}, [(w.filename, w.lineno) for w in caught]


def test_a_recording_without_a_converged_window_is_named():
    """The status line counts windows by status; a recording none of whose windows converged
    (QA: a file of random rates beside round 2, every window ``unidentifiable``) is named too,
    where other recordings are pooled, and only then."""
    from rigidjax.identify import FitStatus as S
    from rigidjax.identify._windows import _overall

    rows = [
        {"name": "a#0", "recording": "a", "status": S.CONVERGED},
        {"name": "a#1", "recording": "a", "status": S.POOR_FIT},
        {"name": "b#0", "recording": "b", "status": S.UNIDENTIFIABLE},
        {"name": "c#0", "recording": "c", "status": S.INCONSISTENT},
    ]
    status, message = _overall(rows, {"c": "disagrees"})
    assert status == S.INCONSISTENT and "1 of 4 window(s) unidentifiable" in message
    assert "no window of 1 recording(s) converged, none of them pooled: b" in message and "pooled: b;" not in message
    _, message = _overall([dict(r, status=S.MAX_STEPS) for r in rows[:3]], {})
    assert "no window of" not in message  # nothing pooled at all: the counts say it


def test_total_covariance_bias_rows_are_the_reported_total_errors():
    """``covariance()["matrix_total"]``'s bias rows are scaled to ``combined["bias"]``'s
    ``total_se`` (correlations kept); a recording whose total is not measured (one pooled
    window: ``None``) gets its statistical error, not the raw sandwich (QA: a one-window
    recording's bias_x had a raw sandwich 230x below its statistical error)."""
    from types import SimpleNamespace

    from rigidjax.identify import InertiaFit

    names = [f"bias_{c} ({r})" for r in "ab" for c in "xyz"]
    fake = SimpleNamespace(
        combined={
            "bias": {
                "a": {"se": [1.0, 2, 3], "total_se": [4.0, 5, 6]},
                "b": {"se": [7.0, 8, 9], "total_se": [None] * 3},
            }
        },
        total_uncertainties={},
    )
    extra = InertiaFit._bias_totals(fake, names)
    assert extra == dict(zip(names, [4.0, 5, 6, 7, 8, 9]))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 6))
    raw = a @ a.T * 1e-6  # a sandwich far below the errors
    out = InertiaFit._match_total(fake, raw, names, extra)
    np.testing.assert_allclose(np.sqrt(np.diag(out)), [4, 5, 6, 7, 8, 9], rtol=1e-12)
    d = np.sqrt(np.diag(raw))
    np.testing.assert_allclose(out / np.sqrt(np.outer(np.diag(out), np.diag(out))), raw / np.outer(d, d), rtol=1e-12)


def test_the_layer_reaches_optimistix_least_squares_minimum():
    """``identify.fit`` (this optimiser, one start) and ``optimistix.LevenbergMarquardt`` (an
    independent solver on the same residual function) reach the same cost on a body with
    known torques (9 unknowns), through ``benchmarks/bench_lm.compare`` as its table runs
    it (so the benchmark keeps working). Both stop at a relative decrement / step of 1e-10:
    costs agree to 1e-9 relative."""
    from benchmarks.bench_lm import compare, torque_problem

    ours, theirs = compare("known-torques", torque_problem(1), repeats=1)
    assert ours["status"] == "converged" and theirs["status"] == "successful"
    np.testing.assert_allclose(ours["cost"], theirs["cost"], rtol=1e-9)
