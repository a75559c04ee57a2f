"""Small internal helpers shared by the steppers (not public API)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def where_tree(pred: jax.Array, new, old):
    """Per-member ``new if pred else old`` over matching pytrees; ``pred`` has the batch shape."""
    pred = jnp.asarray(pred)

    def sel(a, b):
        p = jnp.reshape(pred, pred.shape + (1,) * (jnp.ndim(a) - pred.ndim))
        return jnp.where(p, a, b)

    return jax.tree_util.tree_map(sel, new, old)


def is_concrete(x) -> bool:
    """True when ``x`` is a concrete value (not a tracer inside jit/grad/vmap)."""
    return not isinstance(x, jax.core.Tracer)
