"""A deterministic, seeded explorer of the real engine (see docs/simulation.md)."""
