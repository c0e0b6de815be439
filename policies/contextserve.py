"""ContextServe (issue 18 item 4): Continuum with a three-way pin decision by tool command.

After a call, its next tool's command decides:
  FAST       a known-fast command (ls, cat, git status, ...): pin for a fixed TTL;
  SLOW       a known-slow prefix (pytest, pip install, make, docker build, ...): free at once;
  UNCERTAIN  anything else: pin for a quantile of the tool's predictive duration, from a
             Normal-Inverse-Gamma posterior over log duration per tool name; while the
             tool has fewer than `min_samples` observations (or no tool was parsed),
             Continuum's own TTL (Eq. 2 and its cold start).
Waiting order, expiry, T, eta and the no-deadlock rule are Continuum's (the base class).

Matching: a tool that is one word (a name, as the bundled traces and the tool parser
give: `git`) matches a rule whose first word it is (`git` matches `git status`); a name
whose rules fall in both lists is UNCERTAIN. A command line (several words) matches the
longest rule that is a word prefix of it (`git status -s` is FAST, `git commit` matches
nothing). Durations are learned per name (first word), so `git commit` learns from every
`git` call.

Where the defaults come from: the example commands of issue 18 (ls, cat, pwd, git status;
pytest, pip install, make, docker build) and the Continuum fork analysis
(reference/vllm-continuum-implementation-analysis.md §9: ls ~0.1 s, pytest ~15 s, pip
install ~30 s), extended with commands of the same kind (ours). The fixed TTL is the fork's
2 s pin (FIXED_THRESHOLD_CONTINUUM, policies/static.py). The reference holds no
ContextServe code, so the prior, the quantile and the sample threshold are ours (below).
"""
from __future__ import annotations

import math

from policies.base import FREE, Action, EngineView, PolicyError, Request, Retention
from policies.continuum import ContinuumPolicy

FAST, SLOW, UNCERTAIN = "fast", "slow", "uncertain"
MIN_SECONDS = 1e-3  # ours: log needs t > 0; a tool time of 0 (clamped) counts as 1 ms


def parse_rules(rules: str | tuple | list, what: str) -> tuple[tuple[str, ...], ...]:
    """'ls,git status' -> (('ls',), ('git', 'status')); '' -> no rule; an empty entry is refused."""
    if isinstance(rules, str) and not rules.strip():
        return ()
    items = rules.split(",") if isinstance(rules, str) else list(rules)
    out = tuple(tuple(str(r).split()) for r in items)
    if any(not r for r in out):
        raise PolicyError(f"{what} has an empty command in {rules!r}; "
                          "give comma-separated commands like 'ls,git status'")
    return out


class NIG:
    """Normal-Inverse-Gamma posterior over x = log(duration): x ~ N(mu, s2), s2 ~
    InvGamma(alpha, beta), mu | s2 ~ N(mu0, s2 / kappa). Conjugate, so the posterior after
    n samples (mean m, sum of squared deviations S, kept by Welford's update) is closed form:
      kappa_n = kappa0 + n,  mu_n = (kappa0 mu0 + n m) / kappa_n,  alpha_n = alpha0 + n/2,
      beta_n = beta0 + S/2 + kappa0 n (m - mu0)^2 / (2 kappa_n);
    the predictive of the next x is Student-t with 2 alpha_n degrees of freedom, location
    mu_n, scale^2 = beta_n (kappa_n + 1) / (alpha_n kappa_n)."""

    __slots__ = ("n", "mean", "m2")

    def __init__(self) -> None:
        self.n, self.mean, self.m2 = 0, 0.0, 0.0

    def add(self, x: float) -> None:
        self.n += 1
        d = x - self.mean
        self.mean += d / self.n
        self.m2 += d * (x - self.mean)

    def posterior(self, mu0: float, kappa0: float, alpha0: float, beta0: float) -> tuple[float, float, float, float]:
        n = self.n
        kn = kappa0 + n
        mun = (kappa0 * mu0 + n * self.mean) / kn
        bn = beta0 + 0.5 * self.m2 + kappa0 * n * (self.mean - mu0) ** 2 / (2.0 * kn)
        return mun, kn, alpha0 + 0.5 * n, bn

    def quantile(self, q: float, mu0: float, kappa0: float, alpha0: float, beta0: float) -> float:
        """q-quantile of the predictive duration, seconds: exp of the Student-t quantile."""
        from scipy.special import stdtrit  # lazy: only an UNCERTAIN tool past min_samples needs it

        mun, kn, an, bn = self.posterior(mu0, kappa0, alpha0, beta0)
        scale = math.sqrt(bn * (kn + 1.0) / (an * kn))
        return math.exp(mun + scale * float(stdtrit(2.0 * an, q)))


