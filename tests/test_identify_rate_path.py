"""The identification layer's body-rate rollout: a problem whose observations read only the
body rate (a gyroscope) rolls out the rate alone (``Midpoint.rate_step``: Euler's equations
through :func:`rigidjax.midpoint.angular_velocity_step`), not the whole rigid-body state.

The independent truth here is the whole-state rollout of :func:`rigidjax.rollout` through the
public midpoint step: the same problem with a signal map that is not the default object takes
that path. Both must give the same residuals, Jacobians (forward mode) and step statuses to
round-off (1e-12 relative: two orderings of the same float64 arithmetic, ~100 steps), and
the same fit.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rigidjax as rj
from rigidjax import identify
from rigidjax.identify import _program, _program_key
from rigidjax.identify import observations as obs
from rigidjax.identify import transforms as tr
from rigidjax.identify.problem import _Layout
from rigidjax.info import Status

jax.config.update("jax_enable_x64", True)


def _whole_state(model, states):
    """The default signal map by another object: the layer then rolls out the whole state."""
    return obs.rigid_body_signals(model, states)


def _problem(*, stepper=None, signals=obs.rigid_body_signals, observations=None, resistance=None, parameters=None):
    rng = np.random.default_rng(3)
    n, dt = 40, 0.01
    segs = []
    for s in range(2):
        t = np.arange(n) * dt + 0.3 * s
        omega = np.array([0.4, 2.5, -0.6]) + 0.3 * rng.standard_normal((n, 3))
        torque = np.stack([np.sin(5 * t[:-1]), 0.7 * np.cos(3 * t[:-1]), 0.4 + 0 * t[:-1]], -1)
        force = rng.standard_normal((n - 1, 3))  # world force: no torque on a free body
        segs.append(
            identify.MeasuredSegment(
                t=t,
                data={"omega": omega},
                state0=rj.RigidBodyState(orientation=jnp.array([1.0, 0, 0, 0]), angular_velocity=jnp.asarray(omega[0])),
                inputs=np.concatenate([force, torque], -1),
                name=f"s{s}",
            )
        )
    R = np.zeros((6, 6)) if resistance is None else resistance
    if resistance is None:
        R[3:, 3:] = np.diag([0.05, 0.02, 0.08])
        R[:3, :3] = 0.3 * np.eye(3)
    model = rj.RigidBody(1.5, jnp.diag(jnp.array([1.0, 2.0, 2.8])), resistance=R, gravity=jnp.array([0.0, 0, -9.81]))
    return identify.Problem(
        model=model,
        stepper=rj.Midpoint() if stepper is None else stepper,
        parameters=parameters
        or {
            "moments": identify.Parameter(
                lambda m: m.inertia, tr.Real(), into=jnp.diag, start=np.array([1.1, 1.9, 2.7])
            )
        },
        observations=observations
        or [obs.AngularVelocity(bias=True, gain=True, misalignment=True, max_delay=0.02, sigma=0.01)],
        segments=segs,
        initial=identify.FreeBodyInitial(("angular_velocity",)),
        signals=signals,
        substeps=2,
    )


def _evaluate(problem, X, jacobian=True):
    """``(r, status, J)`` (``jacobian=False``: ``(r, status)``) of the layer's compiled program
    at the points ``X (rows, P)``."""
    layout = _Layout(problem)
    _, arrays = _program._stack_many([problem], jnp.float64, 40)
    run = _program._program(problem, layout, jnp.float64, jacobian=jacobian)
    return tuple(np.asarray(a) for a in run(arrays, jnp.asarray(X), jnp.zeros(len(X), int)))


def _points(problem):
    x0 = _Layout(problem).start()
    rng = np.random.default_rng(0)
    return np.stack([x0, x0 + 0.05 * rng.standard_normal(x0.shape)])


def _assert_same_rollouts(fast, slow):
    """Residuals, Jacobians and statuses of the two problems at two points, equal to 1e-12
    (both in float64; the rate rollout is the whole state's rotational part, the same
    operations in another order); returns the first problem's Jacobian."""
    X = _points(fast)
    r1, s1, J1 = _evaluate(fast, X)
    r2, s2, J2 = _evaluate(slow, X)
    np.testing.assert_array_equal(s1, s2)
    assert np.all(s1 == Status.SUCCESS)
    np.testing.assert_allclose(r1, r2, rtol=1e-12, atol=1e-12 * np.abs(r2).max())
    np.testing.assert_allclose(J1, J2, rtol=1e-12, atol=1e-12 * np.abs(J2).max())
    return J1


