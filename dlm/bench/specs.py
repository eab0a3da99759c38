"""`dlm bench --samplers` entries and `--steps` budgets: parsing and checking.

An entry is `name[:key=value...]`: a registered sampler or an external row (`dlm.bench.external`),
with engine options (`kv=`, `xblock=`, `refresh=`, `cut=`, `block=`, `steps=`, `window=`, `open=`, `drift=`,
`probe=`)
and sampler or pipeline overrides; docs/benchmarks.md lists them. `SamplerSpec` is what the harness
runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlm.bench.external_rows import external_rows
from dlm.decoding_config import KV_CACHE_MODES

# ----------------------------------------------------------------------------- sampler specs
@dataclass(frozen=True)
class SamplerSpec:
    """One entry of `--samplers`: `name[:key=value[:key=value...]]`.

    `kv=none|prefix|dual|prompt|elastic|auto` picks the KV cache for this entry (else the run's `--kv-cache`;
    `prompt` caches only the prompt, see `dlm.generate`); with `kv=elastic`, `drift=T` and `probe=N` set its
    drift test (`generate(cache_drift_threshold=T, cache_drift_probe=N)`, `dlm.engine.masked.elastic`);
    `xblock=1` (with a cache) extends the cache from block to block (`generate(cache_across_blocks=True)`);
    `refresh=N` (with a cache) rebuilds it by a full forward every N steps inside a block
    (`generate(cache_refresh_every=N)`; 0, the default, at block starts only);
    `cut=1` feeds the model only up to the current block's end (`generate(cut_trailing_masks=True)`,
    an approximation for bidirectional models); `block=N` runs this entry at block length N instead of
    the run's `--block-length` (either engine; N must divide `--gen-length`); `steps=A/B` runs this
    entry at its own budgets instead of the run's `--steps` (HEX's published total); `window=W` and
    `open=f` decode W blocks at once, the next opened at progress f (D2F's window:
    `generate(window_blocks=W, window_open_at=f)`); other
    keys override the sampler's config (`threshold:tau=0.7`) or, for an external row
    (`dlm.bench.external`), its options (`diffusers-llada2:threshold=0.9`). `label` is the entry as written.
    """

    label: str
    name: str
    options: tuple = ()
    kv_cache: str | None = None
    cache_across_blocks: bool = False
    cut_trailing_masks: bool = False
    cache_refresh_every: int = 0
    block_length: int | None = None
    steps: tuple = ()
    window_blocks: int = 1
    window_open_at: float = 0.1
    drift: tuple = ()  # given of ("cache_drift_threshold", T), ("cache_drift_probe", N)

    def engine_kwargs(self) -> dict:
        """`dlm.generate` keywords of the elastic cache's drift test this entry sets (empty: the defaults)."""
        return dict(self.drift)

    @property
    def is_external(self) -> bool:
        """An external engine row (`dlm.bench.external`), not one of our samplers."""
        return self.name in external_rows()

    @property
    def option_dict(self) -> dict:
        return dict(self.options)

    def block_for(self, cfg) -> int:
        """This entry's block length: its own `block=N`, else the run's `--block-length`."""
        return self.block_length or cfg.block_length

    def budgets_for(self, budgets: list[int]) -> list[int]:
        """This entry's budgets: its own `steps=A/B`, else the run's `--steps` (e.g. HEX, whose
        published total is far above the other entries' budgets)."""
        return list(self.steps) or budgets


def _flag(key: str, value: str, entry: str) -> bool:
    """An engine on/off option of a sampler entry (`xblock=1`, `cut=1`)."""
    if value not in ("0", "1"):
        raise ValueError(f"{key}={value!r} in {entry!r}: must be 0 or 1")
    return value == "1"


def _check_drift(entry: str, kv: str | None, drift: dict) -> None:
    """`drift=` / `probe=` need `kv=elastic` and values the engine takes (checked now, not mid-run)."""
    if kv != "elastic":
        raise ValueError(f"{entry!r}: drift= and probe= set the elastic cache's drift test; add kv=elastic")
    from dlm.decoding_config import DecodingConfig

    try:
        DecodingConfig(kv_cache="elastic", **drift)
    except ValueError as err:
        raise ValueError(f"{entry!r}: {err}") from None


