"""Smoke test for the lowest declared dependency versions (run by .ci/run in a second venv):
import, one rollout per stepper with a gradient through it (the sum of squares of the final
state's last leaf: angular velocity, velocities or momenta), an ensemble, a pendulum fit
(optimistix), and the fit command on its embedded default input with --json and --plot
(pandas, matplotlib), twice: the second run loads the stored programs (jax.export,
flatbuffers) and gives the same JSON. Exits non-zero on any failure."""

import json
import os
import pathlib
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
import rigidjax as rj  # noqa: E402
from rigidjax import euler_parameters as ep  # noqa: E402
from rigidjax import systems  # noqa: E402

body = rj.RigidBody(1.0, [1.0, 2.0, 3.0])
s = rj.RigidBodyState(angular_velocity=jnp.array([0.1, 2.0, 0.0]))
model = ep.EPModel(body)
system = systems.rigid_body(body)
runs = {
    "midpoint": (rj.midpoint_step, body, lambda w: rj.RigidBodyState(angular_velocity=w)),
    "euler-parameters": (ep.ep_step, model, lambda w: ep.initial_state(model, angular_velocity=w[None])),
    "variational": (
        rj.vi_step,
        system,
        lambda w: systems.rigid_body_vi_state(system, rj.RigidBodyState(angular_velocity=w)),
    ),
}
for name, (step, m, make) in runs.items():

    def energy(w, step=step, m=m, make=make):
        tr = rj.rollout(step, m, make(w), 0.01, 20)
        return jnp.sum(jnp.asarray(jax.tree_util.tree_leaves(tr.states)[-1])[-1] ** 2)

    w = jnp.array([0.1, 2.0, 0.0])
    g = jax.grad(energy)(w)
    assert np.all(np.isfinite(g)), (name, g)
    print(f"{name}: rollout and gradient ok")
ens = rj.ensemble_rollout(
    rj.midpoint_step, body, jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), s), 0.01, 5, model_batched=False
)
assert ens.states.angular_velocity.shape == (2, 6, 3)
print("ensemble ok")
from scipy.integrate import solve_ivp  # noqa: E402

from rigidjax.identify.pendulum import fit_pendulum  # noqa: E402

t = np.arange(450) * 0.01
sol = solve_ivp(
    lambda _, y: [y[1], -19.36 * np.sin(y[0]) - 0.2 * y[1]], (0, t[-1]), [0.25, 0.3], t_eval=t, rtol=1e-10, atol=1e-12
)
omega = np.zeros((t.size, 3))
omega[:, 0] = sol.y[1]
pend = fit_pendulum(t, omega)
assert pend.converged and abs(pend.omega0 - 4.4) < 1e-3, pend
print("pendulum fit ok")
with tempfile.TemporaryDirectory() as d:
    out = pathlib.Path(d)
    # twice, with the caches in the temporary folder: the second run loads the stored programs
    # (jax.export with flatbuffers) and must give the same JSON
    env = dict(os.environ, XDG_CACHE_HOME=str(out / "cache"))
    for run in (1, 2):
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "rigidjax",
                "fit",
                "--tosses",
                "3",
                "--starts",
                "2",
                "--quiet",
                "--json",
                str(out / f"fit{run}.json"),
                "--plot",
                str(out / "fit.png"),
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        assert p.returncode == 0, f"rigidjax fit exited {p.returncode}: {p.stderr}"
        assert "not stored" not in p.stderr and "cannot read" not in p.stderr, p.stderr
    assert (out / "fit.png").read_bytes()[:4] == b"\x89PNG"
    assert list((out / "cache" / "rigidjax" / "programs").glob("*.jaxexport")), "no program stored"
    j1, j2 = (json.loads((out / f"fit{r}.json").read_text()) for r in (1, 2))
    for key in ("status", "rms", "estimates", "uncertainties", "intervals", "covariance", "inertia"):
        assert j1[key] == j2[key], f"the second run's {key} differs"
print("smoke: all ok")
