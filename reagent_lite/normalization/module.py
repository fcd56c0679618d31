"""`Preprocessor`: raw feature values + presence mask → normalized network input.

Features are grouped by type at construction; each group is one vectorised transform
whose per-feature constants live in buffers (so `.to(device)` moves them and
`torch.export` captures them). All Python control flow is decided in `__init__`, so the
module exports with a dynamic batch dimension.

Output columns follow the order of `feature_ids`; an ENUM feature expands to one column
per possible value (see `out_feature_names`). A missing feature (presence 0, or a NaN
value) gives 0 in all its columns: the raw value is replaced before any arithmetic and the
output is selected with `torch.where`, so no NaN or magic value can leak through.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from reagent_lite.errors import DataError
from reagent_lite.normalization.params import (
    BOXCOX_MIN_BASE,
    FeatureType,
    NormalizationParameters,
)

# ReAgent's output range: the logit of a probability clamped to (1e-5, 1 - 1e-5).
MAX_FEATURE_VALUE = 11.513
MIN_FEATURE_VALUE = -MAX_FEATURE_VALUE
# Probabilities are clamped before the logit (as ReAgent's current preprocessor).
PROBABILITY_CLAMP = 0.01
# CONTINUOUS_ACTION maps [min, max] onto [-1 + EPS, 1 - EPS].
EPS = 1e-6
# `normalize_rows` pads each chunk to a multiple of this many rows before `forward`. ATen
# computes a transcendental op (pow, log) over a run of values with vector code but the
# run's last few elements (its length modulo twice the vector width) with scalar code,
# which can differ in the last bit (AVX-512: Sleef's powf against glibc's): a row's
# values would then depend on the rows normalized beside it (prepared row groups and
# streamed windows chunk a shard differently). Padded, every value takes the vector code.
_VECTOR_ROWS = 128

_TYPE_ORDER = list(FeatureType)


@contextmanager
def one_intraop_thread() -> Iterator[None]:
    """Torch ops inside run on one intra-op thread (the previous count is restored).

    For memory-bound passes over cache-sized chunks: a second OpenMP thread gains little
    there and, on a busy machine, waits for its descheduled peer at every operation
    (measured on 2 shared cores: 0.01 s on one thread vs up to seconds on two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _format_value(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


class Preprocessor(nn.Module):
    """Normalizes `[..., F]` raw values (order `feature_ids`) into `[..., out_dim]`: rows
    `[B, F]`, or candidate sets `[B, K, F]` as they come (the served parametric model never
    merges B and K, whose product a traced reshape would have to tell apart from B)."""

    def __init__(
        self, feature_ids: Sequence[str], params: Mapping[str, NormalizationParameters]
    ) -> None:
        super().__init__()
        self.feature_ids = [str(f) for f in feature_ids]
        missing = [f for f in self.feature_ids if f not in params]
        if missing:
            raise DataError(
                f"normalization has no parameters for feature(s) {', '.join(missing)} "
                "(refit normalization or supply a file that covers every feature)"
            )
        if len(set(self.feature_ids)) != len(self.feature_ids):
            raise ValueError("feature_ids must be distinct")
        self.params = {f: params[f] for f in self.feature_ids}
        self.feature_types = [self.params[f].feature_type for f in self.feature_ids]

        # Per-feature output width and names, in input order.
        widths: list[int] = []
        self.out_feature_names: list[str] = []
        for f in self.feature_ids:
            p = self.params[f]
            if p.feature_type is FeatureType.ENUM:
                assert p.possible_values is not None
                widths.append(len(p.possible_values))
                self.out_feature_names += [f"{f}={_format_value(v)}" for v in p.possible_values]
            else:
                widths.append(1)
                self.out_feature_names.append(f)
        self.out_dim = sum(widths)
        starts = [sum(widths[:i]) for i in range(len(widths))]

        # Groups in FeatureType order; `grouped_cols` lists, in the order the groups emit
        # them, the input-order output column of each emitted column.
        self._groups: list[str] = []
        grouped_cols: list[int] = []
        for t in _TYPE_ORDER:
            members = [i for i, ft in enumerate(self.feature_types) if ft is t]
            if not members:
                continue
            name = t.value.lower()
            self._buf(f"{name}_idx", torch.tensor(members, dtype=torch.long))
            getattr(self, f"_init_{name}")([self.params[self.feature_ids[i]] for i in members])
            self._groups.append(name)
            for i in members:
                grouped_cols += range(starts[i], starts[i] + widths[i])
        perm = [0] * self.out_dim
        for pos, col in enumerate(grouped_cols):
            perm[col] = pos
        self._buf("out_perm", torch.tensor(perm, dtype=torch.long))
        col_src = [i for i, w in enumerate(widths) for _ in range(w)]
        self._buf("out_src", torch.tensor(col_src, dtype=torch.long))

    def _buf(self, name: str, t: torch.Tensor) -> None:
        self.register_buffer(name, t)

    def _get(self, name: str) -> torch.Tensor:
        b = getattr(self, name)
        assert isinstance(b, torch.Tensor)
        return b

    @staticmethod
    def _vec(values: Sequence[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32).unsqueeze(0)  # [1, Fg]

    # --- per-type constants and transforms (x: [..., Fg] with missing slots already 0) ---

    def _init_binary(self, ps: list[NormalizationParameters]) -> None:
        pass

    def _apply_binary(self, x: torch.Tensor) -> torch.Tensor:
        return (x != 0).to(x.dtype)

    def _init_probability(self, ps: list[NormalizationParameters]) -> None:
        pass

    def _apply_probability(self, x: torch.Tensor) -> torch.Tensor:
        return torch.logit(x.clamp(PROBABILITY_CLAMP, 1.0 - PROBABILITY_CLAMP))

    def _init_continuous(
        self, ps: list[NormalizationParameters], prefix: str = "continuous"
    ) -> None:
        self._buf(f"{prefix}_mean", self._vec([p.mean for p in ps]))
        self._buf(f"{prefix}_std", self._vec([p.stddev for p in ps]))

    def _apply_continuous(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self._get("continuous_mean")) / self._get("continuous_std")

    def _init_boxcox(self, ps: list[NormalizationParameters]) -> None:
        lam = [float(p.boxcox_lambda or 0.0) for p in ps]
        self._buf("boxcox_shift", self._vec([float(p.boxcox_shift or 0.0) for p in ps]))
        self._buf("boxcox_lambda", self._vec(lam))
        # λ = 0 is the log transform; avoid dividing by 0 in the unused branch.
        self._buf("boxcox_is_log", self._vec([abs(v) < 1e-6 for v in lam]).bool())
        self._buf("boxcox_safe_lambda", self._vec([v if abs(v) >= 1e-6 else 1.0 for v in lam]))
        self._init_continuous(ps, prefix="boxcox")

    def _apply_boxcox(self, x: torch.Tensor) -> torch.Tensor:
        base = (x + self._get("boxcox_shift")).clamp_min(BOXCOX_MIN_BASE)
        lam = self._get("boxcox_safe_lambda")
        y = torch.where(
            self._get("boxcox_is_log"), torch.log(base), (torch.pow(base, lam) - 1.0) / lam
        )
        return (y - self._get("boxcox_mean")) / self._get("boxcox_std")

    def _init_quantile(self, ps: list[NormalizationParameters]) -> None:
        qs = [list(p.quantiles or []) for p in ps]
        width = max(len(q) for q in qs)
        # Pad with the last boundary: values below the max never count the padding.
        padded = [q + [q[-1]] * (width - len(q)) for q in qs]
        self._buf("quantile_bounds", torch.tensor(padded, dtype=torch.float32).unsqueeze(0))
        self._buf("quantile_min", self._vec([q[0] for q in qs]))
        self._buf("quantile_max", self._vec([q[-1] for q in qs]))
        self._buf("quantile_intervals", self._vec([len(q) - 1 for q in qs]))

    def _apply_quantile(self, x: torch.Tensor) -> torch.Tensor:
        bounds = self._get("quantile_bounds")  # [1, Fg, Q]
        qmin, qmax = self._get("quantile_min"), self._get("quantile_max")
        ge = x.unsqueeze(-1) >= bounds  # [..., Fg, Q]
        left = torch.where(ge, bounds, qmin.unsqueeze(-1)).amax(dim=-1)
        right = torch.where(ge, qmax.unsqueeze(-1), bounds).amin(dim=-1)
        left_index = ge.to(x.dtype).sum(dim=-1) - 1.0
        gap = right - left
        frac = (x - left) / torch.where(gap > 0, gap, torch.ones_like(gap))
        inside = (left_index + frac) / self._get("quantile_intervals")
        out = torch.where(x >= qmax, torch.ones_like(x), inside)
        return torch.where(x <= qmin, torch.zeros_like(x), out)

    def _init_enum(self, ps: list[NormalizationParameters]) -> None:
        vals = [list(p.possible_values or []) for p in ps]
        width = max(len(v) for v in vals)
        nan = float("nan")  # padding that equals nothing; its columns are dropped anyway
        padded = [v + [nan] * (width - len(v)) for v in vals]
        self._buf("enum_values", torch.tensor(padded, dtype=torch.float32).unsqueeze(0))
        keep = [i * width + k for i, v in enumerate(vals) for k in range(len(v))]
        self._buf("enum_keep", torch.tensor(keep, dtype=torch.long))

    def _apply_enum(self, x: torch.Tensor) -> torch.Tensor:
        hot = (x.unsqueeze(-1) == self._get("enum_values")).to(x.dtype)  # [..., Fg, V]
        return hot.flatten(-2).index_select(-1, self._get("enum_keep"))

    def _init_continuous_action(self, ps: list[NormalizationParameters]) -> None:
        lo = [float(p.min_value if p.min_value is not None else -1.0) for p in ps]
        hi = [float(p.max_value if p.max_value is not None else 1.0) for p in ps]
        self._buf("action_center", self._vec([(a + b) / 2.0 for a, b in zip(lo, hi, strict=True)]))
        # A constant action maps to 0 rather than dividing by a zero range.
        scale = [2.0 * (1.0 - EPS) / (b - a) if b > a else 0.0 for a, b in zip(lo, hi, strict=True)]
        self._buf("action_scale", self._vec(scale))

    def _apply_continuous_action(self, x: torch.Tensor) -> torch.Tensor:
        y = (x - self._get("action_center")) * self._get("action_scale")
        return y.clamp(-1.0 + EPS, 1.0 - EPS)

    def _init_do_not_preprocess(self, ps: list[NormalizationParameters]) -> None:
        pass

    def _apply_do_not_preprocess(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def forward(self, values: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
        """`values`, `presence`: `[..., F]` (presence > 0 = present) → `[..., out_dim]`
        float32."""
        values = values.to(torch.float32)
        present = (presence > 0) & ~torch.isnan(values)
        x = torch.where(present, values, torch.zeros_like(values))
        if self.out_dim == 0:
            return x[..., :0]
        outs = [
            getattr(self, f"_apply_{name}")(x.index_select(-1, self._get(f"{name}_idx")))
            for name in self._groups
        ]
        y = torch.cat(outs, dim=-1).index_select(-1, self._get("out_perm"))
        keep = present.index_select(-1, self._get("out_src"))
        y = torch.where(keep, y, torch.zeros_like(y))
        return y.clamp(MIN_FEATURE_VALUE, MAX_FEATURE_VALUE)

    # --- bulk path for a training shard (not part of the exported graph) ---

    def _affine(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(mean, std) `[1, F]` in input order when every feature is CONTINUOUS or
        DO_NOT_PREPROCESS (whose transform, (x - 0) / 1, is the identity bit for bit)."""
        affine = (FeatureType.CONTINUOUS, FeatureType.DO_NOT_PREPROCESS)
        if not self.feature_ids or any(t not in affine for t in self.feature_types):
            return None
        ps = [self.params[f] for f in self.feature_ids]
        cont = [t is FeatureType.CONTINUOUS for t in self.feature_types]
        mean = [p.mean if c else 0.0 for p, c in zip(ps, cont, strict=True)]
        std = [p.stddev if c else 1.0 for p, c in zip(ps, cont, strict=True)]
        return self._vec(mean), self._vec(std)

    @torch.no_grad()
    def normalize_rows(
        self, values: torch.Tensor, *, out: torch.Tensor | None = None, chunk_rows: int = 0
    ) -> torch.Tensor:
        """`forward` for a whole shard on the CPU: `values` float32 `[N, F]` with NaN where a
        feature is absent (no presence matrix) → `[N, out_dim]`, equal to `forward(values,
        ~isnan(values))`. Works through cache-sized row chunks; when `out_dim == F` and no
        `out` is given the result overwrites `values` (the raw values are gone afterwards).
        All-affine feature sets (CONTINUOUS / DO_NOT_PREPROCESS) take a fused in-place path
        doing the same arithmetic as `forward`, so the outputs are identical.
        Runs on one intra-op thread (see `one_intraop_thread`)."""
        n, f = values.shape
        chunk_rows = chunk_rows or max(1, (1 << 20) // max(f, self.out_dim, 1))
        if f != len(self.feature_ids):
            raise ValueError(f"expected {len(self.feature_ids)} feature columns, got {f}")
        if out is None:
            same = self.out_dim == f and values.dtype == torch.float32 and values.is_contiguous()
            out = values if same else torch.empty(n, self.out_dim, dtype=torch.float32)
        affine = self._affine()
        with one_intraop_thread():
            self._normalize_chunks(values, out, affine, chunk_rows)
        return out

    def _normalize_chunks(
        self,
        values: torch.Tensor,
        out: torch.Tensor,
        affine: tuple[torch.Tensor, torch.Tensor] | None,
        chunk_rows: int,
    ) -> None:
        for s in range(0, values.shape[0], chunk_rows):
            x = values[s : s + chunk_rows]
            if affine is not None:
                y = out[s : s + chunk_rows]
                if y.data_ptr() != x.data_ptr():
                    y.copy_(x)
                y.sub_(affine[0]).div_(affine[1]).clamp_(MIN_FEATURE_VALUE, MAX_FEATURE_VALUE)
                y.nan_to_num_(nan=0.0)
            else:
                rows = x.shape[0]
                if pad := -rows % _VECTOR_ROWS:  # absent features in the padding rows
                    x = torch.cat([x, x.new_full((pad, x.shape[1]), float("nan"))])
                present = ~torch.isnan(x)
                out[s : s + chunk_rows] = self(x, present.to(torch.float32))[:rows]