def test_rate_rollout_equals_the_whole_state_rollout():
    fast, slow = _problem(), _problem(signals=_whole_state)
    assert _program_key._rate_step(fast, fast.model) is not None
    assert _program_key._rate_step(slow, slow.model) is None
    J1 = _assert_same_rollouts(fast, slow)
    assert np.abs(J1).max() > 0


def test_rows_of_a_call_step_only_to_its_longest_segment():
    """The body-rate program steps a call's rows to the longest real segment among them, not
    to the padded length: a short problem's residuals, statuses and Jacobian are the same
    alone and beside a longer problem (1e-13 relative: a call of another width is vectorised
    differently; padding that entered a real sample would change it at order 1), and its
    padded samples are 0."""
    long = _problem()
    short = dataclasses.replace(
        long,
        segments=[
            dataclasses.replace(s, t=s.t[:25], data={"omega": s.data["omega"][:25]}, inputs=s.inputs[:24])
            for s in long.segments
        ],
    )
    layout = _Layout(short)
    _, arrays = _program._stack_many([short, long], jnp.float64, 40)
    run = _program._program(short, layout, jnp.float64)
    X = _points(short)
    alone = [np.asarray(a) for a in run(arrays, jnp.asarray(X), jnp.zeros(2, int))]
    beside = [np.asarray(a) for a in run(arrays, jnp.asarray(np.concatenate([X, X])), jnp.array([0, 0, 1, 1]))]
    for a, b in zip(alone, beside):
        np.testing.assert_allclose(a, b[:2], rtol=1e-13, atol=1e-13 * np.max(np.abs(a)))
    r = alone[0].reshape(2, 2, 40, 3)  # rows, segments, samples, components
    assert np.all(r[:, :, 25:] == 0) and np.all(np.abs(r[:, :, :25]).max((-1, -2)) > 0)
    # stepping the padding too (39 intervals, as a loop over the padded length) changes nothing
    residuals = _program._residual_fn(short, layout)
    mine = jax.tree_util.tree_map(lambda a: a[0], arrays)
    for x in X:
        np.testing.assert_array_equal(*(np.asarray(residuals(mine, jnp.asarray(x), n)[0]) for n in (24, 39)))


def test_rate_rollout_gives_the_steps_statuses():
    # an inertia violating the triangle inequality: INVALID_INPUT from the first step
    fast, slow = _problem(), _problem(signals=_whole_state)
    X = _points(fast)[:1].copy()
    X[0, :3] = [1.0, 1.0, 3.0]
    for p in (fast, slow):
        _, status = _evaluate(p, X, jacobian=False)
        assert np.all(status == Status.INVALID_INPUT), status
    # a rotation limit below the motion's: ROTATION_LIMIT, the same in both
    tight = rj.Midpoint(max_rotation=0.01)
    fast, slow = _problem(stepper=tight), _problem(stepper=tight, signals=_whole_state)
    X = _points(fast)
    s1, s2 = _evaluate(fast, X, jacobian=False)[1], _evaluate(slow, X, jacobian=False)[1]
    np.testing.assert_array_equal(s1, s2)
    assert np.all(s1 == Status.ROTATION_LIMIT), s1


def test_whole_state_where_the_rate_does_not_evolve_alone():
    coupled = np.zeros((6, 6))
    coupled[0, 4] = coupled[4, 0] = 0.1  # translation-rotation coupling: omega' needs v
    fitted_resistance = {
        "moments": identify.Parameter(lambda m: m.inertia, tr.Real(), into=jnp.diag, start=np.array([1.1, 1.9, 2.7])),
        "resistance": identify.Parameter(lambda m: m.resistance, tr.Real(), start=np.zeros((6, 6))),
    }
    for p in (
        _problem(resistance=coupled),
        _problem(parameters=fitted_resistance),
        _problem(observations=[obs.AngularVelocity(sigma=0.01), obs.Position(key="omega", sigma=0.01)]),
        _problem(stepper=lambda m, s, u, dt: rj.Midpoint()(m, s, u, dt)),
    ):
        assert _traced_rate_step(p) is None
    assert _traced_rate_step(_problem()) is not None


