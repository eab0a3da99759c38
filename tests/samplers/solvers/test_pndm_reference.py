"""PNDM / PLMS on custom grids against references that are not our solver.

``PNDMSolver.set_timesteps(timesteps=[...])`` (a fitted schedule) plans its calls with ``_grid_plan``:
each step goes to the next grid point, a pseudo Runge-Kutta midpoint of ``t -> t'`` is ``t - (t - t') // 2``.
Two references:

- diffusers' ``PNDMScheduler`` where it accepts the grid: it takes no custom timesteps, but on its own
  ``leading`` grid with an even ``T // N`` its step targets and midpoints are exactly the next grid
  point and ``t - (t - t') // 2``, so our custom path given that grid must reproduce it;
- everywhere else (uneven gaps, short grids), PNDM written out by hand below in plain torch from the
  paper (Liu et al., ICLR 2022: eq. 9 transfer, Runge-Kutta stages with weights 1/6 1/3 1/3 1/6, then
  Adams-Bashforth over past noise estimates) with the midpoint rounded up, ``ceil((t + t') / 2)``,
  the same integer as ``t - floor((t - t') / 2)``.
"""

import pytest
import torch
from diffusers import PNDMScheduler

from dlm.oracles.gaussian_mixture import image_oracle
from samplers.solvers.pndm import PNDMSolver, sample_pndm

torch.set_num_threads(1)

IMAGE = image_oracle(num_modes=4)
AB = {1: [1.0], 2: [3 / 2, -1 / 2], 3: [23 / 12, -16 / 12, 5 / 12], 4: [55 / 24, -59 / 24, 37 / 24, -9 / 24]}


def _transfer(x, eps, a, a_next):
    """Move ``x`` from ``alpha_bar = a`` to ``a_next`` along the noise estimate ``eps``: predict the clean
    sample, re-noise it with the same ``eps`` (DDIM's eta=0 form of PNDM's eq. 9)."""
    x0 = (x - (1 - a) ** 0.5 * eps) / a**0.5
    return a_next**0.5 * x0 + (1 - a_next) ** 0.5 * eps


def pndm_by_hand(eps_fn, x, alphas_cumprod, grid, skip_prk_steps, final_alpha_cumprod=1.0):
    """PNDM (three Runge-Kutta steps, then PLMS) or PLMS with a Heun first step (``skip_prk_steps``) on the
    descending integer ``grid``; the last step goes to ``final_alpha_cumprod``.

    Returns ``(x [B, ...], calls)``: ``calls`` the timesteps the model was evaluated at, in order."""
    grid = [int(t) for t in grid]
    targets = grid[1:] + [-1]  # -1: the final level

    def level(t):
        return float(alphas_cumprod[t]) if t >= 0 else final_alpha_cumprod

    calls, history = [], []

    def model(z, t):
        calls.append(t)
        return eps_fn(z, t)

    if skip_prk_steps:
        t, t_next = grid[0], targets[0]
        e0 = model(x, t)
        history.append(e0)
        x_euler = _transfer(x, e0, level(t), level(t_next))
        if len(grid) == 1:
            return x_euler, calls
        x = _transfer(x, (e0 + model(x_euler, t_next)) / 2, level(t), level(t_next))
        first_multistep = 1
    else:
        first_multistep = min(3, len(grid))
        for t, t_next in zip(grid[:first_multistep], targets):
            t_eval = max(t_next, 0)  # the final step's last stage is evaluated at timestep 0
            mid = (t + t_eval + 1) // 2
            a, a_mid, a_next = level(t), level(mid), level(t_next)
            e1 = model(x, t)
            e2 = model(_transfer(x, e1, a, a_mid), mid)
            e3 = model(_transfer(x, e2, a, a_mid), mid)
            e4 = model(_transfer(x, e3, a, a_next), t_eval)
            history.append(e1)
            x = _transfer(x, (e1 + 2 * e2 + 2 * e3 + e4) / 6, a, a_next)
    for t, t_next in zip(grid[first_multistep:], targets[first_multistep:]):
        history.append(model(x, t))
        recent = history[-4:][::-1]  # newest first
        eps = sum(c * e for c, e in zip(AB[len(recent)], recent))
        x = _transfer(x, eps, level(t), level(t_next))
    return x, calls


def _x(seed=0):
    return torch.randn((32, 1, 8, 8), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _run(sched, x, **set_kw):
    sched.set_timesteps(**set_kw)
    for t in sched.timesteps:
        x = sched.step(IMAGE(x, t).sample, t, x).prev_sample
    return x


UNEVEN = [999, 800, 600, 420, 250, 120, 40, 5]  # odd gaps: midpoints 900, 700, 510 (rounded up)


@pytest.mark.parametrize("skip_prk", [False, True])
@pytest.mark.parametrize("grid", [UNEVEN, [951, 500, 3], [700, 1], [999, 333, 101, 37]], ids=str)
def test_custom_grid_matches_pndm_by_hand(skip_prk, grid):
    x = _x()
    ours = PNDMSolver(skip_prk_steps=skip_prk, set_alpha_to_one=True)
    a = _run(ours, x, timesteps=grid)
    b, calls = pndm_by_hand(IMAGE.eps_fn, x, ours.alphas_cumprod.double(), grid, skip_prk)
    assert ours.timesteps.tolist() == calls  # the same model calls, midpoints included
    torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    # the functional form (what get_sample_fn("pndm"/"plms") returns) takes the same plan
    f = sample_pndm(IMAGE.eps_fn, x, ours.alphas_cumprod, grid, skip_prk_steps=skip_prk)
    torch.testing.assert_close(f.sample, b, atol=1e-10, rtol=0)
    assert f.nfe == len(calls)


def test_uneven_grid_midpoints_are_the_rounded_up_halves():
    ours = PNDMSolver()
    ours.set_timesteps(timesteps=UNEVEN)
    assert ours.timesteps.tolist()[:12] == [999, 900, 900, 800, 800, 700, 700, 600, 600, 510, 510, 420]


@pytest.mark.parametrize("skip_prk", [False, True])
@pytest.mark.parametrize("steps", [10, 20, 50])
def test_custom_grid_equal_to_diffusers_grid_matches_diffusers(skip_prk, steps):
    # leading spacing with T // N even (100, 50, 20): diffusers' targets t - T//N and midpoints t' + T//N//2
    # are the next grid point and t - (t - t') // 2, so the custom path must give diffusers' samples.
    ref = PNDMScheduler(skip_prk_steps=skip_prk, set_alpha_to_one=True)
    ref.alphas_cumprod, ref.final_alpha_cumprod = ref.alphas_cumprod.double(), ref.final_alpha_cumprod.double()
    ref.set_timesteps(steps)
    grid = ref._timesteps[::-1].tolist()
    x = _x(1)
    b = _run(ref, x, num_inference_steps=steps)
    ours = PNDMSolver(skip_prk_steps=skip_prk, set_alpha_to_one=True)
    a = _run(ours, x, timesteps=grid)
    assert ours.timesteps.tolist() == ref.timesteps.tolist()
    torch.testing.assert_close(a, b, atol=1e-9, rtol=0)
    # and the hand-written reference agrees with diffusers on its grid (the reference is checked too)
    c, _ = pndm_by_hand(IMAGE.eps_fn, x, ours.alphas_cumprod.double(), grid, skip_prk)
    torch.testing.assert_close(c, b, atol=1e-9, rtol=0)
