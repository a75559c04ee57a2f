"""Inertia helpers against independently computed mass properties.

Truths: numerical quadrature of the defining integrals (scipy, in cylindrical/spherical
coordinates), a voxelised composite solid, and invariants of the parallel-axis theorem and
of rotations. None of them uses the closed forms under test.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate
from scipy.spatial.transform import Rotation

from rigidjax.inertia import (
    InertiaProperties,
    cuboid,
    cylinder,
    from_inertia6,
    hollow_sphere,
    parallel_axis,
    point_mass,
    rod,
    sphere,
    to_inertia6,
)

RHO = 1000.0


def _moments_cylindrical(r_in, r_out, length):
    """Mass, axial and transverse moments of a tube by quadrature of rho dV (axis z)."""

    # integrand * r (Jacobian of cylindrical coordinates), integrated over r, phi, z
    def q(f):
        val, _ = integrate.tplquad(
            lambda z, phi, r: RHO * f(r, phi, z) * r,
            r_in,
            r_out,
            0,
            2 * np.pi,
            -length / 2,
            length / 2,
            epsabs=1e-12,
            epsrel=1e-11,
        )
        return val

    m = q(lambda r, p, z: 1.0)
    axial = q(lambda r, p, z: r * r)
    transverse = q(lambda r, p, z: (r * np.sin(p)) ** 2 + z * z)  # about x: y^2 + z^2
    return m, axial, transverse


def _moments_spherical(r_in, r_out):
    def q(f):
        val, _ = integrate.tplquad(
            lambda th, ph, r: RHO * f(r, th, ph) * r * r * np.sin(th),
            r_in,
            r_out,
            0,
            2 * np.pi,
            0,
            np.pi,
            epsabs=1e-12,
            epsrel=1e-11,
        )
        return val

    m = q(lambda r, th, ph: 1.0)
    izz = q(lambda r, th, ph: (r * np.sin(th)) ** 2)  # x^2 + y^2
    return m, izz


def test_cuboid_seed_example_against_voxel_integration():
    # the seed's cuboid 0.4 x 0.2 x 0.1 m, density 1000 -> 8 kg
    a, b, c = 0.4, 0.2, 0.1
    part = cuboid([a, b, c], density=RHO)
    # midpoint-rule voxels: for the quadratic integrands the rule misses the fraction
    # 1/n^2 of each integral; n = 100 -> relative error 1e-4, tolerance 2e-4
    n = 100
    xs = (np.arange(n) + 0.5) / n - 0.5
    X, Y, Z = np.meshgrid(a * xs, b * xs, c * xs, indexing="ij")
    dm = RHO * a * b * c / n**3
    Ixx = dm * np.sum(Y**2 + Z**2)
    Iyy = dm * np.sum(X**2 + Z**2)
    Izz = dm * np.sum(X**2 + Y**2)
    assert float(part.mass) == pytest.approx(8.0, rel=1e-12)
    np.testing.assert_allclose(np.diag(np.asarray(part.inertia)), [Ixx, Iyy, Izz], rtol=2e-4)
    np.testing.assert_allclose(np.asarray(part.inertia) - np.diag(np.diag(part.inertia)), 0, atol=1e-15)


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("r_in", [0.0, 0.03])
def test_cylinder_and_tube_against_quadrature(axis, r_in):
    L, R = 0.3, 0.05
    part = cylinder(L, R, density=RHO, inner_radius=r_in, axis=axis)
    m, axial, transverse = _moments_cylindrical(r_in, R, L)
    expected = np.full(3, transverse)
    expected[axis] = axial
    # quadrature converged to ~1e-11; 1e-9 leaves room for its error estimate
    assert float(part.mass) == pytest.approx(m, rel=1e-9)
    np.testing.assert_allclose(np.diag(np.asarray(part.inertia)), expected, rtol=1e-9)


def test_sphere_and_hollow_sphere_against_quadrature():
    R, r = 0.1, 0.07
    m, izz = _moments_spherical(0.0, R)
    s = sphere(R, density=RHO)
    assert float(s.mass) == pytest.approx(m, rel=1e-9)
    np.testing.assert_allclose(np.asarray(s.inertia), izz * np.eye(3), rtol=1e-9, atol=1e-15)
    m, izz = _moments_spherical(r, R)
    h = hollow_sphere(R, r, density=RHO)
    assert float(h.mass) == pytest.approx(m, rel=1e-9)
    np.testing.assert_allclose(np.asarray(h.inertia), izz * np.eye(3), rtol=1e-9, atol=1e-15)


def test_thin_shell_and_rod_are_limits():
    # thin shell: the limit of the hollow sphere as the wall vanishes, at fixed mass
    shell = hollow_sphere(0.2, 0.2, mass=3.0)
    near = hollow_sphere(0.2, 0.2 * (1 - 1e-6), mass=3.0)
    np.testing.assert_allclose(np.asarray(shell.inertia), np.asarray(near.inertia), rtol=1e-5)
    # a rod is the limit of a slender cylinder (radius -> 0) at fixed mass; the radius
    # contributes m R^2 / 4 to the transverse moment (1e-8 relative for R/L = 1e-4) and
    # m R^2 / 2 = 2.5e-9 kg m^2 to the axial one (zero for the rod): atol 1e-8
    L = 0.5
    thin = cylinder(L, 1e-4 * L, mass=2.0, axis=1)
    r = rod(2.0, L, axis=1)
    np.testing.assert_allclose(np.asarray(r.inertia), np.asarray(thin.inertia), rtol=1e-7, atol=1e-8)


def test_composite_against_voxels_and_sum():
    # a dumbbell: two cuboids on a shared x axis plus a point mass off-axis
    left = cuboid([0.1, 0.1, 0.1], density=RHO).translated([-0.25, 0.0, 0.0])
    right = cuboid([0.1, 0.2, 0.1], density=RHO).translated([0.25, 0.0, 0.0])
    tip = point_mass(0.5, [0.0, 0.1, 0.05])
    total = sum([left, right, tip])
    # independent: voxelise the cuboids, add the point, compute about the common centre of mass
    pts, dms = [], []
    for centre, size in (([-0.25, 0, 0], [0.1, 0.1, 0.1]), ([0.25, 0, 0], [0.1, 0.2, 0.1])):
        n = 60
        g = (np.arange(n) + 0.5) / n - 0.5
        X, Y, Z = np.meshgrid(size[0] * g, size[1] * g, size[2] * g, indexing="ij")
        P = np.stack([X.ravel(), Y.ravel(), Z.ravel()], -1) + centre
        pts.append(P)
        dms.append(np.full(len(P), RHO * np.prod(size) / n**3))
    pts.append(np.array([[0.0, 0.1, 0.05]]))
    dms.append(np.array([0.5]))
    P, dm = np.concatenate(pts), np.concatenate(dms)
    M = dm.sum()
    com = (dm[:, None] * P).sum(0) / M
    D = P - com
    J = np.einsum(
        "n,nij->ij", dm, np.einsum("ni,ni->n", D, D)[:, None, None] * np.eye(3) - np.einsum("ni,nj->nij", D, D)
    )
    assert float(total.mass) == pytest.approx(M, rel=1e-12)
    np.testing.assert_allclose(np.asarray(total.com), com, atol=1e-12)
    # 60 voxels per edge: the midpoint rule misses 1/60^2 = 2.8e-4 of each part's own moments
    # (the parallel-axis terms are exact), so no entry is off by more than that: rtol 3e-4
    np.testing.assert_allclose(np.asarray(total.inertia), J, rtol=3e-4, atol=1e-9)
    # the sum is associative and commutative
    other = tip + (right + left)
    np.testing.assert_allclose(np.asarray(other.inertia), np.asarray(total.inertia), rtol=1e-12, atol=1e-15)


def test_parallel_axis_trace_and_rotation_invariants():
    part = cylinder(0.4, 0.05, density=RHO, inner_radius=0.01, axis=2)
    d = np.array([0.1, -0.2, 0.3])
    m = float(part.mass)
    # trace about a point at distance |d| grows by 2 m |d|^2
    J_p = np.asarray(part.inertia_about(-d))
    assert np.trace(J_p) == pytest.approx(np.trace(np.asarray(part.inertia)) + 2 * m * d @ d, rel=1e-12)
    # the component along d is unchanged, the ones orthogonal to it grow by m |d|^2
    u = d / np.linalg.norm(d)
    assert u @ J_p @ u == pytest.approx(u @ np.asarray(part.inertia) @ u, rel=1e-12)
    # rotation: eigenvalues invariant, com rotated, tensor = R I R^T
    R = Rotation.from_rotvec([0.3, -1.1, 0.7]).as_matrix()
    moved = part.translated(d).rotated(R)
    np.testing.assert_allclose(
        np.linalg.eigvalsh(np.asarray(moved.inertia)), np.linalg.eigvalsh(np.asarray(part.inertia)), rtol=1e-12
    )
    np.testing.assert_allclose(np.asarray(moved.com), R @ d, atol=1e-15)
    # inertia about the frame origin of a rotated part = rotation of the unrotated one
    np.testing.assert_allclose(
        np.asarray(moved.inertia_about()),
        R @ np.asarray(part.translated(d).inertia_about()) @ R.T,
        rtol=1e-12,
        atol=1e-15,
    )


def test_inertia6_round_trip_and_order():
    J = np.array([[3.0, -0.3, 0.2], [-0.3, 2.0, 0.1], [0.2, 0.1, 4.0]])
    v = np.asarray(to_inertia6(J))
    np.testing.assert_array_equal(v, [3.0, 2.0, 4.0, 0.1, 0.2, -0.3])  # [Ixx, Iyy, Izz, Iyz, Ixz, Ixy]
    np.testing.assert_array_equal(np.asarray(from_inertia6(v)), J)
    part = cuboid([0.4, 0.2, 0.1], density=RHO)
    np.testing.assert_allclose(np.asarray(part.inertia6)[:3], np.diag(np.asarray(part.inertia)))
    with pytest.raises(ValueError, match="inertia6"):
        from_inertia6(np.zeros(5))


def test_to_rigid_body_and_gradients():
    part = cuboid([0.4, 0.2, 0.1], density=RHO)
    body = part.to_rigid_body(gravity=[0, 0, -9.81])
    np.testing.assert_allclose(np.asarray(body.inertia), np.asarray(part.inertia))
    # a lone rod has zero axial moment: a RigidBody needs positive definite inertia
    with pytest.raises(ValueError, match="positive definite"):
        rod(1.0, 0.5).to_rigid_body()
    # differentiable in the dimensions: d Ixx / d b = rho a c (b^2 + c^2)/12 * ... check by central FD
    f = lambda s: cuboid(s, density=RHO).inertia[0, 0]
    s0 = jnp.array([0.4, 0.2, 0.1])
    g = np.asarray(jax.grad(f)(s0))
    eps = 1e-6
    fd = [(float(f(s0.at[i].add(eps))) - float(f(s0.at[i].add(-eps)))) / (2 * eps) for i in range(3)]
    # central differences of a cubic polynomial: error ~ eps^2 -> 1e-8 relative is generous
    np.testing.assert_allclose(g, fd, rtol=1e-7)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: cuboid([0.1, -0.2, 0.1], density=RHO), "side_lengths"),
        (lambda: cuboid([0.1, 0.2, 0.1]), "exactly one"),
        (lambda: cuboid([0.1, 0.2, 0.1], density=-1.0), "density"),
        (lambda: cylinder(0.3, 0.05, density=RHO, inner_radius=0.06), "inner_radius"),
        (lambda: cylinder(0.3, 0.05, density=RHO, axis=3), "axis"),
        (lambda: hollow_sphere(0.1, 0.2, density=RHO), "inner_radius"),
        (lambda: point_mass(-1.0), "mass"),
        (lambda: InertiaProperties(1.0, inertia=np.diag([1.0, 1.0, 3.0])), "triangle"),
        (lambda: InertiaProperties(1.0, inertia=np.diag([1.0, -1.0, 1.0])), "semi-definite"),
        (lambda: InertiaProperties(1.0, inertia=[[1.0, 0.5, 0], [0, 1, 0], [0, 0, 1]]), "symmetric"),
        (lambda: InertiaProperties(1.0, com=[0.0, np.nan, 0.0]), "NaN"),
        (lambda: cuboid([0.1, 0.2, 0.1], density=RHO).rotated(np.diag([1.0, 1.0, -1.0])), "rotation"),
    ],
)
def test_rejects_impossible_input(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_parallel_axis_shape_errors_name_the_argument():
    I = jnp.eye(3)
    with pytest.raises(ValueError, match=r"parallel_axis: d .* shape \(3,\); got \(2,\)"):
        parallel_axis(1.0, I, jnp.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"parallel_axis: inertia must have shape \(3, 3\)"):
        parallel_axis(1.0, jnp.ones(3), jnp.zeros(3))
    with pytest.raises(ValueError, match=r"parallel_axis: mass must be a scalar"):
        parallel_axis(jnp.ones(2), I, jnp.zeros(3))
