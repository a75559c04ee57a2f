"""The full inertia tensor through the general layer (rigidjax.identify.fit):
``transforms.TensorRatios`` (torque-free motion: the tensor over ``I_yy``) and
``transforms.InertiaTensor`` (known torques: kg m^2). The data: a body with principal axes
rotated off the sensor axes, simulated by SciPy's DOP853 (rtol 1e-12, independent of
rigidjax's steppers); a recovered value lies within 2 standard errors of the truth.
"""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kinematics import free_body_truth
from scipy.spatial.transform import Rotation

import rigidjax as rj
from rigidjax import identify
from rigidjax.identify import observations as obs
from rigidjax.identify import transforms as tr
from rigidjax.io import Segment

jax.config.update("jax_enable_x64", True)

#: Principal moments 1, 2, 2.8 with axes turned by 21 degrees off the sensor axes.
AXES = Rotation.from_rotvec([0.2, -0.1, 0.3]).as_matrix()
TENSOR = AXES @ np.diag([1.0, 2.0, 2.8]) @ AXES.T
NAMES = ("Ix/Iy", "Iz/Iy", "Ixy/Iy", "Ixz/Iy", "Iyz/Iy")
W0 = np.array([0.3, 3.0, 0.4])


def _ratios(inertia):
    return np.array([inertia[0, 0], inertia[2, 2], inertia[0, 1], inertia[0, 2], inertia[1, 2]]) / inertia[1, 1]


def _body(rng, plate=False):
    """A random physical tensor (second moments of a random mass distribution, random axes)."""
    L = rng.uniform(0.2, 2.0, 3)
    if plate:
        L[2] = 0.0
    moments = np.array([L[1] + L[2], L[0] + L[2], L[0] + L[1]])
    R = (
        Rotation.random(random_state=rng).as_matrix()
        if rng.uniform() < 0.5
        else Rotation.from_rotvec(rng.normal(0, 0.3, 3)).as_matrix()
    )
    return R @ np.diag(moments) @ R.T


def test_tensor_charts_round_trip_and_reach_the_plate_face():
    """``forward(inverse(value)) = value`` to round-off for random bodies (axes anywhere), the
    Jacobian has full rank (5 and 6) where the principal moments differ, a thin plate's second
    moment is 0 exactly (the face of the box, which the optimiser reaches), and what is not a
    physical tensor raises with the transform's name."""
    rng = np.random.default_rng(0)
    ratios, absolute = tr.TensorRatios(), tr.InertiaTensor()
    for _ in range(20):
        inertia = _body(rng)
        u = ratios.inverse(_ratios(inertia))
        lo, hi = ratios.bounds(None)
        assert np.all((u >= lo) & (u <= hi)) and np.linalg.norm(u[2:]) <= np.pi + 1e-12
        np.testing.assert_allclose(ratios.forward(jnp.asarray(u), None), _ratios(inertia), rtol=1e-12, atol=1e-12)
        J = jax.jacfwd(lambda x: ratios.forward(x, None))(jnp.asarray(u))
        assert np.linalg.matrix_rank(np.asarray(J)) == 5
        u = absolute.inverse(inertia)
        np.testing.assert_allclose(absolute.forward(jnp.asarray(u), None), inertia, rtol=1e-12, atol=1e-12)
        J = jax.jacfwd(lambda x: absolute.forward(x, None).ravel())(jnp.asarray(u))
        assert np.linalg.matrix_rank(np.asarray(J)) == 6
        np.testing.assert_allclose(tr.TensorRatios.inertia(_ratios(inertia)), inertia / inertia[1, 1], rtol=1e-12)
    plate = _body(rng, plate=True)
    assert np.min(absolute.inverse(plate)[:3]) == 0.0
    u = ratios.inverse(_ratios(plate))
    assert u[0] in (0.0, 1.0) or u[1] == 0.0, u  # an edge of the (u, v) box
    rod = np.diag([1.0, 1.0, 2.5])  # 2.5 > 1 + 1: not a rigid body
    for t, value in ((absolute, rod), (ratios, _ratios(rod))):
        with pytest.raises(ValueError, match=f"{type(t).__name__}: principal moments .* not a physical body"):
            t.inverse(value)
    cad = TENSOR.copy()
    cad[0, 1] += 1e-7  # printed to 7 digits: symmetric to its rounding, taken
    np.testing.assert_allclose(absolute.forward(jnp.asarray(absolute.inverse(cad)), None), TENSOR, atol=1e-7)
    with pytest.raises(ValueError, match="InertiaTensor: the start tensor is not symmetric"):
        absolute.inverse(TENSOR + np.triu(np.ones((3, 3)), 1))
    with pytest.raises(ValueError, match="InertiaTensor: the start tensor is not positive definite"):
        absolute.inverse(-TENSOR)
    with pytest.raises(ValueError, match="TensorRatios: the start must be 5 finite ratios"):
        ratios.inverse([1.0, 2.0])


