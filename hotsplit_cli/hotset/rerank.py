"""Re-rank a reference routing histogram for my own traffic (numpy only).

Shape letters: L = MoE layers, E = routed experts per layer, G = strength grid points.

Model: per layer, my traffic's expert shares p are Dirichlet-distributed around the
reference's shares q with concentration A (the *strength*, in routed assignments; S tokens
are A = S * top_k assignments). My counts n are then Dirichlet-multinomial, and the posterior
mean of p is

    p_post[e] = (A * q[e] + n[e]) / (A + N),    N = sum_e n[e].

A = 0 returns my ranking, A = inf the reference's. Left to the data, A maximises the
Dirichlet-multinomial marginal likelihood of my counts (empirical Bayes):

    log P(n | A) = lgamma(A) - lgamma(A + N) + sum_e [lgamma(A q[e] + n[e]) - lgamma(A q[e])] + const.

When my traffic looks like a draw from the reference, the likelihood keeps growing with A
and the reference dominates (its many tokens beat my noisy few); when my counts contradict
the reference, a small A wins and my evidence dominates. See docs/real-models.md for an
example.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.core.errors import HistogramError, UsageError
from hotsplit_cli.core.units import gib
from hotsplit_cli.hotset.budget import resolve_hot_budget
from hotsplit_cli.hotset.planner import plan_hot_set
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank, uniform_precision
from hotsplit_cli.traffic.hist import Histogram, load_hist
from hotsplit_cli.traffic.quality import Quality, filled, reordered
from hotsplit_cli.traffic.recipe_match import check_hist_matches_recipe

# Share floor for experts the reference never saw: a zero prior share would make a single
# observation in my traffic infinitely surprising (and lgamma(0) undefined).
REF_SHARE_FLOOR = 1e-6
# Strength grid for empirical Bayes, in routed assignments: 1e-2 .. 1e12, refined after.
_GRID_A = np.logspace(-2, 12, 281)
STRENGTH_MODES = ("shared", "layer")


def lgamma(x: np.ndarray) -> np.ndarray:
    """Vectorised log-gamma for x > 0 (float64, absolute error < 1e-12 on the tested range).

    Shift x up by 8 with lgamma(x) = lgamma(x + 8) - log(x (x+1) ... (x+7)), then the Stirling
    series, which is accurate to double precision beyond 8.
    """
    x = np.asarray(x, dtype=np.float64)
    shift = np.zeros_like(x)
    y = x.copy()
    for _ in range(8):
        small = y < 8.0
        if not small.any():
            break
        shift = shift + np.where(small, np.log(np.where(small, y, 1.0)), 0.0)
        y = np.where(small, y + 1.0, y)
    inv = 1.0 / y
    inv2 = inv * inv
    series = inv * (1 / 12 - inv2 * (1 / 360 - inv2 * (1 / 1260 - inv2 * (1 / 1680 - inv2 / 1188))))
    return (y - 0.5) * np.log(y) - y + 0.5 * math.log(2 * math.pi) + series - shift


def dm_log_likelihood(counts_LE: np.ndarray, prior_LE: np.ndarray, strength_G: np.ndarray) -> np.ndarray:
    """Dirichlet-multinomial log marginal likelihood, without the multinomial coefficient.

    counts_LE: my routed assignments; prior_LE: reference shares (rows sum to 1, all > 0);
    strength_G: concentrations A in routed assignments. Returns float64 [G, L].
    """
    A = np.asarray(strength_G, dtype=np.float64)[:, None, None]  # [G, 1, 1]
    n = counts_LE[None]  # [1, L, E]
    alpha = A * prior_LE[None]  # [G, L, E]
    N = n.sum(axis=2)  # [1, L]
    A2 = A[:, :, 0]
    return (lgamma(A2) - lgamma(A2 + N)) + (lgamma(alpha + n) - lgamma(alpha)).sum(axis=2)


def fit_strength(counts_LE: np.ndarray, prior_LE: np.ndarray, mode: str = "shared") -> np.ndarray:
    """Empirical-Bayes strength per layer (routed assignments, float64 [L], may be inf).

    mode "shared": one A maximising the summed likelihood of every layer (pools evidence,
    steadier for small samples); "layer": one A per layer. A grid search in log A refined by
    golden section; an optimum at the grid's top is reported as inf (my counts are
    indistinguishable from draws of the reference).
    """
    if mode not in STRENGTH_MODES:
        raise UsageError(f"strength mode must be one of {', '.join(STRENGTH_MODES)}, got {mode!r}")
    L = counts_LE.shape[0]
    has = counts_LE.sum(axis=1) > 0
    out = np.full(L, np.inf)
    if not has.any():
        return out  # no evidence at all: the reference is all there is
    n, q = counts_LE[has], prior_LE[has]
    ll_GL = dm_log_likelihood(n, q, _GRID_A)
    if mode == "shared":
        out[has] = _argmax_refined(lambda a: dm_log_likelihood(n, q, a).sum(axis=1), ll_GL.sum(axis=1))
    else:
        for j, i in enumerate(np.flatnonzero(has)):
            nj, qj = n[j:j + 1], q[j:j + 1]
            out[i] = _argmax_refined(lambda a, nj=nj, qj=qj: dm_log_likelihood(nj, qj, a)[:, 0], ll_GL[:, j])
    return out


def _argmax_refined(f, values_G: np.ndarray) -> float:
    g = int(np.argmax(values_G))
    if g == len(_GRID_A) - 1:
        return math.inf
    lo = math.log(_GRID_A[max(g - 1, 0)])
    hi = math.log(_GRID_A[min(g + 1, len(_GRID_A) - 1)])
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(40):  # golden section on log A (unimodal near the grid maximum)
        a = hi - ratio * (hi - lo)
        b = lo + ratio * (hi - lo)
        fa, fb = f(np.exp([a, b]))
        if fa >= fb:
            hi = b
        else:
            lo = a
    return float(math.exp((lo + hi) / 2))


def reference_shares(ref_LE: np.ndarray) -> np.ndarray:
    """Reference counts -> shares per layer with a floor (rows sum to 1, every entry > 0).

    A layer the reference never saw becomes uniform."""
    ref = np.asarray(ref_LE, dtype=np.float64)
    row = ref.sum(axis=1, keepdims=True)
    E = ref.shape[1]
    q = np.divide(ref, row, out=np.full_like(ref, 1.0 / E), where=row > 0)
    q = q + REF_SHARE_FLOOR / E
    return q / q.sum(axis=1, keepdims=True)


def posterior_shares(mine_LE: np.ndarray, prior_LE: np.ndarray, strength_L: np.ndarray) -> np.ndarray:
    """Posterior mean shares (A q + n) / (A + N) per layer; A = inf gives q, N = 0 gives q."""
    n = np.asarray(mine_LE, dtype=np.float64)
    A = np.asarray(strength_L, dtype=np.float64)[:, None]
    N = n.sum(axis=1, keepdims=True)
    mine_share = np.divide(n, N, out=np.zeros_like(n), where=N > 0)
    w_ref = ref_weight(A, N)
    return w_ref * prior_LE + (1.0 - w_ref) * mine_share


def ref_weight(strength: np.ndarray, assignments: np.ndarray) -> np.ndarray:
    """A / (A + N): the reference's weight in the posterior mean (1 when A is inf or N is 0)."""
    A = np.asarray(strength, dtype=np.float64)
    N = np.asarray(assignments, dtype=np.float64)
    finite = np.isfinite(A) & ((A + N) > 0)
    safe = np.where(finite, A, 0.0)
    return np.where(finite, safe / np.where(finite, safe + N, 1.0), 1.0)