def _traced_rate_step(p):
    """:func:`_program_key._rate_step` on the model as the compiled program sees it (fitted
    leaves traced), with the problem's own :func:`_program_key._uncoupled`."""
    layout, found = _Layout(p), []
    uncoupled = _program_key._uncoupled(p, layout)
    jax.eval_shape(
        lambda x: found.append(_program_key._rate_step(p, layout.model(x), uncoupled)), jnp.asarray(layout.start())
    )
    return found[0]


def _angular_drag(d):
    """``R = blockdiag(0, diag(d))``: a fitted angular drag (N m s), no coupling."""
    return jnp.zeros((6, 6), d.dtype).at[3:, 3:].set(jnp.diag(d))


def _late_coupling(d, at=1e4):
    """An angular drag whose translation-rotation block appears only for ``d[0] > at``: for
    ``at = 1e4``, zero with zero derivatives wherever the layer's structural check looks
    (coordinates scattered at the scales 1, 10, 100)."""
    R = _angular_drag(d)
    return R.at[0, 4].set(jax.nn.relu(d[0] - at))


def _drag_parameters(into=_angular_drag, transform=None):
    return {
        "moments": identify.Parameter(lambda m: m.inertia, tr.Real(), into=jnp.diag, start=np.array([1.1, 1.9, 2.7])),
        "drag": identify.Parameter(
            lambda m: m.resistance, transform or tr.Positive(), into=into, start=np.array([0.05, 0.02, 0.08])
        ),
    }


def test_fitted_angular_drag_rolls_out_the_rate_alone():
    """A fitted angular drag (the resistance traced, built as ``blockdiag(0, D)``) keeps the
    rate path: residuals, Jacobians and statuses equal the whole-state rollout's to 1e-12
    (as above); a fitted full 6x6 resistance (its coupling blocks move with the unknowns)
    rolls out the whole state."""
    fast = _problem(parameters=_drag_parameters())
    slow = _problem(parameters=_drag_parameters(), signals=_whole_state)
    assert _traced_rate_step(fast) is not None and _traced_rate_step(slow) is None
    J1 = _assert_same_rollouts(fast, slow)
    drag_columns = J1[..., 3:6]  # the drag's three coordinates follow the moments'
    assert np.abs(drag_columns).max() > 0
    # one program for every sub-step count (the rate path's sub-steps are data)
    key = [_program_key._structure(dataclasses.replace(fast, substeps=k), _Layout(fast), jnp.float64) for k in (1, 3)]
    assert key[0] == key[1]


def test_a_coupling_the_structural_check_cannot_see_fails_the_steps():
    """A parametrisation that couples translation and rotation only far from where the
    layer's check looks takes the rate path; where it couples, the rate step reports
    ``INVALID_INPUT`` (the whole state's step succeeds there): a failed step, not a wrong
    model."""
    fast = _problem(parameters=_drag_parameters(_late_coupling, tr.Real()))
    slow = _problem(parameters=_drag_parameters(_late_coupling, tr.Real()), signals=_whole_state)
    assert _traced_rate_step(fast) is not None
    X = _points(fast)
    X[1, 3] = 2e4  # d[0] = 2e4: R[0, 4] = 1e4
    s_fast, s_slow = _evaluate(fast, X, jacobian=False)[1], _evaluate(slow, X, jacobian=False)[1]
    assert np.all(s_fast[0] == Status.SUCCESS) and np.all(s_slow == Status.SUCCESS), (s_fast, s_slow)
    assert np.all(s_fast[1] == Status.INVALID_INPUT), s_fast


