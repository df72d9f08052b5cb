"""The one bridge between the services: the wire schemas of the curator API and the curator client."""
