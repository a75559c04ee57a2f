"""Every matrix product the public physics entry points trace runs at full precision.

GPUs that round float32 matmul inputs to TF32 by default (NVIDIA Ampere and later) lose about
three digits in the 3x3 / 4x4 products of the Euler-parameter and variational code (measured on
one H200, jax 0.11.2: ``ep.initial_state`` 4.9e-4 rad/s off at |omega| = 2 rad/s in float32,
against 6e-8 at full precision). The CPU computes every precision alike, so the check here is
structural: in the traced program no ``dot_general`` is left at the default precision (``None``),
which is exactly what the GPU would lower to TF32. A user's own Lagrangian is included: it is
traced inside the step.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import ClosedJaxpr, Jaxpr

import rigidjax as rj
from rigidjax import euler_parameters as ep
from rigidjax import lqr, so3, systems
from rigidjax.midpoint.equations import gyroscopic_jacobian
from rigidjax.ensemble import ensemble_rollout
from rigidjax.variational import MechanicalSystem, discrete_lagrangian, vi_state, vi_step

F32 = jnp.float32


def _dots(jaxpr, acc):
    """The ``precision`` parameter of every ``dot_general`` in ``jaxpr`` and its sub-programs."""
    jaxpr = jaxpr.jaxpr if isinstance(jaxpr, ClosedJaxpr) else jaxpr
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            acc.append(eqn.params["precision"])
        for p in eqn.params.values():
            for x in p if isinstance(p, (list, tuple)) else [p]:
                if isinstance(x, (ClosedJaxpr, Jaxpr)):
                    _dots(x, acc)
    return acc


def _body():
    return rj.RigidBody(jnp.asarray(1.0, F32), jnp.asarray(np.diag([1.0, 2.0, 3.0]), F32))


class _UserLagrangian(eqx.Module):
    """A spherical pendulum written with ``@`` products, as a user would."""

    def __call__(self, q, qdot, t):
        I = jnp.diag(jnp.asarray([1.0, 2.0, 3.0], q.dtype))
        return 0.5 * qdot @ (I @ qdot) - 9.81 * q[-1]


def _midpoint_loss(body, **options):
    def loss(s):
        return jnp.sum(rj.rollout(rj.midpoint_step, body, s, 1e-3, 4, **options).states.angular_velocity[-1] ** 2)

    return loss


def _cases():
    body = _body()
    w = jnp.asarray([0.3, 2.0, -0.1], F32)
    epm = ep.EPModel(body)
    eps = ep.initial_state(epm, angular_velocity=w[None])
    vis = systems.rigid_body(body)
    vs = systems.rigid_body_vi_state(vis, rj.RigidBodyState(angular_velocity=w))
    user = MechanicalSystem(_UserLagrangian(), 3, constraints=lambda q: jnp.atleast_1d((q @ q - 1.0) / 2))
    us = vi_state(user, jnp.asarray([0.0, 0.6, -0.8], F32), jnp.asarray([0.0, 0.8, 0.6], F32), check=False)
    ens = jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), eps)
    ms = rj.RigidBodyState(angular_velocity=w)
    q = jnp.asarray([0.9, 0.1, -0.3, 0.3], F32) / jnp.linalg.norm(jnp.asarray([0.9, 0.1, -0.3, 0.3], F32))
    A = jnp.tile(jnp.eye(4, dtype=F32), (3, 1, 1))
    lqr_args = (jnp.ones((3, 4, 2), F32), jnp.eye(4, dtype=F32), jnp.eye(2, dtype=F32))
    return {
        "kinetic_energy": (lambda s: rj.kinetic_energy(body, s), ms),
        "angular_momentum": (lambda s: rj.angular_momentum(body, s), ms),
        "so3.rotate": (lambda q: so3.rotate(q, w), q),
        "so3.to_matrix": (so3.to_matrix, q),
        "so3.multiply": (lambda q: so3.multiply(q, q), q),
        "gyroscopic_jacobian": (lambda w: gyroscopic_jacobian(body.inertia, w), w),
        "lqr_gains": (lambda A: lqr.lqr_gains(A, *lqr_args), A),
        "discrete_lagrangian": (lambda s: discrete_lagrangian(user, s.q, s.q * 0.99, 0.0, 1e-3), us),
        "grad of rollout (user Lagrangian)": (
            jax.grad(lambda s: jnp.sum(rj.rollout(vi_step, user, s, 1e-3, 3).states.q[-1] ** 2)),
            us,
        ),
        # the midpoint step's own JVP rule, traced when the caller differentiates an already
        # traced program (grad of jit, of checkpoint), outside the forward's scope
        "grad of jit of midpoint rollout": (jax.grad(jax.jit(_midpoint_loss(body))), ms),
        "grad of checkpoint of midpoint rollout": (jax.grad(jax.checkpoint(_midpoint_loss(body))), ms),
        "jvp of jit of midpoint rollout": (
            lambda s: jax.jvp(jax.jit(_midpoint_loss(body)), (s,), (s,)),
            ms,
        ),
        "grad of jit of discrete-adjoint rollout": (jax.grad(jax.jit(_midpoint_loss(body, adjoint="discrete"))), ms),
        "grad of jit of ep rollout": (
            jax.grad(jax.jit(lambda s: jnp.sum(rj.rollout(ep.ep_step, epm, s, 1e-3, 3).states.velocities[-1] ** 2))),
            eps,
        ),
        "grad of ep rollout": (
            jax.grad(lambda s: jnp.sum(rj.rollout(ep.ep_step, epm, s, 1e-3, 3).states.velocities[-1] ** 2)),
            eps,
        ),
        "ep.initial_state": (lambda w: ep.initial_state(epm, angular_velocity=w[None]), w),
        "ep.output": (lambda s: ep.output(epm, s, "AngularVelocityLocal"), eps),
        "ep.energy": (lambda s: ep.energy(epm, s), eps),
        "ep_step": (lambda s: ep.ep_step(epm, s, None, 1e-3), eps),
        "rigid_body_vi_state": (
            lambda w: systems.rigid_body_vi_state(vis, rj.RigidBodyState(angular_velocity=w), check=False),
            w,
        ),
        "rigid_body_state": (lambda s: systems.rigid_body_state(vis, s), vs),
        "vi_step": (lambda s: vi_step(vis, s, None, 1e-3), vs),
        "vi_step (user Lagrangian)": (lambda s: vi_step(user, s, None, 1e-3), us),
        "rollout (user Lagrangian)": (lambda s: rj.rollout(vi_step, user, s, 1e-3, 3), us),
        "ensemble_rollout (EP)": (
            lambda s: ensemble_rollout(ep.ep_step, epm, s, 1e-3, 3, model_batched=False),
            ens,
        ),
    }


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_matrix_product_at_default_precision(name):
    fn, arg = CASES[name]
    precisions = _dots(jax.make_jaxpr(fn)(arg), [])
    left = [p for p in precisions if p is None]
    assert not left, f"{name}: {len(left)} of {len(precisions)} dot_general at the default precision"


def test_the_precision_is_scoped_to_the_call():
    """The entry points set no global flag: after a call, the caller's default is back."""
    fn, arg = CASES["ep.initial_state"]
    assert jax.config.jax_default_matmul_precision is None
    fn(arg)
    assert jax.config.jax_default_matmul_precision is None
    with jax.default_matmul_precision("bfloat16"):
        fn(arg)
        assert jax.config.jax_default_matmul_precision == "bfloat16"