class ContextServePolicy(ContinuumPolicy):
    name = "contextserve"

    def __init__(
        self,
        fast: str = "ls,cat,pwd,head,tail,echo,wc,which,git status,git diff,git log,git show",
        slow: str = "pytest,pip install,pip3 install,make,docker build,npm install,cargo build,cargo test,tox",
        fast_ttl: float = 2.0,  # the fork's fixed 2 s pin (policies/static.py)
        quantile: float = 0.9,  # ours: the pin covers 9 of 10 predicted returns
        min_samples: int = 5,  # ours: below it Continuum's TTL (the t predictive is wide at n < 5)
        # ours, weak prior: median 1 s (Continuum's cold start assumes 1 s tools, §4.2),
        # worth one observation (kappa0), alpha0 = beta0 = 1 (prior variance of log t ~ 1)
        prior_median_s: float = 1.0,
        prior_kappa: float = 1.0,
        prior_alpha: float = 1.0,
        prior_beta: float = 1.0,
        # ours, as the oracle's rule: pin for the quantile only if T*eta + PrefillReload(r)
        # exceeds it (a longer pin cannot pay off under Eq. 2: P*B - tau < 0 for tau > B)
        cost_check: bool = True,
        K: int = 100,  # Continuum's parameters, same defaults (the UNCERTAIN fallback, T, eta)
        T_window: int = 100,
        cold_tool_mean: float = 1.0,
        eta_min_programs: int = 2,
        unpin_while_running: bool = False,
    ) -> None:
        super().__init__(K=K, T_window=T_window, cold_tool_mean=cold_tool_mean,
                         eta_min_programs=eta_min_programs, unpin_while_running=unpin_while_running)
        self.fast_rules, self.slow_rules = parse_rules(fast, "fast"), parse_rules(slow, "slow")
        both = set(self.fast_rules) & set(self.slow_rules)
        if both:
            raise PolicyError(f"{' '.join(min(both))!r} is in both the fast and the slow list; keep it in one")
        self.fast_ttl, self.quantile, self.min_samples = float(fast_ttl), float(quantile), int(min_samples)
        self.prior = (math.log(float(prior_median_s)), float(prior_kappa), float(prior_alpha), float(prior_beta))
        self.cost_check = bool(cost_check)
        self.nig: dict[str, NIG] = {}  # per tool name
        self._ttl_cache: dict[str, float] = {}  # name -> quantile TTL, dropped when the name learns
        self._classes: dict[str, str] = {}  # tool string -> FAST | SLOW | UNCERTAIN

    # --- the three-way rule -----------------------------------------------------------
    def classify(self, tool: str | None) -> str:
        if tool is None:
            return UNCERTAIN
        c = self._classes.get(tool)
        if c is None:
            c = self._classes[tool] = self._match(tool.split())
        return c

    def _match(self, words: list[str]) -> str:
        if not words:
            return UNCERTAIN
        if len(words) == 1:  # a name: every rule whose first word it is
            w = words[0]
            found = {FAST for r in self.fast_rules if r[0] == w} | {SLOW for r in self.slow_rules if r[0] == w}
            return found.pop() if len(found) == 1 else UNCERTAIN
        best, cls = 0, UNCERTAIN  # a command line: the longest word prefix
        for rules, c in ((self.fast_rules, FAST), (self.slow_rules, SLOW)):
            for r in rules:
                if len(r) > best and tuple(words[: len(r)]) == r:
                    best, cls = len(r), c
        return cls

    @staticmethod
    def tool_name(tool: str) -> str:
        return tool.split(maxsplit=1)[0] if tool.strip() else tool

    # --- learning ---------------------------------------------------------------------
    def record_tool_time(self, tool: str | None, seconds: float) -> None:
        super().record_tool_time(tool, seconds)  # Continuum's samples: the fallback's CDFs
        if tool is None:
            return
        name = self.tool_name(tool)
        est = self.nig.get(name)
        if est is None:
            est = self.nig[name] = NIG()
        est.add(math.log(max(MIN_SECONDS, float(seconds))))
        self._ttl_cache.pop(name, None)

    def nig_ttl(self, tool: str) -> float | None:
        """The quantile TTL of an UNCERTAIN tool, None below min_samples."""
        name = self.tool_name(tool)
        ttl = self._ttl_cache.get(name)
        if ttl is None:
            est = self.nig.get(name)
            if est is None or est.n < self.min_samples:
                return None
            ttl = self._ttl_cache[name] = est.quantile(self.quantile, *self.prior)
        return ttl

    # --- decision ---------------------------------------------------------------------
    def retention(self, req: Request, now: float, view: EngineView) -> Retention:
        c = self.classify(req.tool)
        if c == FAST:
            self.ttl_source["fast"] += 1
            return Retention(Action.PIN, self.fast_ttl) if self.fast_ttl > 0.0 else FREE
        if c == SLOW:
            self.ttl_source["slow"] += 1
            return FREE
        ttl = None if req.tool is None else self.nig_ttl(req.tool)
        if ttl is None:  # too few samples (or no tool): Continuum's TTL
            return super().retention(req, now, view)
        self.ttl_source["nig"] += 1
        if self.cost_check and ttl >= self.benefit(req, view):
            return FREE
        return Retention(Action.PIN, ttl)
