"""The one bridge between the services: the wire schemas of the curator API and of the modeler's federations,
and the typed clients of both (``CuratorClient``, ``ModelerClient``, ``FederationClient``)."""
