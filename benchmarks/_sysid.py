"""One window of a torque-free flip fitted with ``mujoco.sysid`` (the ``bench`` extra: ``mujoco[sysid]``).

What it fits (the model :func:`rigidjax.identify.fit_inertia` fits per window by default, and
``bench_fit.scipy_fit``): a torque-free rigid body whose principal axes are the phone's axes;
the gyroscope reads the body angular velocity, no bias, no drag. Unknowns: the inertia ratios
``Ix/Iy, Iz/Iy`` (``Iy = 1`` held fixed) and the initial body angular velocity ``omega0``
(3), five in all. Objective: the plain sum of squares of ``predicted - measured`` rates, rad/s,
at every measured timestamp including the first.

How:

* Model: MJCF with one body on a ``freejoint`` (mass 1, ``diaginertia (Ix/Iy, 1, Iz/Iy)``,
  ``iquat`` identity, inertial frame = phone frame), gravity off, contacts disabled, no
  actuators, a ``gyro`` sensor at a site on the body origin (reads the body-frame rate). RK4,
  fixed ``timestep`` (default 1 ms, 10 steps per ~10 ms sample interval; 0.5 and 2 ms gave
  the same estimates to 5 digits on two windows).
* Inertia parameter: sysid's ``Parameter`` ``"uv"`` in the chart rigidjax optimises in (the
  second moments ``L = (u, v, 1 - u)`` of the mass distribution with ``Iy = 1``:
  ``Ix/Iy = v + 1 - u``, ``Iz/Iy = u + v``, ``0 <= u <= 1``, ``0 <= v <= V_MAX``): the
  physically valid set (triangle inequalities) is a box, as for the other two methods, and
  MuJoCo's compiler never sees an invalid inertia. Its modifier writes ``body.inertia`` and
  resets ``body.iquat`` to identity. (sysid's own pseudo-inertia map, ``InertiaType.Pseudo``,
  has ten unknowns (mass, centre of mass, full tensor) in log / Cholesky coordinates: it can
  neither hold the axes to the phone's nor reach the thin-plate edge ``u = 1`` where the
  racquet sits; it also leaves ``body.iquat`` NaN, so the model does not compile unless it is
  reset.)
* Initial angular velocity: a second ``Parameter`` ``"omega0"`` with no model modifier, put
  into the free joint's angular velocity (body frame) of the initial state by a custom rollout
  hook (``custom_rollout``) before ``sysid_rollout``: the rollout hook is the only way to make
  the initial state an unknown.
* Residual: a ``modify_residual`` hook. MuJoCo's rollout stamps sensor readings with the time
  AFTER the step while they are evaluated at its start: the predictions are re-stamped one
  timestep earlier, then interpolated linearly at the measured (non-uniform) times. The hook
  returns the predicted series with the measured series' ``signal_mapping`` OBJECT: sysid
  compares the two mappings with ``!=``, which raises on a 3-axis sensor (NumPy index arrays)
  unless they are the same object. sysid's default residual would also divide every channel by
  its measured norm; the hook keeps the residual in rad/s, as the other methods do.
* Optimiser: ``mujoco.sysid.optimize`` with its default backend (``mujoco.minimize``
  Levenberg-Marquardt, finite-difference Jacobian: 5 extra rollouts per Jacobian), one start
  (the same equation-error start as the others; ``u`` moved 0.05 off the box's edges, as sysid
  advises against starting on a bound). sysid's result carries no termination status, and
  ``optimize(verbose=...)`` is its own flag, so the backend always runs verbose (per-iteration
  lines, and one more finite-difference Jacobian at the end, counted in ``nfev`` and the CPU):
  its printout goes to a buffer (``output=``), whose final line gives ``termination``;
  ``success`` = it ended on ``norm(dx) < tol`` or ``norm(gradient) < tol``. Predictions are
  interpolated at the measured times by a cubic spline (linear interpolation of the 1 ms grid
  errs by up to ~1e-3 rad/s on the fast flips).
"""

from __future__ import annotations

import io
import re
import resource

import numpy as np

V_MAX = 1e4  # rigidjax.identify._model.V_MAX: the same box
OMEGA_MAX = 50.0  # rad/s, rigidjax's max_rate: a finite box for omega0 (never active on the flips)

_XML = """
<mujoco model="free body">
  <option timestep="{dt}" gravity="0 0 0" integrator="RK4">
    <flag contact="disable"/>
  </option>
  <worldbody>
    <body name="phone">
      <freejoint name="free"/>
      <inertial pos="0 0 0" mass="1" diaginertia="1 1 1"/>
      <site name="imu"/>
    </body>
  </worldbody>
  <sensor>
    <gyro name="gyro" site="imu"/>
  </sensor>
</mujoco>
"""


def available() -> str | None:
    """``None`` if ``mujoco.sysid`` imports, else why not."""
    try:
        from mujoco import sysid

        sysid.optimize  # noqa: B018 (the package swallows missing extras)
    except (ImportError, AttributeError) as e:
        return f"mujoco.sysid unavailable ({type(e).__name__}: {e}); install the bench extra: mujoco[sysid]>=3.5"
    return None


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def ratios(uv) -> tuple[float, float]:
    """Chart ``(u, v)`` -> ``(Ix/Iy, Iz/Iy)``."""
    u, v = float(uv[0]), float(uv[1])
    return v + 1 - u, u + v


