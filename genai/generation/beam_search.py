"""Beam search (HF-style scorer), as onnxruntime-genai runs it on the CPU.

Per step, for each batch entry with ``num_beams`` beams: log-softmax of every beam's logits,
plus the beam's running score; the best ``2 * num_beams`` (beam, token) candidates over all its
beams, in score order (ties: the lower flat index); walking them in order, a candidate whose
token is an EOS id becomes a finished hypothesis (only if it ranks among the first
``num_beams``; its tokens exclude the EOS) scored ``sum_logprobs / length ** length_penalty``
(length = the sequence length, prompt included), any other candidate continues as a beam,
until ``num_beams`` beams are chosen. A batch entry is done once it holds ``num_beams``
hypotheses (``early_stopping``) or, without early stopping, once no running beam can beat the
worst of them. At the end (`finalize`) every open beam becomes a hypothesis too, and the
hypotheses are returned best first. Arithmetic is float32, as the reference's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["BeamScorer"]

_F32 = np.float32


@dataclass
class _Hypotheses:
    """The best ``capacity`` finished hypotheses of one batch entry, best first."""

    capacity: int
    length_penalty: float
    scores: list[float] = field(default_factory=list)
    tokens: list[np.ndarray] = field(default_factory=list)
    done: bool = False

    def add(self, tokens: np.ndarray, sum_logprobs: float) -> None:
        score = float(_F32(sum_logprobs) / _F32(len(tokens)) ** _F32(self.length_penalty))
        if len(self.scores) == self.capacity:
            if score <= self.scores[-1]:
                return
            self.scores.pop()
            self.tokens.pop()
        index = len(self.scores)
        while index > 0 and score > self.scores[index - 1]:
            index -= 1
        self.scores.insert(index, score)
        self.tokens.insert(index, tokens.copy())

    def can_improve(self, best_sum_logprobs: float, length: int) -> bool:
        current = _F32(best_sum_logprobs) / _F32(length) ** _F32(self.length_penalty)
        return bool(self.scores[-1] < current)


class BeamScorer:
    """Chooses the next beams of every batch entry and keeps the finished hypotheses."""

    def __init__(
        self,
        batch_size: int,
        num_beams: int,
        vocab_size: int,
        eos_ids: np.ndarray,
        pad_id: int,
        length_penalty: float,
        early_stopping: bool,
    ) -> None:
        self.batch_size, self.num_beams, self.vocab = batch_size, num_beams, vocab_size
        self.eos_ids = {int(e) for e in eos_ids}
        self.pad_id = pad_id
        self.early_stopping = early_stopping
        self.length_penalty = length_penalty
        self.reset()

    def reset(self) -> None:
        """Start a new search (a new prompt after ``rewind_to(0)``): no hypotheses, the
        first step's scores."""
        batch_size, num_beams = self.batch_size, self.num_beams
        self.hypotheses = [_Hypotheses(num_beams, self.length_penalty) for _ in range(batch_size)]
        # The first beam of each entry starts at 0, the others at -1e9: the first step then
        # expands one beam instead of num_beams identical ones.
        self.beam_scores = np.zeros(batch_size * num_beams, _F32)
        self.beam_scores.reshape(batch_size, num_beams)[:, 1:] = _F32(-1e9)
        self.next_tokens = np.zeros(batch_size * num_beams, np.int32)
        self.next_indices = np.arange(batch_size * num_beams, dtype=np.int32)
        self.finalized = False

    @property
    def all_done(self) -> bool:
        """Every batch entry is done."""
        return all(h.done for h in self.hypotheses)

    def step(self, logits: np.ndarray, sequences: np.ndarray, length: int) -> None:
        """One step from processed ``logits`` [batch*beams, vocab] (float32; overwritten with
        the scores) and the current ``sequences`` [batch*beams, >= length]. Sets
        `next_tokens`, `next_indices` (the source row of each new beam) and `beam_scores`."""
        beams, vocab = self.num_beams, self.vocab
        scores = _log_softmax(logits)
        scores += self.beam_scores[:, None]
        top = 2 * beams
        flat = scores.reshape(self.batch_size, beams * vocab)
        table: np.ndarray | None = None  # [batch * 2*beams] best candidate scores, lazily
        for batch, hyp in enumerate(self.hypotheses):
            base = batch * beams
            if hyp.done:
                self.beam_scores[base : base + beams] = 0.0
                self.next_tokens[base : base + beams] = self.pad_id
                self.next_indices[base : base + beams] = base  # the reference uses 0 here
                continue
            row = flat[batch]
            candidates = np.argpartition(-row, top - 1)[:top]
            # rank order: score descending, ties -> lower flat index
            candidates = candidates[np.lexsort((candidates, -row[candidates]))]
            chosen = 0
            for rank, flat_index in enumerate(candidates):
                token = int(flat_index % vocab)
                source = base + int(flat_index // vocab)
                score = row[flat_index]
                if token in self.eos_ids:
                    if rank >= beams:
                        continue
                    hyp.add(sequences[source, :length], score)
                else:
                    self.beam_scores[base + chosen] = score
                    self.next_tokens[base + chosen] = token
                    self.next_indices[base + chosen] = source
                    chosen += 1
                if chosen == beams:
                    break
            if len(hyp.scores) < beams:
                continue
            if not self.early_stopping:
                # As the reference: the best of the 2*beams candidates' scores, read at an
                # offset of batch*beams into the [batch, 2*beams] candidate table.
                if table is None:
                    table = -np.sort(np.partition(-flat, top - 1, axis=1)[:, :top], axis=1)
                    table = table.reshape(-1)
                best = float(table[batch * beams : batch * beams + top].max())
                if hyp.can_improve(best, length):
                    continue
            hyp.done = True

    def finalize(self, sequences: np.ndarray, length: int) -> None:
        """Turn every open beam into a hypothesis (once)."""
        if self.finalized:
            return
        for batch, hyp in enumerate(self.hypotheses):
            if hyp.done:
                continue
            for beam in range(self.num_beams):
                row = batch * self.num_beams + beam
                hyp.add(sequences[row, :length], self.beam_scores[row])
        self.finalized = True

    def hypothesis(self, batch: int, rank: int) -> np.ndarray:
        """The ``rank``-th best hypothesis of batch entry ``batch``."""
        return self.hypotheses[batch].tokens[rank].copy()


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float32, in place."""
    maxima = logits.max(axis=1, keepdims=True)
    logits -= maxima
    sums = np.exp(logits).sum(axis=1, keepdims=True, dtype=_F32)
    logits -= np.log(sums)
    return logits
