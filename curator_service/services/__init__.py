"""Use cases of the curator service, one module per resource. No HTTP types here; errors are
``curator_service.exceptions``.

Transactions: a use case receives the request's session and does not commit (the request scope commits or
rolls back, ``api/deps.py``), with two deliberate exceptions, both documented where they happen:

* ``releases.create_release`` runs three short transactions of its own: reserve the budget (committed, so
  that a concurrent release sees it), compute outside any transaction, then store the release row together
  with the ledger entry turning ``spent``.
* ``queries.create_query`` commits a ``manual`` query (and a cached repeat) pending, before its answer
  exists, so that a crash never loses a question that will be answered later; a ``column`` query is
  inserted, charged, answered and linked into the chain in one transaction, committed before the answer is
  sent (a crash before that commit leaves nothing, and nothing was sent).

Randomness: every release and every noise draw uses a fresh generator seeded from OS entropy
(``shared.privacy.rng.os_entropy_rng``). No seed is accepted from the API; the projection matrix M and the
noise are never stored.
"""
