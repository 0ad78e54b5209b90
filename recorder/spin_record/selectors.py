"""Block selectors for the DSA emulation: a small interface and the Python baselines.

Interface (one selector object per decoded sequence, state per layer):
    select(layer, ctx_len) -> sorted int array of logical block ids to score this step
    observe(layer, scores, topk)   scores: float32 [ctx_len], -inf where not scored;
                                   topk: int array of the entry positions top-k kept
    commit()                       end of a decode step (all layers done)
`needs_truth = True` selectors (oracle) get `peek(layer, full_scores)` before `select`.

Budget and forced blocks: B = budget_blocks(...) below, the C++ predictors' budget; forced = the
first `sink_blocks` blocks and the newest `local_blocks` (the newest holds never-scored entries).

SPIN itself is not reimplemented here: `SpinDsaSelector` is the adapter point for the C++
predictors through the `spin_dsa` Python bindings; see recorder/README.md.
"""

import math

import numpy as np


def budget_blocks(sparsity, n_blocks, topk, block, sink_blocks, local_blocks):
    """Blocks scored for a row that sees n_blocks blocks: ceil((1 - sparsity) * n_blocks), never
    below what top-k needs (ceil(topk / block)) nor below the forced blocks, at most n_blocks.

    The library's rule (spin_dsa.budget_blocks) restated: this virtualenv has no C++ build, and
    the baselines must get the budget the C++ predictors get beside them in the quality report.
    python/tests/test_recorder_budget.py checks the two agree."""
    if n_blocks <= 0:
        return 0
    share = math.ceil((1.0 - sparsity) * n_blocks - 1e-9)  # (1 - 0.3) * 10 = 7.000000000000001 is 7
    forced = min(n_blocks, sink_blocks + local_blocks)
    return min(n_blocks, max(share, -(-topk // block), forced))


class _Base:
    needs_truth = False

    def __init__(self, sparsity, topk, block=64, sink_blocks=1, local_blocks=1, seed=0):
        self.sparsity, self.topk, self.block = sparsity, topk, block
        self.sink, self.local, self.seed = sink_blocks, local_blocks, seed
        self.step = 0

    def _frame(self, ctx_len):
        nb = -(-ctx_len // self.block)
        forced = sorted(set(range(min(self.sink, nb))) | set(range(max(0, nb - self.local), nb)))
        B = budget_blocks(self.sparsity, nb, self.topk, self.block, self.sink, self.local)
        return nb, forced, B

    def _fill(self, nb, forced, B, ranked):
        """forced first, then `ranked` (best first) until B, then recency."""
        chosen = list(forced)
        seen = set(chosen)
        for b in list(ranked) + list(range(nb - 1, -1, -1)):
            if len(chosen) >= B:
                break
            b = int(b)
            if 0 <= b < nb and b not in seen:
                seen.add(b)
                chosen.append(b)
        return np.array(sorted(chosen), np.int64)

    def observe(self, layer, scores, topk):
        pass

    def commit(self):
        self.step += 1


class Dense(_Base):
    """Every block scored (dense top-k: DSA without skipping)."""

    def select(self, layer, ctx_len):
        return np.arange(-(-ctx_len // self.block), dtype=np.int64)


class Oracle(_Base):
    """Blocks ranked by how many of this step's true top-k entries they hold (the best recall a
    selection of that budget can reach); reads the all-keep scores, which no real system has."""

    needs_truth = True

    def peek(self, layer, full_scores):
        self._truth = full_scores

    def select(self, layer, ctx_len):
        nb, forced, B = self._frame(ctx_len)
        s = self._truth[:ctx_len]
        k = min(self.topk, ctx_len)
        top = np.argpartition(-s, k - 1)[:k]
        hits = np.bincount(top // self.block, minlength=nb)
        order = np.lexsort((np.arange(nb), -hits))  # most hits first, lower block on ties
        return self._fill(nb, forced, B, [b for b in order if hits[b] > 0])


class PrevIter(_Base):
    """Blocks holding the previous step's top-k (most hits first), plus sink and newest, filled
    to budget by recency."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.prev = {}

    def observe(self, layer, scores, topk):
        self.prev[layer] = np.asarray(topk)

    def select(self, layer, ctx_len):
        nb, forced, B = self._frame(ctx_len)
        top = self.prev.get(layer)
        if top is None:
            return np.arange(nb, dtype=np.int64)  # nothing observed yet: score everything
        hits = np.bincount(top // self.block, minlength=nb)[:nb]
        order = np.lexsort((-np.arange(nb), -hits))  # most hits, then newer
        return self._fill(nb, forced, B, [b for b in order if hits[b] > 0])


class Random(_Base):
    """Sink and newest, the rest drawn uniformly; keyed on (seed, layer, step), deterministic."""

    def select(self, layer, ctx_len):
        nb, forced, B = self._frame(ctx_len)
        rng = np.random.default_rng([self.seed, layer, self.step])
        return self._fill(nb, forced, B, rng.permutation(nb))


class SpinDsaSelector(_Base):
    """The C++ predictors (spin, step-reuse, hisa, ...) through the `spin_dsa` bindings
    (python/: `make_predictor(name, config, num_layers, request_id)`,
    `select(layer, step, num_entries, k=, k_scale=, q=, w=)`, `observe(layer, row, scores, topk,
    scored_blocks)`, `commit(accepted)`). SPIN is not reimplemented in Python: without the
    bindings this raises ImportError with one line. Forced blocks are aligned with the Python
    baselines (1 sink, 1 newest); every other field keeps the library's default unless
    `overrides` (PredictorConfig fields, e.g. {"explore_ratio": 0}) says otherwise.

    Predictors that read keys (predictor_info()['reads'] == 'keys': hisa, spin-hybrid) set
    `needs_keys`: the decode hands them the layer's indexer keys and the step's query through
    `keys(layer, k, k_scale, q, w)` before each select (only the indexer signal has them)."""

    def __init__(self, name, sparsity, topk, block=64, num_layers=30, seed=0, request_id=0,
                 overrides=None):
        super().__init__(sparsity, topk, block, seed=seed)
        try:
            import spin_dsa
        except ImportError as e:
            raise ImportError(f"predictor {name!r} needs the spin_dsa bindings "
                              f"(pip install . from a checkout with python/), not installed: {e}") from None
        cfg = dict(target_sparsity=float(sparsity), topk=int(topk), page_size=int(block),
                   sink_blocks=1, local_blocks=1, seed=int(seed))
        cfg.update(overrides or {})
        self.p = spin_dsa.make_predictor(name, cfg, num_layers=num_layers, request_id=request_id)
        reads = {i["name"]: i["reads"] for i in spin_dsa.predictor_info()}
        self.needs_keys = reads.get(name) == "keys"
        self.selected = set()
        self._keys = None

    def keys(self, layer, k, k_scale, q, w):
        self._keys = (layer, dict(k=k, k_scale=k_scale, q=q, w=w))

    def _take_keys(self, layer):
        """The select's keyword arguments: the keys handed over for this layer (once)."""
        if not self.needs_keys:
            return {}
        if self._keys is None or self._keys[0] != layer:
            raise ValueError(f"{self.p.name} reads the indexer's keys: decode with the indexer "
                             "signal (quality --signal indexer)")
        kw, self._keys = self._keys[1], None
        return kw

    def select(self, layer, ctx_len):
        self.selected.add(layer)
        kw = self._take_keys(layer)
        return np.asarray(self.p.select(layer, self.step, int(ctx_len), **kw), np.int64)

    def observe(self, layer, scores, topk):
        sc = np.ascontiguousarray(scores, np.float32)
        tk = np.full(self.topk, -1, np.int32)  # the bindings take exactly topk, -1 padded
        t = np.asarray(topk, np.int32).ravel()[:self.topk]
        tk[:len(t)] = t
        if layer in self.selected:
            self.p.observe(layer, 0, sc, topk=tk)
        else:  # warm start (the prefill's last row): everything was scored
            # the bindings observe after a select; hisa's select also pools the prefix's keys
            self.p.select(layer, self.step, len(sc), **self._take_keys(layer))
            nb = -(-len(sc) // self.block)
            self.p.observe(layer, 0, sc, topk=tk, scored_blocks=np.arange(nb, dtype=np.int32))

    def commit(self):
        self.p.commit(0)
        self.selected.clear()
        self.step += 1


# Named variants of the C++ predictors: spec -> (predictor, PredictorConfig overrides).
VARIANTS = {"spin-noexplore": ("spin", {"explore_ratio": 0})}


def parse_spec(spec):
    """'spin', 'spin-noexplore' (VARIANTS) or 'name:field=value,field=value' -> (name, overrides)."""
    if spec in VARIANTS:
        return VARIANTS[spec]
    name, _, rest = spec.partition(":")
    over = {}
    for kv in filter(None, rest.split(",")):
        k, eq, v = kv.partition("=")
        if not eq or not k or not v:
            raise ValueError(f"predictor spec {spec!r}: expected name:field=value,... ")
        over[k] = v
    return name, over


PYTHON_SELECTORS = {"dense": Dense, "oracle": Oracle, "prev-iter": PrevIter, "random": Random}


def make_selector(spec, sparsity, topk, block=64, seed=0, num_layers=30, request_id=0):
    """A Python baseline by name, else a C++ predictor (spec: see parse_spec)."""
    if spec in PYTHON_SELECTORS:
        return PYTHON_SELECTORS[spec](sparsity, topk, block, seed=seed)
    name, over = parse_spec(spec)
    return SpinDsaSelector(name, sparsity, topk, block, num_layers=num_layers, seed=seed,
                           request_id=request_id, overrides=over)
