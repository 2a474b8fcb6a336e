"""Speculative-decoding counters and the dict `Generator.get_speculative_stats` returns, with
the reference's keys (those of features genai does not run, e.g. its block drafters, stay 0).

A *round* proposes K tokens and verifies them in one target run; it queues the accepted ones
plus one token of the target's own (a *correction* where a proposal was rejected, a *bonus*
after all were accepted), which the generator then emits one per `generate_next_token` call.
A round is *completed* when its queue is emptied by emitting, *interrupted* when a rewind,
append or `set_logits` discards what is left (``tokens_discarded``), *active* meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["SpeculativeCounters"]


@dataclass
class SpeculativeCounters:
    """What the speculative rounds did so far (see the module docstring)."""

    rounds: int = 0
    #: rounds the speed-up estimate covers (not guided ones, as the reference)
    formula_rounds: int = 0
    completed_rounds: int = 0
    interrupted_rounds: int = 0
    draft_tokens_proposed: int = 0
    draft_tokens_evaluated: int = 0
    draft_tokens_accepted: int = 0
    correction_tokens: int = 0
    bonus_tokens: int = 0
    tokens_queued: int = 0
    tokens_emitted: int = 0
    tokens_discarded: int = 0
    draft_forward_passes: int = 0
    target_verify_forward_passes: int = 0
    target_reanchor_forward_passes: int = 0
    standard_fallback_steps: int = 0
    full_accept_rounds: int = 0
    partial_accept_rounds: int = 0
    zero_accept_rounds: int = 0
    ngram_lookup_hits: int = 0
    ngram_lookup_misses: int = 0
    ngram_lookup_tokens_proposed: int = 0
    ngram_chained_tokens_proposed: int = 0
    ngram_grammar_candidate_rejections: int = 0
    ngram_history_syncs: int = 0
    ngram_history_tokens_synced: int = 0
    total_draft_ms: float = 0.0
    total_target_verify_ms: float = 0.0
    #: the one-token runs of a round's last token (``target_reanchor_forward_passes``)
    total_target_reanchor_ms: float = 0.0
    total_ngram_history_sync_ms: float = 0.0
    total_ngram_lookup_ms: float = 0.0
    #: formula rounds by their K (for the expected tokens per round)
    k_counts: dict[int, int] = field(default_factory=dict)

    def as_reference_dict(
        self,
        *,
        buffered: int = 0,
        effective_k: int = 0,
        adaptive: Any = None,
        cooldown: Any = None,
        backoff: Any = None,
    ) -> dict[str, Any]:
        """The reference's stats dict, plus genai's ``backoff_entries`` / ``backoff_steps``
        where ``backoff`` is enabled (adaptive K);
        ``buffered``: tokens queued and not emitted yet; ``adaptive`` / ``cooldown`` /
        ``backoff``: the `AdaptiveK` / `Cooldown` / `Backoff` policies, if any.

        As the reference: ``total_target_ms`` is the verify and re-anchor runs' time,
        ``target_baseline_ms_per_token`` a re-anchor run's (one token), and the speed-up
        estimates divide tokens per round by a round's cost in baseline runs."""
        active = 1 if buffered else 0
        evaluated = self.draft_tokens_evaluated
        acceptance = self.draft_tokens_accepted / evaluated if evaluated else 0.0
        completed = self.completed_rounds
        expected = 0.0
        formula = self.rounds > 0 and self.formula_rounds == self.rounds
        if formula and evaluated:
            total = 0.0
            for k, count in self.k_counts.items():
                per_round = (
                    k + 1.0
                    if acceptance >= 1.0
                    else (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)
                )
                total += per_round * count
            expected = total / self.formula_rounds
        verify_ms, reanchor_ms = self.total_target_verify_ms, self.total_target_reanchor_ms
        target_ms = verify_ms + reanchor_ms
        reanchors = self.target_reanchor_forward_passes
        baseline = reanchor_ms / reanchors if reanchors else 0.0
        per_round = target_ms / self.rounds if self.rounds else 0.0
        draft_per_token = (
            self.total_draft_ms / self.draft_tokens_proposed if self.draft_tokens_proposed else 0.0
        )
        draft_per_round = self.draft_tokens_proposed / self.rounds if self.rounds else 0.0
        emitted_per_round = self.tokens_emitted / self.rounds if self.rounds else 0.0
        overhead = estimated = observed = 0.0
        if formula and baseline > 0:
            overhead = per_round / baseline - 1.0
            denominator = 1.0 + draft_per_round * (draft_per_token / baseline) + overhead
            if denominator > 0:
                estimated, observed = expected / denominator, emitted_per_round / denominator
        stats = {
            "rounds": self.rounds,
            "completed_rounds": completed,
            "interrupted_rounds": self.interrupted_rounds,
            "active_rounds": active,
            "draft_tokens_proposed": self.draft_tokens_proposed,
            "draft_tokens_evaluated": evaluated,
            "draft_tokens_accepted": self.draft_tokens_accepted,
            "correction_tokens": self.correction_tokens,
            "bonus_tokens": self.bonus_tokens,
            "tokens_queued": self.tokens_queued,
            "tokens_emitted": self.tokens_emitted,
            "tokens_discarded": self.tokens_discarded,
            "tokens_buffered": buffered,
            "draft_forward_passes": self.draft_forward_passes,
            "target_forward_passes": (
                self.target_verify_forward_passes + self.target_reanchor_forward_passes
            ),
            "effective_k": effective_k,
            "adaptive_k_increases": adaptive.increases if adaptive else 0,
            "adaptive_k_decreases": adaptive.decreases if adaptive else 0,
            "adaptive_k_observations": adaptive.observations if adaptive else 0,
            "adaptive_k_probes": adaptive.probes if adaptive else 0,
            "cooldown_entries": cooldown.entries if cooldown else 0,
            "cooldown_steps": cooldown.steps if cooldown else 0,
            "cooldown_remaining": cooldown.remaining if cooldown else 0,
            "standard_fallback_steps": self.standard_fallback_steps,
            "mtp_failures": 0,
            "dflash2_failures": 0,
            "dflash2_disables": 0,
            "dflash2_admission_misses": 0,
            "full_accept_rounds": self.full_accept_rounds,
            "partial_accept_rounds": self.partial_accept_rounds,
            "zero_accept_rounds": self.zero_accept_rounds,
            "target_verify_forward_passes": self.target_verify_forward_passes,
            "target_reanchor_forward_passes": self.target_reanchor_forward_passes,
            "target_reconciliation_forward_passes": 0,
            "ngram_lookup_hits": self.ngram_lookup_hits,
            "ngram_lookup_misses": self.ngram_lookup_misses,
            "ngram_lookup_tokens_proposed": self.ngram_lookup_tokens_proposed,
            "ngram_chained_tokens_proposed": self.ngram_chained_tokens_proposed,
            "ngram_grammar_candidate_rejections": self.ngram_grammar_candidate_rejections,
            "ngram_history_syncs": self.ngram_history_syncs,
            "ngram_history_tokens_synced": self.ngram_history_tokens_synced,
            "formula_supported": formula,
            "total_draft_ms": self.total_draft_ms,
            "total_target_ms": target_ms,
            "total_reconciliation_ms": 0.0,
            "total_target_verify_ms": verify_ms,
            "total_target_reanchor_ms": reanchor_ms,
            "total_ngram_history_sync_ms": self.total_ngram_history_sync_ms,
            "total_ngram_lookup_ms": self.total_ngram_lookup_ms,
            "avg_draft_ms_per_token": draft_per_token,
            "acceptance_rate": acceptance,
            "avg_draft_tokens_per_round": draft_per_round,
            "mean_emitted_tokens_per_round": emitted_per_round,
            "expected_tokens_per_round": expected,
            "avg_target_ms_per_round": per_round,
            "target_baseline_ms_per_token": baseline,
            "target_overhead_ratio": overhead,
            "estimated_speedup": estimated,
            "observed_speedup": observed,
            "adaptive_k_throughput": adaptive.throughput if adaptive else 0.0,
            "acceptance_length_histogram": [0] * 8,
        }
        if backoff is not None and backoff.enabled:  # genai's keys, where it backs off
            stats["backoff_entries"] = backoff.entries
            stats["backoff_steps"] = backoff.steps
        return stats