def test_a_start_where_an_unseen_coupling_acts_is_named():
    """A start inside the region where such a coupling acts: the start cannot be simulated on
    the rate path, and the message says why (QA: it pointed only at the triangle inequality)."""
    params = _drag_parameters(_late_coupling, tr.Real())
    params["drag"] = dataclasses.replace(params["drag"], start=np.array([2e4, 0.02, 0.08]))
    with pytest.raises(ValueError, match="couples translation and rotation"):
        identify.fit(_problem(parameters=params), starts=1, step_check="off")


def test_a_coupling_away_from_zero_rolls_out_the_whole_state():
    """A coupling that switches on at ``d[0] > 5`` (QA: with the check's points near zero only,
    the fit took the rate path, its steps failed beyond 5 and it ended ``max_steps`` at
    ``d[0] = 5.000`` with 2.8x the whole state's cost, the truth at 6) is seen by the check's
    wider points: the whole state is rolled out."""
    problem = _problem(parameters=_drag_parameters(functools.partial(_late_coupling, at=5.0), tr.Real()))
    assert not _program_key._uncoupled(problem, _Layout(problem))
    assert _traced_rate_step(problem) is None


def test_fit_through_the_rate_rollout_equals_the_whole_state_fit():
    fits = [
        identify.fit(_problem(signals=s), starts=2, step_check="off") for s in (obs.rigid_body_signals, _whole_state)
    ]
    a, b = fits
    assert a.status == b.status
    np.testing.assert_allclose(a.values["moments"], b.values["moments"], rtol=1e-9)
    np.testing.assert_allclose(a.se["moments"], b.se["moments"], rtol=1e-7)
    np.testing.assert_allclose(a.cost, b.cost, rtol=1e-10)


@pytest.mark.parametrize("attitude", ["new", "midpoint"])
def test_rate_step_is_the_midpoint_steps_rate(attitude):
    body = rj.RigidBody(2.0, jnp.diag(jnp.array([1.0, 2.0, 2.8])), gravity=jnp.array([0.0, 0, -9.81]))
    state = rj.RigidBodyState(orientation=jnp.array([0.8, 0.6, 0, 0]), angular_velocity=jnp.array([0.4, 2.5, -0.6]))
    wrench = jnp.array([1.0, -2.0, 0.5, 0.3, 0.1, -0.2])
    stepper = rj.Midpoint(attitude=attitude)
    full, info = stepper(body, state, wrench, 0.02)
    w1, status = stepper.rate_step(body)(state.angular_velocity, wrench[3:], 0.02)
    np.testing.assert_allclose(w1, full.angular_velocity, rtol=1e-14, atol=1e-15)
    assert int(status) == int(info.status) == Status.SUCCESS


@pytest.mark.slow  # ~30 s on 2 cores; test_substeps_per_segment keeps the counts-as-data rows fast
def test_substeps_are_data():
    """The sub-steps are data, for the rate rolled out alone and for the whole state: problems
    at 1, 2 and 4 sub-steps share one program key, and one call of the rate path's program
    with rows of each count gives, row by row, the whole-state program's (also one call) to
    round-off (1e-12 relative, as above), statuses included. That the whole state's
    sub-steps are the steps of ``dt / k``: ``test_rollout.py``'s substeps tests."""
    ks = (1, 2, 4)
    fast = [dataclasses.replace(_problem(), substeps=k) for k in ks]
    slow = [dataclasses.replace(_problem(signals=_whole_state), substeps=k) for k in ks]
    for ps in (fast, slow):
        keys = [_program_key._structure(p, _Layout(p), jnp.float64) for p in ps]
        assert keys[0] == keys[1] == keys[2]
    X = _points(fast[0])

    def one_call(ps):  # rows: each point at each count, in one call of the one program
        _, arrays = _program._stack_many(ps, jnp.float64, 40)
        run = _program._program(ps[0], _Layout(ps[0]), jnp.float64)
        which = np.repeat(np.arange(3), len(X))
        return which, [np.asarray(a) for a in run(arrays, jnp.asarray(np.tile(X, (3, 1))), jnp.asarray(which))]

    which, (r, s, J) = one_call(fast)
    _, (r_all, s_all, J_all) = one_call(slow)
    for i in range(len(ks)):
        rows = which == i
        r2, s2, J2 = r_all[rows], s_all[rows], J_all[rows]
        np.testing.assert_array_equal(s[rows], s2)
        np.testing.assert_allclose(r[rows], r2, rtol=1e-12, atol=1e-12 * np.abs(r2).max())
        np.testing.assert_allclose(J[rows], J2, rtol=1e-12, atol=1e-12 * np.abs(J2).max())
    # the counts differ (the step error shows): the rows are not copies of one count
    assert np.abs(r[which == 0] - r[which == 2]).max() > 1e-6 * np.abs(r).max()
    # a failed sub-step is its sample interval's status, as the whole state's step is
    tight = [dataclasses.replace(p, stepper=rj.Midpoint(max_rotation=0.01)) for p in (fast[1], slow[1])]
    s1, s2 = _evaluate(tight[0], X, jacobian=False)[1], _evaluate(tight[1], X, jacobian=False)[1]
    np.testing.assert_array_equal(s1, s2)
    assert np.all(s1 == Status.ROTATION_LIMIT), s1


