"""The midpoint step's closed-form solve against a general LU solve of the seed's 6x6 system.

``rigidjax.midpoint`` solves ``(M/dt + R - K/2) dV = rhs`` by block elimination with cofactor
3x3 inverses on per-component arrays (for speed, see benchmarks/README.md). The independent
truth here is ``jnp.linalg.solve`` (LAPACK LU with partial pivoting, a different algorithm)
on the dense matrix built by ``step_matrix``, and the step's defining equation assembled in
the test from the seed's formula. Cases: random coupled (non-symmetric) resistance,
non-diagonal inertia, batched shapes, float32 and float64, broadcasting body vs state.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rigidjax as rj
from rigidjax import midpoint as mp


def _random_body(rng, batch=(), coupled=True, dtype=np.float64):
    n = int(np.prod(batch)) if batch else 1
    inertia, resistance = [], []
    for _ in range(n):
        L = rng.uniform(0.2, 2.0, 3)  # second moments -> physical principal moments
        Q = np.linalg.qr(rng.normal(size=(3, 3)))[0]
        inertia.append(Q @ np.diag([L[1] + L[2], L[0] + L[2], L[0] + L[1]]) @ Q.T)
        B = rng.normal(size=(6, 6)) * 0.3
        R = B @ B.T + rng.normal(size=(6, 6)) * 0.1  # dissipative part + non-symmetric part
        if not coupled:
            R[:3, 3:] = R[3:, :3] = 0
        resistance.append(R)
    shape = lambda a, tail: np.asarray(a).reshape(batch + tail).astype(dtype)  # noqa: E731
    mass = shape(rng.uniform(0.5, 3.0, n), ())
    return rj.RigidBody(
        mass, shape(inertia, (3, 3)), resistance=shape(resistance, (6, 6)), gravity=shape(rng.normal(size=(n, 3)), (3,))
    )


_solve = jax.jit(mp.step_solve)
_lu = jax.jit(lambda body, omega, rhs, dt: jnp.linalg.solve(mp.step_matrix(body, omega, dt), rhs[..., None])[..., 0])
_step_mid = jax.jit(lambda body, state, wrench, dt: rj.midpoint_step(body, state, wrench, dt, attitude="midpoint"))
_step = jax.jit(rj.midpoint_step)

# LU and block elimination are both backward stable on these well-conditioned systems
# (cond ~ 1e1..1e3): agreement to a few hundred ulps of the solution's scale
TOL = {np.float64: 1e-11, np.float32: 2e-4}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
# (2, 3): two batch axes; a separate compilation per dtype, so kept out of the CI budget
@pytest.mark.parametrize("batch", [(), (7,), pytest.param((2, 3), marks=pytest.mark.slow)])
def test_step_solve_equals_lu(dtype, batch):
    rng = np.random.default_rng(hash((batch, dtype == np.float32)) % 2**32)
    body = _random_body(rng, batch, dtype=dtype)
    omega = jnp.asarray(rng.normal(size=batch + (3,)) * 3, dtype)
    rhs = jnp.asarray(rng.normal(size=batch + (6,)), dtype)
    for dt in (1e-3, 0.05):
        dt = jnp.asarray(dt, dtype)
        got = _solve(body, omega, rhs, dt)
        A = mp.step_matrix(body, omega, dt)
        want = _lu(body, omega, rhs, dt)
        assert got.dtype == jnp.dtype(dtype) and got.shape == want.shape
        scale = float(jnp.abs(want).max())
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=TOL[dtype] * scale)
        # and it really solves the system (residual relative to |A||x|)
        res = jnp.einsum("...ij,...j->...i", A, got) - rhs
        assert float(jnp.abs(res).max()) <= TOL[dtype] * float(jnp.abs(A).max()) * scale * 10


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_midpoint_step_satisfies_seed_equation(dtype):
    # the whole step: V' - V = (M/dt + R - K/2)^-1 (F - [0; w x I w] - R V), solved by LU here
    rng = np.random.default_rng(3)
    batch = (5,)
    body = _random_body(rng, batch, dtype=dtype)
    q0 = rng.normal(size=batch + (4,))
    state = rj.RigidBodyState(
        position=rng.normal(size=batch + (3,)).astype(dtype),
        orientation=(q0 / np.linalg.norm(q0, axis=-1, keepdims=True)).astype(dtype),
        velocity=rng.normal(size=batch + (3,)).astype(dtype),
        angular_velocity=(rng.normal(size=batch + (3,)) * 2).astype(dtype),
    )
    wrench = jnp.asarray(rng.normal(size=batch + (6,)), dtype)
    dt = 0.01
    new, info = _step_mid(body, state, wrench, jnp.asarray(dt, dtype))
    w = state.angular_velocity
    gyro = jnp.cross(w, jnp.einsum("...ij,...j->...i", body.inertia, w))
    F = wrench + jnp.concatenate([body.mass[..., None] * body.gravity, -gyro], -1)
    rhs = F - jnp.einsum("...ij,...j->...i", body.resistance, state.twist)
    dV = jnp.linalg.solve(mp.step_matrix(body, w, jnp.asarray(dt, dtype)), rhs[..., None])[..., 0]
    V1 = state.twist + dV
    scale = float(jnp.abs(V1).max())
    np.testing.assert_allclose(np.asarray(new.twist), np.asarray(V1), rtol=0, atol=TOL[dtype] * scale * 10)
    np.testing.assert_allclose(
        np.asarray(new.position), np.asarray(state.position + dt * V1[..., :3]), rtol=0, atol=TOL[dtype] * 10
    )
    q_want = rj.so3.normalize(rj.so3.multiply(state.orientation, rj.so3.exp(dt * 0.5 * (w + V1[..., 3:]))))
    np.testing.assert_allclose(np.asarray(new.orientation), np.asarray(q_want), rtol=0, atol=TOL[dtype] * 10)
    assert new.orientation.dtype == jnp.dtype(dtype)
    assert np.all(np.asarray(info.status) == int(rj.Status.SUCCESS))


def test_broadcast_one_body_many_states_and_uncoupled():
    # one (unbatched) body, a batch of states: every member equals its own unbatched step
    rng = np.random.default_rng(5)
    body = _random_body(rng, (), coupled=False)
    w = jnp.asarray(rng.normal(size=(4, 3)))
    state = rj.RigidBodyState(angular_velocity=w, velocity=jnp.asarray(rng.normal(size=(4, 3))))
    new, info = _step(body, state, None, 0.02)
    for k in range(4):
        sk = rj.RigidBodyState(angular_velocity=w[k], velocity=state.velocity[k])
        nk, _ = _step(body, sk, None, 0.02)
        np.testing.assert_allclose(new.twist[k], nk.twist, rtol=1e-13, atol=1e-14)  # same arithmetic, batched
    assert new.twist.shape == (4, 6) and info.status.shape == (4,)


def test_singular_system_reports_nonfinite_and_keeps_state():
    # a body whose rotation block is singular at this dt (K/2 cancels I/dt for a crafted omega
    # is hard to hit; a zero-inertia rotation block via resistance -I/dt is exact): NONFINITE
    dt = 0.1
    inertia = np.array([1.0, 2.0, 3.0])
    R = np.zeros((6, 6))
    R[3:, 3:] = -np.diag(inertia) / dt  # makes I/dt + R_ww = 0 (non-physical, negative damping)
    body = rj.RigidBody(1.0, inertia, resistance=R)
    state = rj.RigidBodyState(angular_velocity=[0.0, 0.0, 0.0], velocity=[1.0, 0, 0])
    new, info = _step(body, state, jnp.array([0, 0, 0, 1.0, 0, 0]), dt)
    assert int(info.status) == int(rj.Status.NONFINITE)
    np.testing.assert_array_equal(np.asarray(new.twist), np.asarray(state.twist))


def test_gradient_matches_finite_differences():
    # reverse mode through the closed-form solve (and the materialisation's custom JVP):
    # directional derivatives along a symmetric inertia perturbation, the mass and omega0
    rng = np.random.default_rng(11)
    body = _random_body(rng, ())
    S = rng.normal(size=(3, 3))
    S = jnp.asarray(S + S.T)

    def f(eps, mass, omega0):
        b = rj.RigidBody(mass, body.inertia + eps * S, resistance=body.resistance, gravity=body.gravity)
        state = rj.RigidBodyState(angular_velocity=omega0, velocity=jnp.array([0.1, 0.2, -0.3]))
        new, _ = rj.midpoint_step(b, state, None, 0.05, attitude="midpoint")
        return jnp.sum(new.twist**2) + jnp.sum(new.orientation * jnp.arange(4.0))

    args = (jnp.asarray(0.0), body.mass, jnp.array([0.3, -1.0, 2.0]))
    grads = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(*args)
    fj = jax.jit(f)
    h = 1e-6
    # central differences: truncation O(h^2) ~ 1e-12, round-off ~ eps/h ~ 1e-10
    for k in range(3):
        a = np.asarray(args[k], dtype=float)
        for idx in np.ndindex(a.shape):
            e = np.zeros_like(a)
            e[idx] = h
            up = list(args)
            dn = list(args)
            up[k], dn[k] = jnp.asarray(a + e), jnp.asarray(a - e)
            fd = (fj(*up) - fj(*dn)) / (2 * h)
            np.testing.assert_allclose(float(np.asarray(grads[k])[idx]), float(fd), rtol=1e-6, atol=1e-8)