def _gyro_problem(seed, transform, start, into=None, torque=None, sigma=0.01, n=300):
    rng = np.random.default_rng(seed)
    t = np.arange(n) * 0.01
    w, _ = free_body_truth(TENSOR, W0, np.array([1.0, 0, 0, 0]), t, torque=torque)
    y = w + sigma * rng.standard_normal(w.shape)
    state0 = rj.RigidBodyState(orientation=jnp.array([1.0, 0, 0, 0]), angular_velocity=jnp.asarray(y[0]))
    inputs = None if torque is None else np.concatenate([np.zeros((n - 1, 3)), torque], -1)
    problem = identify.Problem(
        model=rj.RigidBody(1.0, np.eye(3)),
        stepper=rj.Midpoint(),
        parameters={"tensor": identify.Parameter(lambda m: m.inertia, transform, into=into, start=np.asarray(start))},
        observations=[obs.AngularVelocity(bias=False, sigma=max(sigma, 1e-3))],
        segments=[identify.MeasuredSegment(t=t, data={"omega": y}, state0=state0, inputs=inputs)],
        initial=identify.FreeBodyInitial(("angular_velocity",)),
        substeps=2,
    )
    return problem, t, y


@pytest.mark.slow
def test_tensor_ratios_recover_the_truth_as_fit_inertia_does():
    """Torque-free gyroscope data (0.01 rad/s noise) of a body whose principal axes are 21
    degrees off the sensor axes, started from a diagonal guess: the layer's fit converges,
    every ratio within 2 standard errors of the truth, and it is the least-squares minimum
    that ``fit_inertia(tensor=True)`` (another chart, another evaluator) finds at the same
    sub-steps: estimates to 1e-3 of their standard errors, classical errors to 1e-3 (both
    stop at first-order optimality, a relative decrement below 1e-10: a point within
    ``sqrt(2e-10 cost / s^2)`` ~ 3e-4 standard errors of the minimum here; measured 1e-4)."""
    problem, t, y = _gyro_problem(3, tr.TensorRatios(), [0.6, 1.3, 0, 0, 0], into=tr.TensorRatios.inertia)
    f = identify.fit(problem, starts=4)
    assert f.status == identify.FitStatus.CONVERGED, f.message
    value, se = f.values["tensor"], f.se["tensor"]
    assert np.all(np.abs(value - _ratios(TENSOR)) <= 2 * se), (value - _ratios(TENSOR)) / se
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = identify.fit_inertia([Segment(t, y, name="w")], tensor=True, substeps=f.substeps)
    assert ours.status == identify.FitStatus.CONVERGED, ours.message
    theirs = np.array([ours.estimates[k] for k in NAMES])
    np.testing.assert_allclose((value - theirs) / se, 0.0, atol=1e-3)
    np.testing.assert_allclose(f.se_classical["tensor"], [ours.uncertainties[k] for k in NAMES], rtol=1e-3)


TORQUE_T = np.arange(300) * 0.01
TORQUE = np.stack(
    [0.5 * np.sin(3 * TORQUE_T[:-1]), 0.4 * np.cos(2 * TORQUE_T[:-1]), 0.3 * np.sin(5 * TORQUE_T[:-1] + 1)], -1
)


def test_inertia_tensor_from_known_torques():
    """Known body torques fix the scale: the tensor in kg m^2, with 0.01 rad/s noise within 2
    standard errors of the truth."""
    problem, _, _ = _gyro_problem(3, tr.InertiaTensor(), np.diag([1.5, 1.5, 1.5]), torque=TORQUE)
    f = identify.fit(problem, starts=4)
    assert f.status == identify.FitStatus.CONVERGED, f.message
    z = (f.values["tensor"] - TENSOR) / f.se["tensor"]
    assert np.all(np.abs(z) <= 2), z


@pytest.mark.slow
def test_inertia_tensor_from_noise_free_torques():
    """Noise-free (the residual is the stepper's error at 8 sub-steps): every entry within
    1e-4 of the largest moment."""
    problem, _, _ = _gyro_problem(0, tr.InertiaTensor(), np.diag([1.5, 1.5, 1.5]), torque=TORQUE, sigma=0.0)
    f = identify.fit(dataclasses.replace(problem, substeps=8), starts=2, step_check="off")
    assert f.status == identify.FitStatus.CONVERGED, f.message
    np.testing.assert_allclose(f.values["tensor"], TENSOR, atol=1e-4 * 2.8)