def spearman(a_E: np.ndarray, b_E: np.ndarray) -> float | None:
    """Spearman rank correlation with average ranks for ties; None when a side is constant."""
    ra, rb = _avg_ranks(a_E), _avg_ranks(b_E)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return None if den == 0 else float((ra * rb).sum() / den)


def _avg_ranks(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=np.float64)
    _, inv, cnt = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    return sums[inv] / cnt[inv]


@dataclass(frozen=True)
class Reranked:
    """A re-ranked histogram and how it came about."""

    hist: Histogram
    strength_L: np.ndarray  # float64 [L], routed assignments (inf = the reference alone)
    strength_source: str  # "given" | "empirical Bayes (shared)" | "empirical Bayes (per layer)"
    spearman_L: list[float | None]  # REF vs MINE per layer
    mine_assignments_L: np.ndarray  # float64 [L], N per layer
    ref_weight_L: np.ndarray  # float64 [L], A / (A + N): how much of the result is the reference


def rerank(ref: Histogram, mine: Histogram, strength_tokens: float | None = None,
           mode: str = "shared") -> Reranked:
    """Combine a reference histogram with my (possibly small) sample.

    strength_tokens: the prior's weight in tokens (0 = my ranking, inf = the reference's);
    None chooses it by empirical Bayes (`mode` "shared" or "layer"). The result's rows are
    posterior-mean shares scaled to my routed assignments per token (tokens x top_k).
    """
    mine_in, mine = mine, align_to(ref, mine)
    top_k = mine.top_k
    q = reference_shares(ref.counts_LE)
    n = mine.counts_LE
    L = n.shape[0]
    if strength_tokens is None:
        A = fit_strength(n, q, mode)
        source = "empirical Bayes (shared)" if mode == "shared" else "empirical Bayes (per layer)"
    else:
        if not strength_tokens >= 0:  # also refuses NaN
            raise UsageError(f"--strength must be >= 0 tokens, got {strength_tokens}")
        A = np.full(L, float(strength_tokens) * top_k)
        source = "given"
    p = posterior_shares(n, q, A)
    N = n.sum(axis=1)
    if strength_tokens == 0:
        # Exactly my counts: no floor from the reference leaks into experts I never saw,
        # except in layers where I saw nothing (then the reference is all there is).
        p = np.where((N > 0)[:, None], n / np.where(N > 0, N, 1.0)[:, None], p)
    tokens = mine.tokens if mine.tokens > 0 else ref.tokens
    scale = max(tokens, 1) * top_k
    hist = Histogram(
        model=mine.model if mine.model == ref.model else f"{ref.model} (re-ranked for {mine.model})",
        source=f"rerank: reference [{ref.source}] + my traffic [{mine.source}], strength {source}",
        top_k=top_k,
        tokens=tokens,
        layers=ref.layers,
        counts_LE=p * scale,
        quality=filled(_in_layer_order(mine_in, ref.layers), ref.quality),  # errors of the experts, mine first
    )
    w = ref_weight(A, N)
    if strength_tokens == 0:
        w = np.where(N > 0, 0.0, 1.0)
    rho = [spearman(ref.counts_LE[i], n[i]) for i in range(L)]
    return Reranked(hist, A, source, rho, N, w)