def test_substeps_per_segment():
    """Sub-steps per segment: each segment's residuals and Jacobian rows equal those of the
    same problem at that segment's count (1e-12, as above); the step check's doubling doubles
    each; a whole-state problem takes them too (its fit equals the rate path's); a bad tuple
    is named."""
    p = dataclasses.replace(_problem(), substeps=(1, 4))
    assert p.substeps == (1, 4) and dataclasses.replace(_problem(), substeps=[3, 3]).substeps == 3
    X = _points(p)
    r, s, J = _evaluate(p, X)
    n_seg = r.shape[1] // 2  # two segments, their residuals one after the other
    for i, k in enumerate((1, 4)):
        r_k, s_k, J_k = _evaluate(dataclasses.replace(_problem(), substeps=k), X)
        seg = slice(i * n_seg, (i + 1) * n_seg)
        np.testing.assert_allclose(r[:, seg], r_k[:, seg], rtol=1e-12, atol=1e-12 * np.abs(r_k).max())
        np.testing.assert_allclose(J[:, seg], J_k[:, seg], rtol=1e-12, atol=1e-12 * np.abs(J_k).max())
    assert np.all(s == Status.SUCCESS)
    fit = identify.fit(p, starts=1, step_check="report")
    assert fit.substeps == (1, 4) and fit.to_dict()["substeps"] == [1, 4]
    whole = identify.fit(dataclasses.replace(p, signals=_whole_state), starts=1, step_check="report")
    assert whole.substeps == (1, 4) and whole.status == fit.status
    np.testing.assert_allclose(whole.values["moments"], fit.values["moments"], rtol=1e-9)
    assert dataclasses.replace(_problem(), substeps=np.array([1, 4])).substeps == (1, 4)
    for bad in ((1,), (1, 0), (1, 2.0), (True, 2)):
        with pytest.raises(ValueError, match="one per segment"):
            dataclasses.replace(_problem(), substeps=bad)


def test_fit_many_refuses_before_fitting(monkeypatch):
    """``fit_many``'s problems share one structure (the sub-steps are data): a problem with
    another observation, or
    a start its transform refuses, is named before anything is fitted (with and without
    ``groups``); a 0-d array of sub-steps is that count."""
    from rigidjax.identify import _fit_many

    monkeypatch.setattr(_fit_many, "_fit", lambda *a, **k: pytest.fail("fitted before the problems were checked"))
    fast = _problem()
    other = _problem(observations=[obs.AngularVelocity(sigma=0.01), obs.Position(key="omega", sigma=0.01)])
    negative = {
        "moments": identify.Parameter(lambda m: m.inertia, tr.Positive(), into=jnp.diag, start=np.array([-1.0, 2, 3]))
    }
    for groups in (None, ["a", "a"]):
        with pytest.raises(ValueError, match=r"problems\[1\] differs from problems\[0\] in its "):
            identify.fit_many([fast, other], groups=groups)
        with pytest.raises(ValueError, match=r"fit_many: problems\[1\]: Parameter 'moments'"):
            identify.fit_many([fast, _problem(parameters=negative)], groups=groups)
    assert dataclasses.replace(fast, substeps=np.array(3)).substeps == 3


