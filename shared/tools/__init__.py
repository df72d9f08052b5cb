"""The tools, built on the library and the services: the ``pobo`` command (``cli``), benchmarks (``bench``),
the demo (``demo``), the API reference generator (``apidocs``), ``reconcile`` and the federation agent
(``agent``). Nothing in the library (``shared.bo``, ``privacy``, ``federated``, ``protocol``, ``servicekit``)
imports from here."""