def _in_layer_order(hist: Histogram, layers: tuple[int, ...]) -> Quality | None:
    """`hist`'s measured errors with its rows in the order of `layers` (the same set)."""
    if hist.quality is None or hist.layers == layers:
        return hist.quality
    pos = {layer: i for i, layer in enumerate(hist.layers)}
    return reordered(hist.quality, [pos[layer] for layer in layers])


def align_to(ref: Histogram, mine: Histogram) -> Histogram:
    """MINE with its rows in REF's layer order; refuses histograms of different models."""
    if ref.num_experts != mine.num_experts:
        raise HistogramError(f"REF has {ref.num_experts} experts per layer but MINE has {mine.num_experts}",
                             "both histograms must come from the same model")
    if set(ref.layers) != set(mine.layers):
        only_ref = sorted(set(ref.layers) - set(mine.layers))
        only_mine = sorted(set(mine.layers) - set(ref.layers))
        raise HistogramError(f"REF and MINE cover different MoE layers (only in REF: {only_ref[:8]}, "
                             f"only in MINE: {only_mine[:8]})", "both histograms must come from the same model")
    if ref.top_k != mine.top_k:
        raise HistogramError(f"REF has top_k {ref.top_k} but MINE has top_k {mine.top_k}",
                             "both histograms must come from the same model")
    if mine.layers == ref.layers:
        return mine
    pos = {layer: i for i, layer in enumerate(mine.layers)}
    order = [pos[layer] for layer in ref.layers]
    return Histogram(mine.model, mine.source, mine.top_k, mine.tokens, ref.layers, mine.counts_LE[order],
                     mine.created)


@dataclass(frozen=True)
class HotChange:
    """How the hot set at one budget moves from REF's to the re-ranked one."""

    budget_bytes: int
    hot_experts: int  # in the re-ranked plan
    changed: int  # experts hot under one ranking and not the other, counted once per swap pair
    changed_L: np.ndarray  # int64 [L]


def hot_change(ref_LE: np.ndarray, new_LE: np.ndarray, expert_bytes, budget_bytes: int) -> HotChange:
    """Plan both rankings under the same budget and count the experts that enter the hot set."""
    a = plan_hot_set(ref_LE, expert_bytes, budget_bytes).hot_RLE[0]
    b = plan_hot_set(new_LE, expert_bytes, budget_bytes).hot_RLE[0]
    entered_L = (b & ~a).sum(axis=1).astype(np.int64)
    return HotChange(int(budget_bytes), int(b.sum()), int(entered_L.sum()), entered_L)


