"""Pure privacy mechanisms and their accounting (no web or database code).

* ``gaussian``: the default release (Gaussian mechanism on the scaled rows, analytic calibration).
* ``po_gp_ucb``: Algorithm 1 of the PO-GP-UCB paper (kept for reproducing the paper; no formal guarantee
  when n > d + 1, see ``docs/privacy.md``).
* ``accounting``: composition of the ledger's charges (basic, and PLD through dp-accounting).
* ``audit``: the empirical privacy audit (distinguishers on neighbouring datasets).
"""
