"""One process of tests/test_identify_devices.py: ``identify.fit_many`` on every device.

    python tests/_identify_devices_worker.py OUT.npz

Joins the other processes through :func:`rigidjax.launch.initialize` (alone: nothing to
join), fits the same four windows of a free body in every process (``fit_many``: each
evaluation's rows, starts x windows, split over ``jax.devices()``) and process 0 writes each
window's status, values, standard errors, cost and step shift to ``OUT.npz`` with ``meta``
(JSON: process and device counts).

The windows: a body with moments ``(1, 2, 2.8) kg m^2`` tumbling near its intermediate axis,
body rates from :func:`rigidjax.reference.euler_omega` (DOP853) at 100 Hz for 50 to 65
samples, gyroscope noise 1e-3 rad/s (seeded); unknowns ``Iy/Ix``, ``Iz/Ix`` and the initial
rate.
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

import rigidjax as rj
from rigidjax import identify
from rigidjax.identify import observations as obs
from rigidjax.identify import transforms as tr
from rigidjax.launch import initialize
from rigidjax.reference import euler_omega

jax.config.update("jax_enable_x64", True)  # a test script; the library never flips it

INERTIA = np.array([1.0, 2.0, 2.8])


def _ratios(v):
    return jnp.diag(jnp.concatenate([jnp.ones((1,), v.dtype), v]))


def _inertia(m):
    return m.inertia


def problems():
    rng = np.random.default_rng(5)
    model, stepper = rj.RigidBody(1.0, INERTIA), rj.Midpoint()
    parameter = identify.Parameter(_inertia, tr.Positive(), into=_ratios, start=[2.1, 2.7])
    out = []
    for k, n in enumerate((65, 50, 58, 60)):
        t = np.arange(n) * 0.01
        w = euler_omega(INERTIA, [0.3 + 0.05 * k, 3.0, 0.4], t) + 1e-3 * rng.standard_normal((n, 3))
        state0 = rj.RigidBodyState(angular_velocity=jnp.asarray(w[0]))
        out.append(
            identify.Problem(
                model=model,
                stepper=stepper,
                parameters={"ratios": parameter},
                observations=[obs.AngularVelocity(bias=False, sigma=1e-3)],
                segments=[identify.MeasuredSegment(t=t, data={"omega": w}, state0=state0)],
                initial=identify.FreeBodyInitial(("angular_velocity",)),
            )
        )
    return out


def fits():
    """``{field: (windows, ...) array}`` of ``fit_many(problems(), starts=3)``."""
    res = identify.fit_many(problems(), starts=3, step_check="report")
    return {
        "status": np.array([str(f.status) for f in res]),
        "ratios": np.array([f.values["ratios"] for f in res]),
        "se": np.array([f.se["ratios"] for f in res]),
        "cost": np.array([f.cost for f in res]),
        "initial": np.array([f.initial[0] for f in res]),
        "step_shift": np.array([f.step_shift for f in res]),
    }


if __name__ == "__main__":
    info = initialize()  # before any JAX computation
    result = fits()
    meta = {"info": info, "process_count": jax.process_count(), "devices": len(jax.devices())}
    if jax.process_index() == 0:
        np.savez(sys.argv[1], meta=json.dumps(meta), **result)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("rigidjax identify devices done")
