"""rigidjax.linalg: the LAPACK-free small dense solver of the Newton loops.

Truths: numpy.linalg.solve (LAPACK, independent implementation) within the forward-error
bound of a backward-stable solve, hand-checked pivot sequences, exact rank deficiency,
central finite differences for gradients, and the compiled HLO's custom-call targets.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rigidjax.linalg import SMALL_MAX, singular, solve_small, solve_small_pivots

# one jitted, vmapped solve reused by every case (compiles once per shape/dtype)
_solve_batch = jax.jit(jax.vmap(solve_small))


@jax.jit
def _pivots_flag(A):
    x, piv = solve_small_pivots(A, jnp.ones(A.shape[:-1], A.dtype))
    return piv, singular(piv)


def _random_system(rng, batch, n, k=None):
    A = rng.standard_normal((batch, n, n))
    b = rng.standard_normal((batch, n) if k is None else (batch, n, k))
    return A, b


@pytest.mark.parametrize("n", [1, 3, 7, 10, SMALL_MAX, SMALL_MAX + 4])
def test_random_systems_match_numpy(n):
    # SMALL_MAX + 4 exercises the LAPACK fallback through the same API
    rng = np.random.default_rng(n)
    A, b = _random_system(rng, 64, n)
    x = np.asarray(_solve_batch(jnp.asarray(A), jnp.asarray(b)))
    ref = np.linalg.solve(A, b[..., None])[..., 0]
    cond = np.linalg.cond(A)
    err = np.linalg.norm(x - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
    # both solves are backward stable (GEPP, small growth for random matrices): each has
    # forward error <~ n * cond * eps, so their difference is below 4 n cond eps
    eps = np.finfo(np.float64).eps
    assert np.all(err <= 4 * n * cond * eps), (err / (n * cond * eps)).max()


def test_float32_follows_dtype_and_accuracy():
    rng = np.random.default_rng(1)
    A, b = _random_system(rng, 64, 10)
    A32, b32 = jnp.asarray(A, jnp.float32), jnp.asarray(b, jnp.float32)
    x = _solve_batch(A32, b32)
    assert x.dtype == jnp.float32
    assert jax.eval_shape(solve_small_pivots, A32, b32)[1].dtype == jnp.float32
    # truth: the float64 solve of the same (rounded) float32 data
    ref = np.linalg.solve(np.asarray(A32, np.float64), np.asarray(b32, np.float64)[..., None])[..., 0]
    cond = np.linalg.cond(np.asarray(A32, np.float64))
    err = np.linalg.norm(np.asarray(x, np.float64) - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
    # one backward-stable float32 solve against an exact one: n cond eps32 (factor 4 margin)
    assert np.all(err <= 4 * 10 * cond * np.finfo(np.float32).eps)


def test_multiple_right_hand_sides_and_broadcast():
    rng = np.random.default_rng(2)
    A, B = _random_system(rng, 8, 5, k=3)
    X = jax.jit(solve_small)(jnp.asarray(A), jnp.asarray(B))
    assert X.shape == (8, 5, 3)
    ref = np.linalg.solve(A, B)
    # well inside n cond eps for these matrices (cond < 1e3): 1e-11 relative
    np.testing.assert_allclose(X, ref, rtol=0, atol=1e-11 * np.abs(ref).max())
    # one matrix (batch axis of length 1), a batch of right-hand sides: batch axes broadcast
    x = jax.jit(solve_small)(jnp.asarray(A[:1]), jnp.asarray(B[..., 0]))
    assert x.shape == (8, 5)
    np.testing.assert_allclose(x, np.linalg.solve(A[0], B[..., 0].T).T, rtol=0, atol=1e-11 * np.abs(ref).max())


def test_pivoting_zero_leading_pivot():
    # a zero (1,1) entry: elimination without row exchanges divides by zero
    A = np.array([[0.0, 2.0, 1.0], [1.0, 1.0, 0.0], [3.0, 0.0, 1.0]])
    b = np.array([1.0, 2.0, 3.0])
    piv, sing = _pivots_flag(jnp.asarray(A))
    # by hand: pivot row 2 (3); rows 1, 0 become (1, -1/3), (2, 1): pivot 2 (old row 0);
    # last -1/3 - 1/2 = -5/6. Check: |det A| = 5 = 3 * 2 * 5/6
    np.testing.assert_allclose(piv, [3.0, 2.0, 5.0 / 6.0], rtol=4 * np.finfo(float).eps)
    assert not bool(sing)
    np.testing.assert_allclose(jax.jit(solve_small)(jnp.asarray(A), jnp.asarray(b)), np.linalg.solve(A, b), atol=1e-14)


def test_pivoting_tiny_leading_pivot_keeps_accuracy():
    # [[d, 1], [1, 1]] x = [1, 2] with d = 1e-20: x ~ (1, 1). Without row exchange the
    # elimination gives x0 = 0 (catastrophic cancellation); partial pivoting is exact to eps.
    A = jnp.asarray([[1e-20, 1.0], [1.0, 1.0]])
    x = jax.jit(solve_small)(A, jnp.asarray([1.0, 2.0]))
    np.testing.assert_allclose(x, [1.0, 1.0], rtol=4 * np.finfo(float).eps)


def test_singular_matrices_flagged_and_pivots_finite():
    cases = [
        np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]]),  # rank 2 (row 2 = 2 row 1)
        np.array([[0.0, 1.0, 2.0], [0.0, 3.0, 4.0], [0.0, 5.0, 7.0]]),  # zero column
        np.zeros((3, 3)),
        np.array([[1.0, 1.0], [1.0, 1.0 + 1e-17]]),  # singular in float64 round-off
    ]
    for A in cases:
        piv, sing = _pivots_flag(jnp.asarray(A))
        assert bool(sing), A
        # LAPACK's convention: an all-zero column is skipped, the pivots stay finite
        assert np.all(np.isfinite(piv)), A
    # nonsingular but badly scaled rows are NOT flagged (relative test, pivots ~1e-8 ... 1e8)
    A = np.diag([1e-8, 1.0, 1e8]) @ np.array([[2.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 4.0]])
    assert not bool(_pivots_flag(jnp.asarray(A))[1])
    # batched: elementwise over the batch
    Ab = jnp.stack([jnp.eye(3), jnp.asarray(cases[0])])
    flags = jax.jit(lambda a: singular(solve_small_pivots(a, jnp.ones((2, 3)))[1]))(Ab)
    np.testing.assert_array_equal(flags, [False, True])


def test_grad_matches_central_differences():
    rng = np.random.default_rng(3)
    n = 6
    A = rng.standard_normal((n, n)) + 3 * np.eye(n)
    b = rng.standard_normal(n)
    w = rng.standard_normal(n)

    @jax.jit
    def f(A, b):
        return jnp.dot(w, solve_small(A, b))

    gA, gb = jax.jit(jax.grad(f, argnums=(0, 1)))(jnp.asarray(A), jnp.asarray(b))
    # analytic gradient check by central differences (step 1e-6: truncation h^2 ~ 1e-12,
    # round-off eps/h ~ 1e-10 relative) -> 1e-7 tolerance
    h = 1e-6
    fd_A = np.zeros_like(A)
    for i in range(n):
        for j in range(n):
            E = np.zeros_like(A)
            E[i, j] = h
            fd_A[i, j] = (f(A + E, b) - f(A - E, b)) / (2 * h)
    fd_b = np.array([(f(A, b + h * e) - f(A, b - h * e)) / (2 * h) for e in np.eye(n)])
    np.testing.assert_allclose(gA, fd_A, rtol=1e-7, atol=1e-7)
    np.testing.assert_allclose(gb, fd_b, rtol=1e-7, atol=1e-7)
    assert np.all(np.isfinite(gA)) and np.all(np.isfinite(gb))
    # reverse mode through solve_small_pivots (no custom rule; linear in b): A^{-T} w
    gb2 = jax.jit(jax.grad(lambda bb: jnp.dot(w, solve_small_pivots(jnp.asarray(A), bb)[0])))(jnp.asarray(b))
    np.testing.assert_allclose(gb2, np.linalg.solve(A.T, w), rtol=1e-12, atol=1e-12)


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="A must have shape"):
        solve_small(jnp.ones((3, 2)), jnp.ones(3))
    with pytest.raises(ValueError, match="b must have shape"):
        solve_small(jnp.eye(3), jnp.ones(4))


# ----------------------------------------------------------------- no LAPACK in the steps


def _lapack_targets(text):
    # custom-call targets in compiled HLO (custom_call_target="...") or in the lowered
    # StableHLO (stablehlo.custom_call @target): LAPACK calls are emitted at lowering, XLA
    # adds none, so the lowered module (no XLA compile: fast) is checked for the steps
    targets = re.findall(r'custom_call_target="([^"]+)"|custom_call @([\w.$-]+)', text)
    targets = [a or b for a, b in targets]
    return [t for t in targets if re.search("lapack|getrf|potrf|getrs|gesv|trsm", t, re.I)]


def test_detector_sees_lapack():
    # the check below must be able to fail: a batched jnp.linalg.solve calls LAPACK, seen
    # both in the lowered module and in the compiled HLO
    lowered = jax.jit(jax.vmap(jnp.linalg.solve)).lower(jnp.ones((4, 3, 3)), jnp.ones((4, 3)))
    assert _lapack_targets(lowered.as_text())
    assert _lapack_targets(lowered.compile().as_text())


def _batched(tree, N):
    return jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (N, *jnp.shape(a))) + 0, tree)


def test_vmapped_ep_and_vi_steps_have_no_lapack():
    import rigidjax as rj
    from rigidjax import euler_parameters as ep
    from rigidjax import systems
    from rigidjax.variational import vi_step

    body = rj.RigidBody(1.0, jnp.diag(jnp.asarray([1.0, 2.0, 3.0])))
    w0 = jnp.asarray([0.01, 2.0, 0.0])
    model = ep.EPModel(body)
    st = _batched(ep.initial_state(model, angular_velocity=w0[None]), 4)
    # the value and the implicit-function-theorem derivative (tangent solve) of the step
    ep_fn = lambda s, dt: ep.ep_step(model, s, None, dt)
    ep_val_grad = jax.vmap(lambda s, dt: jax.value_and_grad(lambda h: ep_fn(s, h)[0].velocities.sum())(dt))
    txt = jax.jit(ep_val_grad).lower(st, jnp.full((4,), 1e-3)).as_text()
    assert "while" in txt  # the Newton loop is in the module checked
    assert not _lapack_targets(txt)

    system = systems.rigid_body(body)
    vs = _batched(systems.rigid_body_vi_state(system, rj.RigidBodyState(angular_velocity=w0)), 4)
    vi_fn = lambda s, dt: vi_step(system, s, None, dt)
    vi_val_grad = jax.vmap(lambda s, dt: jax.value_and_grad(lambda h: vi_fn(s, h)[0].q.sum())(dt))
    txt = jax.jit(vi_val_grad).lower(vs, jnp.full((4,), 1e-3)).as_text()
    assert "while" in txt
    assert not _lapack_targets(txt)


def test_solve_components_matches_numpy_and_hand_pivots():
    # rigidjax.linalg.solve_components (entry-by-entry elimination of the packed EP step)
    from rigidjax.linalg import solve_components

    n, batch = 8, 64
    rng = np.random.default_rng(11)
    A, b = _random_system(rng, batch, n)
    A[0, :, 0] = 0.0  # one member with an all-zero first column: singular (LAPACK skips it)

    @jax.jit
    def run(A, b):
        x, piv = solve_components([[A[:, i, j] for j in range(n)] for i in range(n)], [b[:, i] for i in range(n)])
        return jnp.stack(x, -1), singular(jnp.stack(piv, -1))

    x, sing = run(jnp.asarray(A), jnp.asarray(b))
    assert bool(sing[0]) and not np.any(np.asarray(sing[1:]))
    ref = np.linalg.solve(A[1:], b[1:, :, None])[..., 0]
    cond = np.linalg.cond(A[1:])
    err = np.linalg.norm(np.asarray(x[1:]) - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
    # two backward-stable GEPP solves: difference below 4 n cond eps (as for solve_small)
    assert np.all(err <= 4 * n * cond * np.finfo(np.float64).eps), (err / (n * cond * np.finfo(float).eps)).max()
    # the hand-checked pivot sequence of test_pivoting_zero_leading_pivot, scalar entries
    A3 = [[0.0, 2.0, 1.0], [1.0, 1.0, 0.0], [3.0, 0.0, 1.0]]
    x3, piv3 = solve_components(
        [[jnp.asarray(a) for a in row] for row in A3], [jnp.asarray(v) for v in (1.0, 2.0, 3.0)]
    )
    np.testing.assert_allclose(piv3, [3.0, 2.0, 5.0 / 6.0], rtol=4 * np.finfo(float).eps)
    np.testing.assert_allclose(x3, np.linalg.solve(np.array(A3), [1.0, 2.0, 3.0]), atol=1e-14)
    with pytest.raises(ValueError, match="n rows of n entries"):
        solve_components([[1.0, 2.0], [3.0]], [1.0, 2.0])


@pytest.mark.slow  # ~20 s (CI budget); the steppers' fixed-vs-traced model tests run these paths end to end
def test_structural_zeros_and_leading_block_pivoting():
    # solve_components with entries given as the structural zero 0.0 (skipped by the
    # elimination) and leading=3 (pivots of the first 3 stages within the leading block: block
    # elimination through the Schur complement), the Euler-parameter Newton matrix's pattern:
    # a mass block m I, coupling partly absent, zero multiplier columns in the constraint rows
    from rigidjax.linalg import lu_solve_components, solve_components

    n, batch = 9, 64
    eps = np.finfo(np.float64).eps
    rng = np.random.default_rng(13)
    A, b = _random_system(rng, batch, n)
    c = rng.standard_normal((batch, n))
    zero = np.zeros((n, n), bool)
    zero[:3, :3] = ~np.eye(3, dtype=bool)  # diagonal mass block
    zero[:3, 3:] = zero[3:, :3] = True  # no translation-rotation coupling ...
    zero[0, 4] = zero[4, 0] = False  # ... but for one pair
    zero[7:, 7:] = True  # constraint rows x multiplier columns
    zero[1, 3] = False  # one entry above the block diagonal
    A[:, zero] = 0.0
    A[:, [0, 1, 2], [0, 1, 2]] = rng.uniform(1.0, 3.0, (batch, 3))  # m > 0
    ref, ref_c = np.linalg.solve(A, b[..., None])[..., 0], np.linalg.solve(A, c[..., None])[..., 0]
    # two backward-stable eliminations (the block one: A11 well conditioned here, growth O(1)):
    # difference below 4 n cond eps, as for solve_small
    bound = 4 * n * np.linalg.cond(A) * eps

    def entries(M):
        return [[0.0 if zero[i, j] else jnp.asarray(M[:, i, j]) for j in range(n)] for i in range(n)]

    for leading in (0, 3):
        for mb in (False, True):
            x, piv, lu = jax.jit(
                lambda Ac, bc: solve_components(Ac, bc, materialize_b=mb, factors=True, leading=leading)
            )(entries(A), [jnp.asarray(b[:, i]) for i in range(n)])
            x2 = jax.jit(lu_solve_components)(lu, [jnp.asarray(c[:, i]) for i in range(n)])
            for got, want in ((x, ref), (x2, ref_c)):
                err = np.linalg.norm(np.stack(got, -1) - want, axis=-1) / np.linalg.norm(want, axis=-1)
                assert np.all(err <= bound), (err / bound).max()
            # |det A| = prod |U_ii| for any row permutation: the pivots are a factorisation's
            np.testing.assert_allclose(np.prod(np.stack(piv, -1), -1), np.abs(np.linalg.det(A)), rtol=1e-10)
            assert not np.any(np.asarray(singular(jnp.stack(piv, -1))))
    # a column that is structurally zero: singular (a zero pivot), as LAPACK's skipped column
    Z = entries(A)
    for i in range(n):
        Z[i][5] = 0.0
    _, piv = solve_components(Z, [jnp.asarray(b[:, i]) for i in range(n)], leading=3)
    assert np.all(np.asarray(singular(jnp.stack(piv, -1))))
    with pytest.raises(ValueError, match="leading must be in"):
        solve_components(entries(A), [jnp.asarray(b[:, i]) for i in range(n)], leading=n + 1)


@pytest.mark.slow  # ~30 s of compiles (CI budget); the packed EP/VI steps reuse these factors in every fast test
def test_factors_solve_further_right_hand_sides():
    # lu_factor_small / lu_solve_small and solve_components(factors=True) / lu_solve_components:
    # the factors a simplified-Newton update reuses solve a NEW right-hand side as LAPACK does
    from rigidjax.linalg import lu_factor_small, lu_solve_components, lu_solve_small, solve_components

    eps = np.finfo(np.float64).eps
    rng = np.random.default_rng(12)
    for n in (1, 8, SMALL_MAX + 2):  # SMALL_MAX + 2: the LAPACK fallback
        A, b = _random_system(rng, 32, n)
        c = rng.normal(size=(32, n, 3))
        ref = np.linalg.solve(A, c)
        # two backward-stable GEPP solves: difference below 4 n cond eps per column (as above)
        bound = 4 * n * np.linalg.cond(A) * eps

        def check(got, want):
            err = np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)
            assert np.all(err <= (bound[:, None] if err.ndim == 2 else bound))

        lu, piv = jax.jit(lu_factor_small)(jnp.asarray(A))
        check(np.asarray(lu_solve_small(lu, jnp.asarray(c))), ref)
        check(np.asarray(lu_solve_small(lu, jnp.asarray(c[..., 0]))), ref[..., 0])
        # the pivots are those of solve_small_pivots (the same elimination)
        np.testing.assert_allclose(np.asarray(piv), np.asarray(solve_small_pivots(A, b)[1]), rtol=1e-12)
        if n > SMALL_MAX:
            continue
        Ac = [[jnp.asarray(A[:, i, j]) for j in range(n)] for i in range(n)]
        for mb in (False, True):
            _, _, f = jax.jit(lambda Ac, b: solve_components(Ac, b, materialize_b=mb, factors=True))(
                Ac, [jnp.asarray(b[:, i]) for i in range(n)]
            )
            check(
                np.stack(jax.jit(lu_solve_components)(f, [jnp.asarray(c[:, i, 0]) for i in range(n)]), -1), ref[..., 0]
            )
    # n = 0: three outputs with factors=True; batch axes kept (empty factors)
    assert len(solve_components([], [], factors=True)) == 3
    lu0, piv0 = lu_factor_small(jnp.zeros((3, 0, 0)))
    assert piv0.shape == (3, 0) and lu_solve_small(lu0, jnp.zeros((3, 0))).shape == (3, 0)
    with pytest.raises(ValueError, match=r"\(\.\.\., n, n\)"):
        lu_factor_small(jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="b must have shape"):
        lu_solve_small(lu_factor_small(jnp.eye(3))[0], jnp.ones(4))


def test_no_lapack_above_small_max():
    # the rolled fallback (n > SMALL_MAX, e.g. two jointed Euler-parameter bodies: 22 unknowns)
    # has no custom call either: value, JVP and reverse mode of the solve and of the factors
    from rigidjax import linalg

    n = SMALL_MAX + 10
    A, b = jnp.ones((4, n, n)) + 5 * jnp.eye(n), jnp.ones((4, n))
    f = jax.vmap(lambda A, b: jax.value_and_grad(lambda A: solve_small(A, b).sum())(A))
    assert not _lapack_targets(jax.jit(f).lower(A, b).as_text())
    g = jax.vmap(lambda A, b: jax.grad(lambda b: linalg.lu_solve_small(linalg.lu_factor_small(A)[0], b).sum())(b))
    assert not _lapack_targets(jax.jit(g).lower(A, b).as_text())


def test_lapack_method_is_an_option():
    # method="lapack" calls LAPACK (getrf) at any size and solves the same systems; a bad name raises
    from rigidjax import linalg

    rng = np.random.default_rng(5)
    for n in (3, SMALL_MAX + 2):
        A, b = _random_system(rng, 4, n)
        x_e = solve_small(jnp.asarray(A), jnp.asarray(b))
        x_l = solve_small(jnp.asarray(A), jnp.asarray(b), method="lapack")
        # two backward-stable GEPP solves: within 4 n cond eps of each other
        bound = 4 * n * np.linalg.cond(A) * np.finfo(np.float64).eps
        err = np.linalg.norm(np.asarray(x_l - x_e), axis=-1) / np.linalg.norm(np.asarray(x_e), axis=-1)
        assert np.all(err <= bound)
        lowered = jax.jit(lambda A, b: solve_small(A, b, method="lapack")).lower(jnp.asarray(A), jnp.asarray(b))
        assert _lapack_targets(lowered.as_text())
        lu, piv = linalg.lu_factor_small(jnp.asarray(A), method="lapack")
        np.testing.assert_allclose(np.asarray(piv), np.asarray(solve_small_pivots(A, b)[1]), rtol=1e-12)
        assert np.all(
            np.linalg.norm(np.asarray(linalg.lu_solve_small(lu, jnp.asarray(b)) - x_e), axis=-1)
            <= bound * np.linalg.norm(np.asarray(x_e), axis=-1)
        )
    with pytest.raises(ValueError, match="method"):
        solve_small(jnp.eye(2), jnp.ones(2), method="lu")


DEADLOCK_PROBE = r"""
import numpy as np, jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
import rigidjax as rj
from rigidjax import so3
from rigidjax.euler_parameters import EPModel, SphericalJoint, initial_state, ep_step
from rigidjax.ensemble import ensemble_rollout
assert len(jax.devices()) == 2
# two jointed rods hung from the origin: 14 coordinates + 8 multipliers = 22 Newton unknowns
bodies = rj.RigidBody(
    np.array([1.0, 0.6]), np.array([[0.021, 0.021, 5e-5], [0.008, 0.008, 3e-5]]), gravity=[0, 0, -9.81]
)
q = np.asarray(so3.exp(jnp.array([0.0, -0.8, 0.0])))
d = np.array([np.sin(0.8), 0.0, -np.cos(0.8)])
ref = np.stack([np.concatenate([0.25 * d, q]), np.concatenate([0.5 * d + 0.2 * d, q])])
joints = [SphericalJoint(0, [0, 0, 0.25]), SphericalJoint(1, [0, 0, 0.2], 0, [0, 0, -0.25])]
model = EPModel(bodies, reference=ref, constraints=joints)
st = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (4096, *jnp.shape(a))) + 0, initial_state(model))
tr = ensemble_rollout(ep_step, model, st, 1e-3, 20, save_every=20, model_batched=False)
print("RESULT", bool(jnp.all(tr.info.converged)))
"""


@pytest.mark.slow
def test_two_device_ensemble_above_small_max_does_not_deadlock():
    # Regression: with LAPACK above SMALL_MAX, this ensemble hung forever at
    # 0 % CPU on a 2-core machine split into 2 host devices: each device's batched getrf waited
    # (ParallelBatchMap) for tasks queued on the shared 2-thread pool that both devices' calls
    # occupied. The rolled elimination has no custom call. Bound: ~2-3 min when it works.
    import os
    import subprocess
    import sys

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", DEADLOCK_PROBE], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RESULT True" in proc.stdout


@pytest.mark.parametrize("which", ["vi", pytest.param("ep", marks=pytest.mark.slow)])  # ep: ~15 s of compiles
def test_steppers_take_the_linear_solver_option(which):
    # GeneralizedAlphaEP / MidpointVI(linear_solver="lapack"): LAPACK in the Newton solve, the
    # same step as the default elimination (both GEPP: the same iterates to round-off), no fast form
    import rigidjax as rj
    from rigidjax import euler_parameters as ep
    from rigidjax import systems
    from rigidjax.stepper import packed_form

    body = rj.RigidBody(1.0, [1.0, 2.0, 3.0])
    w0 = jnp.array([0.01, 2.0, 0.0])
    if which == "ep":
        cls, m = rj.GeneralizedAlphaEP, ep.EPModel(body)
        s = ep.initial_state(m, angular_velocity=w0)
    else:
        cls, m = rj.MidpointVI, systems.rigid_body(body)
        s = systems.rigid_body_vi_state(m, rj.RigidBodyState(angular_velocity=w0))
    default, lapack = cls(), cls(linear_solver="lapack")
    assert packed_form(lapack, m) is None and packed_form(default, m) is not None
    a, info_a = jax.jit(default)(m, s, None, 0.01)
    lowered = jax.jit(lapack).lower(m, s, None, 0.01)
    assert _lapack_targets(lowered.as_text())
    b, info_b = lowered.compile()(m, s, None, 0.01)
    assert int(info_a.status) == int(info_b.status) == 0 and int(info_a.iterations) == int(info_b.iterations)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="linear_solver"):
        cls(linear_solver="cholesky")