def test_classical_covariance_of_values_and_initial_rates_is_fit_inertias():
    """``ProblemFit.covariance_classical`` (values, then the initial-state unknowns) on
    fit_inertia's per-window model (principal moments, gyroscope bias; 0.01 rad/s noise):
    its errors of the ratios, the bias and the initial rates are those of ``fit_inertia``'s
    row (another evaluator and chart, its own Gauss-Newton covariance) at the same minimum
    and sub-steps (rtol 1e-5: both stop at first-order optimality, near enough the minimum
    that the curvature there agrees to ~1e-7, measured); ``initial_se`` (the larger of classical and sandwich) is never
    below the classical error; a problem not fitted has them all inf."""
    from rigidjax.identify import recipes

    rng = np.random.default_rng(5)
    t = np.arange(200) * 0.01
    w, _ = free_body_truth(np.diag([1.0, 2.0, 2.8]), W0, np.array([1.0, 0, 0, 0]), t)
    y = w + 0.01 * rng.standard_normal(w.shape) + np.array([0.02, -0.01, 0.015])
    seg = Segment(t, y, name="w")
    (p,) = recipes.window_problems([seg], bias=True)
    f = identify.fit(p, starts=2)
    assert f.status == identify.FitStatus.CONVERGED, f.message
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = identify.fit_inertia([seg], bias=True, substeps=int(np.max(f.substeps))).segments[0]
    assert row["status"] == identify.FitStatus.CONVERGED, row["reason"]
    V = len(f.names)  # ratios (2), bias (3)
    assert f.covariance_classical.shape == (V + 3, V + 3) and f.names[-3:] == [f"sensor0.bias[{i}]" for i in range(3)]
    se = np.sqrt(np.diag(f.covariance_classical))
    np.testing.assert_allclose(se[:2], [row["se"]["Ix/Iy"], row["se"]["Iz/Iy"]], rtol=1e-5)
    np.testing.assert_allclose(se[2:V], row["bias_se"], rtol=1e-5)
    np.testing.assert_allclose(se[V:], row["omega0_se"], rtol=1e-5)
    np.testing.assert_allclose(se[:2], f.se_classical["ratios"], rtol=1e-12)
    assert np.all(f.initial_se[0] >= se[V:] * (1 - 1e-12)), (f.initial_se, se[V:])
    short = dataclasses.replace(p.segments[0], t=t[:3], data={"omega": y[:3]})
    tiny = identify.fit(dataclasses.replace(p, segments=[short]))
    assert np.all(np.isinf(tiny.initial_se)) and np.all(np.isinf(tiny.covariance_classical))


def test_propagated_total_error_is_never_below_the_statistical():
    """A total covariance of rank one (the sandwich over two windows) propagates to zero in the
    directions it does not span; every propagated ``se_total`` (tensor, principal moments,
    axes' tilt) is floored at its ``se``, and where the total dominates it is left alone."""
    from rigidjax.identify._model import Spec
    from rigidjax.identify._principal import tensor_summary

    spec = Spec(tensor=True, drag=None, bias=False)
    xp = np.array([13.0, 14.0, 0.4, 0.01, -0.3])
    stat = np.diag([0.04, 0.04, 1e-4, 1e-4, 1e-4])
    u = np.array([1.0, 0.5, 0.0, 0.0, 0.0])
    low_rank = 0.09 * np.outer(u, u)  # larger than stat along u, zero elsewhere
    s = tensor_summary(xp, spec, None, stat, low_rank)
    plain = tensor_summary(xp, spec, None, stat, None)
    for part, key_se, key_tot in (
        ("tensor", "se", "se_total"),
        ("principal_moments", "se", "se_total"),
        ("principal_axes", "se_deg", "se_total_deg"),
    ):
        se, tot = np.asarray(s[part][key_se]), np.asarray(s[part][key_tot])
        assert np.all(tot >= se) and np.array_equal(se, np.asarray(plain[part][key_se]))
    # I_xx/I_yy = xp[0]: its total (0.3 along u) exceeds its statistical 0.2 and is kept
    assert s["tensor"]["se_total"][0][0] == pytest.approx(0.3, rel=1e-6)
    # I_xy: the low-rank total has no variance there; floored at the statistical 0.01
    assert s["tensor"]["se_total"][0][1] == pytest.approx(s["tensor"]["se"][0][1], rel=1e-12)