def chart(ix: float, iz: float) -> np.ndarray:
    """``(Ix/Iy, Iz/Iy)`` -> the chart ``(u, v)``, projected onto the valid box."""
    return np.array([np.clip((iz - ix + 1) / 2, 0.0, 1.0), np.clip((ix + iz - 1) / 2, 0.0, V_MAX)])


def sysid_fit(seg, start, *, timestep: float = 1e-3, max_iters: int = 200, n_threads: int = 1) -> dict:
    """Fit one window (``seg.t``, ``seg.omega``) from ``start = (Ix/Iy, Iz/Iy)`` and
    ``omega0 = seg.omega[0]``.

    Returns a dict: ``Ix/Iy``, ``Iz/Iy``, ``omega0``, ``rms`` (its own residual RMS, rad/s, RK4
    at ``timestep``), ``nfev`` (rollouts, finite-difference columns included), ``iterations``,
    ``termination`` (mujoco.minimize's message), ``success``, ``cpu_s`` (process CPU, user +
    system, model building included; ``n_threads=1``: rollouts in this thread).
    """
    import mujoco
    from mujoco import sysid
    from scipy.interpolate import CubicSpline

    c0 = _cpu()
    t = np.asarray(seg.t, float) - float(seg.t[0])
    meas = np.asarray(seg.omega, float)
    spec = mujoco.MjSpec.from_string(_XML.format(dt=repr(float(timestep))))
    model0 = spec.compile()
    dt = float(model0.opt.timestep)

    def set_inertia(spec_, param):
        ix, iz = ratios(param.value)
        body = spec_.body("phone")
        body.explicitinertial = True
        body.mass = 1.0
        body.ipos = [0.0, 0.0, 0.0]
        body.inertia = [ix, 1.0, iz]
        body.iquat = [1.0, 0.0, 0.0, 0.0]

    uv0 = chart(*start)
    # off the box's edges, as sysid advises (its own ParameterDict.move_off_bounds, 4.0 only, would
    # move any v below 1e-3 of the box's width, i.e. below 10, to 500)
    uv0 = np.array([np.clip(uv0[0], 0.05, 0.95) if min(uv0[0], 1 - uv0[0]) < 1e-3 else uv0[0], max(uv0[1], 0.05)])
    params = sysid.ParameterDict()
    params.add(sysid.Parameter("uv", uv0, [0.0, 0.0], [1.0, V_MAX], modifier=set_inertia))
    params.add(sysid.Parameter("omega0", meas[0], [-OMEGA_MAX] * 3, [OMEGA_MAX] * 3))

    # ---- measured data, a zero-width control on the simulation grid, the initial state
    measured = sysid.TimeSeries.from_names(t, meas, model0, ["gyro"])
    n_step = int(np.ceil(t[-1] / dt - 1e-9)) + 1  # re-stamped predictions reach t[-1]
    control = sysid.TimeSeries(np.arange(n_step + 1) * dt, np.zeros((n_step + 1, 0)))
    state0 = sysid.create_initial_state(model0, np.array([0.0, 0, 0, 1, 0, 0, 0]), np.zeros(6))
    i_w = 1 + model0.nq + 3  # mjSTATE_FULLPHYSICS: [time, qpos, qvel, ...]; free joint qvel = (v, omega_body)

    def rollout(*, models, datas, control_signal, initial_states, param_dicts, **maps):
        states = []
        for j, s in enumerate(initial_states):
            s = np.array(s, float)
            s[i_w : i_w + 3] = param_dicts[j]["omega0"].value
            states.append(s)
        return sysid.sysid_rollout(
            models=models,
            datas=datas,
            control_signal=control_signal,
            initial_states=states,
            rollout_signal_mapping=maps["rollout_signal_mapping"],
            rollout_state_mapping=maps["rollout_state_mapping"],
            ctrl_mapping=maps["ctrl_mapping"],
        )

    def residual(params_, pred, meas_ts, model, return_pred_all, state=None, **_):
        idx = meas_ts.signal_mapping["gyro"][1]
        tp = pred.times - model.opt.timestep  # sensors are evaluated at the start of the step
        p = CubicSpline(tp, pred.data[:, idx], axis=0)(meas_ts.times)
        res = p - meas_ts.data[:, idx]
        return res, sysid.TimeSeries(meas_ts.times, p, meas_ts.signal_mapping), meas_ts

    seqs = [sysid.ModelSequences("flip", spec, "window", state0, control, measured)]
    base = sysid.build_residual_fn(
        models_sequences=seqs,
        custom_rollout=rollout,
        modify_residual=residual,
        resample_true=False,
        n_threads=n_threads,
    )
    count = {"rollouts": 0}

    def counted(x, p, **kw):
        count["rollouts"] += 1 if np.ndim(x) == 1 else np.shape(x)[1]
        return base(x, p, **kw)

    log = io.StringIO()
    opt, _res = sysid.optimize(params, counted, verbose=False, max_iters=max_iters, output=log)
    cpu = _cpu() - c0
    r = np.concatenate(base(opt.as_vector(), opt)[0])
    ix, iz = ratios(opt["uv"].value)
    end = re.search(r"Terminated after (\d+) iterations: ([^.]*)", log.getvalue())
    n_it, why = (int(end[1]), end[2]) if end else (-1, "no termination message")
    return {
        "Ix/Iy": ix,
        "Iz/Iy": iz,
        "omega0": [float(v) for v in opt["omega0"].value],
        "rms": float(np.sqrt(np.mean(r**2))),
        "nfev": count["rollouts"],
        "iterations": n_it,
        "termination": why,
        "success": why.startswith("norm("),
        "cpu_s": cpu,
    }