def parse_sampler_specs(text: str | list[str]) -> list[SamplerSpec]:
    """Parse `a,b:key=v,c` into specs; ValueError names an unknown sampler or a malformed option."""
    from samplers import available_samplers
    from samplers.registry import parse_option_value

    entries = text if isinstance(text, list) else [t for t in text.split(",")]
    entries = [e.strip() for e in entries if e.strip()]
    if not entries:
        raise ValueError("no samplers given; pass e.g. --samplers confidence,threshold")
    rows = external_rows()
    known = list(available_samplers()) + list(rows)
    specs, seen = [], set()
    for entry in entries:
        name, *opts = entry.split(":")
        if name not in known:
            raise ValueError(f"unknown sampler {name!r}; valid: {', '.join(known)}")
        options, kv, xblock, cut, refresh, block, steps = [], None, False, False, 0, None, ()
        window, drift = {}, {}
        for opt in opts:
            if "=" not in opt:
                raise ValueError(f"sampler option {opt!r} in {entry!r} must be key=value")
            key, value = opt.split("=", 1)
            if key == "kv":
                if value not in KV_CACHE_MODES:
                    raise ValueError(f"kv={value!r} in {entry!r}: must be one of {', '.join(KV_CACHE_MODES)}")
                kv = value
            elif key == "xblock":
                xblock = _flag(key, value, entry)
            elif key == "cut":
                cut = _flag(key, value, entry)
            elif key == "refresh":
                if not value.isdigit():
                    raise ValueError(f"refresh={value!r} in {entry!r}: must be a whole number of steps (0 = block starts only)")
                refresh = int(value)
            elif key == "block":
                if not value.isdigit() or int(value) == 0:
                    raise ValueError(f"block={value!r} in {entry!r}: must be a positive whole number of tokens")
                block = int(value)
            elif key == "steps":
                if not all(v.isdigit() and int(v) > 0 for v in value.split("/")):
                    raise ValueError(f"steps={value!r} in {entry!r}: must be positive whole numbers joined by '/', e.g. steps=160/320")
                steps = tuple(int(v) for v in value.split("/"))
            elif key == "drift":
                try:
                    drift["cache_drift_threshold"] = float(value)
                except ValueError:
                    raise ValueError(f"drift={value!r} in {entry!r}: must be a number (the elastic cache's cosine "
                                     "threshold, e.g. drift=0.999)") from None
            elif key == "probe":
                if not value.isdigit():
                    raise ValueError(f"probe={value!r} in {entry!r}: must be a whole number of cached positions")
                drift["cache_drift_probe"] = int(value)
            elif key in ("window", "open"):  # D2F block window: generate(window_blocks=, window_open_at=)
                window["window_blocks" if key == "window" else "window_open_at"] = parse_option_value(value)
            else:
                options.append((key, parse_option_value(value)))
        if entry in seen:
            raise ValueError(f"sampler {entry!r} is listed twice")
        seen.add(entry)
        spec = SamplerSpec(label=entry, name=name, options=tuple(options), kv_cache=kv, cache_across_blocks=xblock,
                           cut_trailing_masks=cut, cache_refresh_every=refresh, block_length=block,
                           steps=steps, drift=tuple(drift.items()), **window)
        if drift:
            _check_drift(entry, kv, drift)
        if name in rows:
            rows[name][0].check_entry(spec)  # its own options; our engine's flags refused
            specs.append(spec)
            continue
        if xblock and kv in (None, "none", "auto"):
            raise ValueError(f"{entry!r}: xblock=1 extends a KV cache; add kv=prefix or kv=dual")
        if xblock and kv in ("prompt", "elastic"):
            raise ValueError(f"{entry!r}: kv={kv} already keeps its cache across blocks; drop xblock=1")
        if refresh and kv in (None, "none"):
            raise ValueError(f"{entry!r}: refresh={refresh} rebuilds a KV cache; add kv=prefix or kv=dual")
        from samplers import get_sampler
        if cut and get_sampler(name, **spec.option_dict).ensemble:  # validates the config now, not mid-run
            raise ValueError(f"{entry!r}: cut=1 is not supported with an ensemble sampler; drop it")
        specs.append(spec)
    return specs


def parse_steps(text: str | list[int]) -> list[int]:
    if isinstance(text, str):
        try:
            steps = [int(s) for s in text.split(",") if s.strip()]
        except ValueError:
            raise ValueError(f"--steps must be comma-separated integers, got {text!r}") from None
    else:
        steps = [int(s) for s in text]
    if not steps or any(s <= 0 for s in steps):
        raise ValueError(f"--steps needs positive integers, got {text!r}")
    return sorted(set(steps))


# ----------------------------------------------------------------------------- model and suite
