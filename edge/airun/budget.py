"""Hard budgets, checked before every request (not after): rounds, input and output tokens,
estimated cost, wall clock. A request is sent only if its input tokens plus
`max_output_tokens` fit what is left of every budget.

Token counts come from the server's `usage`; without it they are estimated conservatively
(one token per two bytes of UTF-8, well above what tokenizers produce for English, code
or CJK text), the round says `usageEstimated`, and the cost is reported as unknown.

An estimate never trusts itself over the provider: a request's input is at least what the
provider counted for the previous request of the same conversation plus the estimate of
what was added since. So a provider that counts more than the estimate (a tokenizer that
is not the usual, or one that over-reports) can push a run past a budget by at most its
first request.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from edge.core.agent import BudgetName, Limits, ProviderSettings

BYTES_PER_TOKEN = 2
COST_EPSILON_USD = 1e-9  # binary floating point must not turn an exact fit into a refusal
RESERVE_S = 2.0  # kept back from the wall clock to report the outcome before the runner's kill


def estimate_tokens(n_bytes: int) -> int:
    return -(-n_bytes // BYTES_PER_TOKEN)


class Budget:
    def __init__(self, limits: Limits, provider: ProviderSettings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.max_output = provider.max_output_tokens
        prices = (provider.input_usd_per_mtok, provider.output_usd_per_mtok)
        self.prices: tuple[float, float] | None = None if None in prices else prices  # type: ignore[assignment]
        self._clock = clock
        self.deadline = clock() + limits.wall_clock_s - RESERVE_S
        self.rounds = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.cost_usd = 0.0  # with estimated usage too: what enforcement counts
        self.usage_estimated = False
        self._counted: dict[str, tuple[int, int]] = {}  # conversation -> (request bytes, input tokens counted)

    def estimate(self, conversation: str, n_bytes: int) -> int:
        """The input tokens a request of `n_bytes` is counted as, before it is sent."""
        tokens = estimate_tokens(n_bytes)
        counted = self._counted.get(conversation)
        if counted is not None:
            tokens = max(tokens, counted[1] + estimate_tokens(max(0, n_bytes - counted[0])))
        return tokens

    def counted(self, conversation: str, n_bytes: int, input_tokens: int | None) -> None:
        """What the provider counted for a request of `n_bytes` (None: it did not say)."""
        if input_tokens is not None:
            self._counted[conversation] = (n_bytes, input_tokens)

    def remaining_s(self) -> float:
        return self.deadline - self._clock()

    def _cost(self, input_tokens: int, output_tokens: int) -> float:
        assert self.prices is not None
        return (input_tokens * self.prices[0] + output_tokens * self.prices[1]) / 1e6

    def refuse(self, round_number: int, request_tokens: int, max_output: int | None = None
               ) -> tuple[BudgetName, str] | None:
        """The first budget the request would not fit, with why; None: it may be sent.
        `max_output`: what the request reserves for its reply (a specialist's own), else
        the provider's max_output_tokens."""
        limits = self.limits
        reserve = self.max_output if max_output is None else max_output
        if round_number > limits.rounds:
            return "rounds", f"{limits.rounds} rounds used"
        if self.input_tokens + request_tokens > limits.input_tokens:
            return "input_tokens", (f"{self.input_tokens:,} input tokens used + {request_tokens:,} for the next request"
                                    f" > {limits.input_tokens:,}")
        if self.output_tokens + reserve > limits.output_tokens:
            return "output_tokens", (f"{self.output_tokens:,} output tokens used + up to {reserve:,} for the"
                                     f" next reply > {limits.output_tokens:,}")
        if self.prices is not None:
            need = self._cost(request_tokens, reserve)
            if self.cost_usd + need > limits.cost_usd + COST_EPSILON_USD:
                return "cost_usd", (f"${self.cost_usd:.4f} spent + up to ${need:.4f} for the next request"
                                    f" > ${limits.cost_usd:g}")
        if self.remaining_s() <= 0:
            return "wall_clock", f"{limits.wall_clock_s}s wall clock used"
        return None

    def charge(self, input_tokens: int, output_tokens: int, estimated: bool) -> float | None:
        """Count one round; returns its cost, None when unknown (no prices, or estimated usage)."""
        self.rounds += 1
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.usage_estimated = self.usage_estimated or estimated
        if self.prices is None:
            return None
        cost = self._cost(input_tokens, output_tokens)
        self.cost_usd += cost
        return None if estimated else cost
