"""Mechanisms several policies share, none of them a policy: ordering by key with greedy fill
(`ordered`), Gavel's rounds (`rounds`) over time-share allocations (`allocation`), the LP
compile cache and solver plumbing (`lp`), and tenant admission in front of every policy
(`admission`)."""
