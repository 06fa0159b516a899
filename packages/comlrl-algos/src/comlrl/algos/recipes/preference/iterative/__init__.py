"""Iterative preference refresh (MADPO-Iter, MARLHF-Iter): rounds of pairs against a comparator policy, a replay of every round's pairs, and their step checkpoints."""
