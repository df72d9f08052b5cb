"""Use cases of the curator service, one module per resource. No HTTP types here; errors are
``curator_service.exceptions``.

Transactions: a use case receives the request's session and does not commit (the request scope commits or
rolls back, ``api/deps.py``), with two deliberate exceptions, both documented where they happen:

* ``releases.create_release`` runs three short transactions of its own: reserve the budget (committed, so
  that a concurrent release sees it), compute outside any transaction, then store the release row together
  with the ledger entry turning ``spent``.
* ``queries.create_query`` commits the pending query row *before* evaluating the outcome, so that a crash
  never loses the fact that a query was asked (and charged).

Randomness: every release and every noise draw uses a fresh generator seeded from OS entropy
(``shared.privacy.rng.os_entropy_rng``). No seed is accepted from the API; the projection matrix M and the
noise are never stored.
"""
