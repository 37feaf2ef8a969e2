"""The actor layer: actors, endpoints, futures, ports and meshes (private)."""