def test_known_inputs_are_part_of_the_program_key():
    """Whether a program rolls out the rate alone depends on the known inputs (a wrench array
    or not), so their structure is part of the program's key: a problem without inputs, one
    with a (n - 1, 6) wrench and one with a list holding it never share a program (a cached
    path once leaked between such problems: the whole state ran where the rate alone was
    due)."""
    with_u = _problem()
    without = dataclasses.replace(with_u, segments=[dataclasses.replace(s, inputs=None) for s in with_u.segments])
    listed = dataclasses.replace(
        with_u, segments=[dataclasses.replace(s, inputs=[np.asarray(s.inputs)]) for s in with_u.segments]
    )
    k1, k2, k3 = (_program_key._structure(p, _Layout(p), jnp.float64) for p in (with_u, without, listed))
    assert k1 != k2 and k1[:8] == k2[:8] and k3 != k1 and k3 != k2
    assert _traced_rate_step(with_u) is not None and _traced_rate_step(without) is not None
    assert _traced_rate_step(listed) is None  # a list of wrenches: the whole state


INERTIA, DRAG = np.array([1.0, 2.0, 2.8]), np.array([0.05, 0.03, 0.08])


def _drag_problem(seed, signals=obs.rigid_body_signals, transform=None, start=np.zeros(3), drag=DRAG):
    """A torque-free body with angular drag ``-D omega`` (DOP853, rtol 1e-12; gyroscope noise
    0.01 rad/s; ``INERTIA``, ``drag``), fitted for the ratios (``Iy = 1``) and ``D / Iy``."""
    from scipy.integrate import solve_ivp

    t = np.arange(200) * 0.01

    def rhs(_t, w):
        return (np.cross(INERTIA * w, w) - drag * w) / INERTIA

    sol = solve_ivp(rhs, (0.0, t[-1]), np.array([0.3, 3.0, 0.4]), method="DOP853", rtol=1e-12, atol=1e-14, t_eval=t)
    gyro = sol.y.T + 0.01 * np.random.default_rng(seed).standard_normal((t.size, 3))
    state0 = rj.RigidBodyState(orientation=jnp.array([1.0, 0, 0, 0]), angular_velocity=jnp.asarray(gyro[0]))
    return identify.Problem(
        model=rj.RigidBody(1.0, np.eye(3)),
        stepper=rj.Midpoint(),
        parameters={
            "ratios": identify.Parameter(
                lambda m: m.inertia, tr.MomentRatios(), into=tr.MomentRatios.inertia, start=np.array([0.6, 1.3])
            ),
            "drag": identify.Parameter(
                lambda m: m.resistance, transform or tr.Real(), into=_angular_drag, start=np.asarray(start, float)
            ),
        },
        observations=[obs.AngularVelocity(bias=False, sigma=0.01)],
        segments=[identify.MeasuredSegment(t=t, data={"omega": gyro}, state0=state0)],
        initial=identify.FreeBodyInitial(("angular_velocity",)),
        signals=signals,
        substeps=2,
    )


def test_drag_fit_through_the_rate_rollout_recovers_the_truth():
    """A torque-free body with angular drag ``-D omega`` (DOP853, rtol 1e-12; gyroscope noise
    0.01 rad/s), fitted for the ratios (``Iy = 1``) and ``D / Iy`` (torque-free motion fixes
    the drag relative to the inertia): the rate path and the whole-state path give one fit
    (values to 1e-9, as above), within 2 standard errors of the truth."""
    fast, slow = _drag_problem(2), _drag_problem(2, _whole_state)
    assert _traced_rate_step(fast) is not None
    a, b = (identify.fit(p, starts=2, step_check="off") for p in (fast, slow))
    assert a.status == b.status == identify.FitStatus.CONVERGED, (a.message, b.message)
    for name in ("ratios", "drag"):
        np.testing.assert_allclose(a.values[name], b.values[name], rtol=1e-9, atol=1e-12)
    truth = {"ratios": INERTIA[[0, 2]] / INERTIA[1], "drag": DRAG / INERTIA[1]}
    for name, v in truth.items():
        assert np.all(np.abs(a.values[name] - v) <= 2 * a.se[name]), (name, a.values[name], v, a.se[name])


