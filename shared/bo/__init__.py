"""Bayesian optimisation, pure numerics: the GP and the strategies the modeler runs (no web, no database)."""
