"""A split hospital's modified software that attacks one relation of the validity statement at a time."""

from __future__ import annotations


def keeping_honest_bits(honest_lanes, blocks):
    """``aux_override`` for :meth:`Circuit.prove`: the decomposition of what the cheater sends, but the bits
    of ``blocks`` taken from the honest lanes' (same Fiat-Shamir seed), so that every relation it does not
    attack holds and the one it does is what the verifiers must catch."""
    def aux(circuit, x, fs):
        bits = circuit.aux_bits(x, fs)
        good = circuit.aux_bits(honest_lanes, fs)
        for name in blocks:
            off, cnt, width = circuit.offsets[name]
            bits[off:off + cnt * width] = good[off:off + cnt * width]
        return bits
    return aux