def test_a_positive_drag_started_at_the_truth_keeps_its_damping():
    """A ``Positive`` drag (``exp(u)``: its Jacobian column shrinks with the value) started at
    the truth, one start: the optimiser's damping keeps the largest scale seen (Moré), so no
    step sends a drag 10 orders of magnitude down where its gradient vanishes (QA: ``stalled``
    at drag_z = 2e-14 with 4 % more cost; now ``converged`` in 9 iterations), and it ends at
    the ``Real`` chart's optimum (values to 1e-5 relative: both to first-order optimality)."""
    real = identify.fit(_drag_problem(0), starts=1, step_check="off")
    pos = identify.fit(_drag_problem(0, transform=tr.Positive(), start=DRAG / INERTIA[1]), starts=1, step_check="off")
    assert pos.status == real.status == identify.FitStatus.CONVERGED, (pos.message, real.message)
    for name in ("ratios", "drag"):
        np.testing.assert_allclose(pos.values[name], real.values[name], rtol=1e-5)
    np.testing.assert_allclose(pos.cost, real.cost, rtol=1e-9)


def test_a_positive_value_heading_for_zero_is_named():
    """No drag in the data, a ``Positive`` drag fitted: ``exp(u)`` never reaches the optimum
    at 0, and the optimiser's cap comes first; the message names the value heading for 0 and
    the transform that holds it there, instead of "raise max_steps" (QA)."""
    f = identify.fit(
        _drag_problem(0, transform=tr.Positive(), start=np.full(3, 0.01), drag=np.zeros(3)), starts=4, step_check="off"
    )
    assert f.status in (identify.FitStatus.MAX_STEPS, identify.FitStatus.STALLED), f.message
    assert "drag heads for 0" in f.message and "transforms.Box(0, inf)" in f.message, f.message
    assert "raise max_steps" not in f.message


@pytest.mark.parametrize("signals", ["rate", pytest.param("whole", marks=pytest.mark.slow)])
def test_jacobian_blocks_equal_jax_jacfwd(signals):
    """The layer's Jacobian of a problem of several segments, formed from ``ng + nz`` tangents
    (each segment depends on the global unknowns and its own initial state alone), equals
    ``jax.jacfwd`` of the residuals over all ``ng + S nz`` unknowns, and its normal equations
    equal ``J^T J`` and ``J^T r`` of that Jacobian, to round-off (1e-13 relative: the same
    tangents, another order of the sums)."""
    p = _problem(signals=obs.rigid_body_signals if signals == "rate" else _whole_state)
    layout = _Layout(p)
    assert layout.S == 2 and layout.nz > 0
    X = _points(p)
    _, arrays = _program._stack_many([p], jnp.float64, 40)
    residuals = _program._residual_fn(p, layout)
    mine = jax.tree_util.tree_map(lambda a: a[0], arrays)
    trip = int(np.max(np.sum(np.asarray(mine[6]), -1)))  # the longest segment's sample intervals
    r, _, J = _evaluate(p, X)
    normal = _program._program(p, layout, jnp.float64, jacobian="normal")
    cost, A, g, _, finite = (np.asarray(a) for a in normal(arrays, jnp.asarray(X), jnp.zeros(len(X), int)))
    assert np.all(finite)
    for i, x in enumerate(X):
        dense = np.asarray(jax.jacfwd(lambda y: residuals(mine, y, trip)[0].reshape(-1))(jnp.asarray(x)))
        scale = np.abs(dense).max()
        np.testing.assert_allclose(J[i], dense, rtol=1e-13, atol=1e-13 * scale)
        np.testing.assert_allclose(A[i], dense.T @ dense, rtol=1e-12, atol=1e-12 * scale**2)
        np.testing.assert_allclose(g[i], dense.T @ r[i], rtol=1e-12, atol=1e-12 * scale * np.abs(r[i]).max())
        np.testing.assert_allclose(cost[i], 0.5 * r[i] @ r[i], rtol=1e-13)