def parse_strength(text: str) -> tuple[float | None, str]:
    """`auto` / `auto-layer` / `inf` / a number of tokens >= 0 -> (tokens or None, mode)."""
    t = text.strip().lower()
    if t in ("auto", "auto-shared"):
        return None, "shared"
    if t == "auto-layer":
        return None, "layer"
    try:
        value = float(t)
    except ValueError:
        raise UsageError(f"--strength: must be a number of tokens, inf, auto or auto-layer, got {text!r}") from None
    if math.isnan(value) or value < 0:
        raise UsageError(f"--strength: must be >= 0 tokens, got {text!r}")
    return value, "shared"


@dataclass(frozen=True)
class RerankRequest:
    """REF and MINE's paths, the prior's strength (see parse_strength) and, for the hot-set
    comparison without a recipe budget, the fraction of all experts hot."""

    ref_path: Path
    mine_path: Path
    strength: str = "auto"
    hot_frac: float = 0.25

    def __post_init__(self) -> None:
        parse_strength(self.strength)
        if not 0 < self.hot_frac <= 1:
            raise UsageError(f"--hot-frac: must be in (0, 1], got {self.hot_frac}")


@dataclass(frozen=True)
class RerankReport:
    """What `rerank` reports: REF re-ranked for MINE, and how the hot set moves at one budget."""

    ref_path: Path
    mine_path: Path
    result: Reranked
    change: HotChange
    budget_desc: str  # the budget both hot sets were planned at, as printed

    def strength_text(self) -> str:
        """The prior's strength in tokens, as a person reads it."""
        strength_L, top_k = self.result.strength_L, self.result.hist.top_k
        finite = strength_L[np.isfinite(strength_L)]
        if len(finite) == 0:
            return "inf (MINE looks like a draw from REF: REF's ranking kept)"
        if np.allclose(strength_L, strength_L[0]):
            return f"{strength_L[0] / top_k:.4g} tokens"
        return f"{np.median(finite) / top_k:.4g} tokens (median over layers)"

    def to_doc(self, output: Path | None) -> dict:
        r, h = self.result, self.result.hist
        return {
            "ref": str(self.ref_path),
            "mine": str(self.mine_path),
            "output": str(output) if output is not None else None,
            "strength_source": r.strength_source,
            "layers": [
                {
                    "layer": int(layer),
                    "strength_tokens": None if math.isinf(r.strength_L[i]) else float(r.strength_L[i]) / h.top_k,
                    "ref_weight": float(r.ref_weight_L[i]),
                    "mine_assignments": float(r.mine_assignments_L[i]),
                    "spearman_ref_mine": r.spearman_L[i],
                    "hot_changed": int(self.change.changed_L[i]),
                }
                for i, layer in enumerate(h.layers)
            ],
            "hot_budget": self.budget_desc,
            "hot_experts": self.change.hot_experts,
            "hot_changed": self.change.changed,
        }


def rerank_files(req: RerankRequest, recipe: Recipe | None = None, knobs: Knobs | None = None,
                 warn: Callable[[str], None] = lambda message: None) -> RerankReport:
    """Re-rank REF for MINE, and count the hot-set changes at the recipe's hot budget (given, or
    derived from its hardware as `plan` derives it), else with `req.hot_frac` of all experts hot
    (equal sizes)."""
    ref, mine = load_hist(req.ref_path), load_hist(req.mine_path)
    if recipe is not None:
        for path, hist in ((req.ref_path, ref), (req.mine_path, mine)):
            for warning in check_hist_matches_recipe(hist, recipe, path):
                warn(warning)
    result = rerank(ref, mine, *parse_strength(req.strength))
    h, hot_frac = result.hist, req.hot_frac
    if recipe is not None and knobs is not None:
        hot = resolve_hot_budget(recipe, knobs)
        size, budget = expert_bytes_per_rank(recipe, uniform_precision(knobs)), hot.budget_bytes
        how = " auto" if hot.source == "auto" else ""
        budget_desc = f"{gib(budget)} per rank ({recipe.name}{how}, expert {gib(size)})"
    else:
        size = 1
        budget = max(1, int(hot_frac * h.num_layers * h.num_experts))
        budget_desc = f"{budget} of {h.num_layers * h.num_experts} experts hot ({100 * hot_frac:g}%, equal sizes)"
    change = hot_change(ref.counts_LE, h.counts_LE, size, budget)
    return RerankReport(req.ref_path, req.mine_path, result, change, budget_desc)
